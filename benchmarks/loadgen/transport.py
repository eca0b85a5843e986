"""A fast HTTP/1.1 transport for httpx that stamps every read with its arrival time.

httpx (through httpcore and the pure-Python h11) spends ~100 µs of CPU per streamed chunk and
scans its whole connection pool for every request (encode/httpx #3215). At hundreds of streams
and tens of thousands of SSE chunks a second that client time is charged to the server as TTFT
and ITL. This transport keeps httpx's API — the load generator still calls
``client.stream(...)`` and iterates the response stream — but moves the bytes itself: a
keep-alive pool per origin, TCP_NODELAY, and the C parser uvicorn uses (httptools).

Where the bytes arrive: each connection is a non-blocking socket read from the event loop's
readiness callback with ``recvmsg``. On Linux the socket asks the kernel for receive timestamps
(``SO_TIMESTAMPNS``), so a read carries the moment its last packet reached this machine, not
the moment Python got round to it: a GC pause, a busy event loop or a descheduled vCPU in the
client no longer lands in TTFT or ITL. The limit: TCP merges bytes that queue up unread into
one buffer stamped with the newest arrival, so a stall longer than the gap between two chunks
of the same stream gives the older chunk the newer one's time (still no later than the read;
reading the framing chunk by chunk does not help, the merge happens in the kernel). Where the
kernel gives no stamp (other systems), the stamp is taken in the readiness callback, before
anything is parsed. The body stream, in the
response's ``loadgen.body`` extension, exposes the stamp of the bytes it last yielded as
``arrived`` (``time.perf_counter()`` clock).

HTTPS goes to httpx's own transport (its reads are stamped when the consumer sees them).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
import time
from collections import defaultdict

import httptools
import httpx

from hosts.transport.tls import system_trust

CLOCK = time.perf_counter
# Linux's value; Python only names it on some builds.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
READ_SIZE = 256 * 1024  # long-context answers must not be read in small pieces (vLLM #39963)


class ReadBuffer:
    """The preallocated buffer one connection pool reads into. Its connections share it:
    they run on the pool's one event loop, and each read is parsed (and what it keeps copied
    out) before the next read starts. Never shared between pools: two runs in two threads,
    each with its own loop, would write into each other's bytes mid-parse."""

    __slots__ = ("view", "buffers")

    def __init__(self):
        self.view = memoryview(bytearray(READ_SIZE))
        self.buffers = [self.view]


def enable_rx_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what this socket receives; False where it can't."""
    if not _ANCILLARY:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def recv_stamped(sock: socket.socket, buffers: list) -> tuple[int, float]:
    """Read into ``buffers``; return the size and when those bytes reached this machine, on
    the ``CLOCK`` clock (the kernel's stamp of the last packet read, or now without one).
    Raises BlockingIOError when there is nothing to read."""
    size, ancillary, _, _ = sock.recvmsg_into(buffers, _ANCILLARY)
    now = CLOCK()
    if not ancillary:
        return size, now
    # CLOCK_REALTIME from the kernel, moved onto the monotonic clock; never later than now.
    seconds, nanos = _TIMESPEC.unpack_from(ancillary[0][2])
    return size, min(now, seconds + nanos * 1e-9 - _wall_offset())


def _wall_offset() -> float:
    """``time.time() - CLOCK()`` at one instant, erring towards the smaller value (so that a
    converted stamp errs late, never before the bytes arrived). The two clocks cannot be read
    at once: a thread preempted between two reads (milliseconds on a busy machine) would move
    the stamp that much earlier, and a TTFT would come out shorter than the server's delay.
    The wall reading is bracketed by two ``CLOCK`` reads, retaken while the bracket is wide."""
    best = None
    for _ in range(3):
        before = CLOCK()
        wall = time.time()
        after = CLOCK()
        if best is None or after - before < best[0]:
            best = (after - before, wall - after)
        if after - before < 20e-6:
            break
    return best[1]


class _Connection:
    """One keep-alive connection: socket, parser state, and what arrived since the consumer
    last looked (parallel lists of arrival stamps and body bytes: floats and bytes are not
    tracked by the GC, tuples would be)."""

    __slots__ = (
        "sock",
        "loop",
        "read_buffer",
        "parser",
        "kernel_stamps",
        "headers",
        "stamps",
        "data",
        "headers_done",
        "complete",
        "keep_alive",
        "eof",
        "error",
        "waiter",
        "reading",
        "last_read",
        "last_stamp",
        "timeout",
        "closed",
    )

    def __init__(
        self, sock: socket.socket, loop: asyncio.AbstractEventLoop, read_buffer: ReadBuffer
    ):
        self.sock, self.loop, self.read_buffer = sock, loop, read_buffer
        self.kernel_stamps = enable_rx_stamps(sock)
        self.timeout: float | None = None
        self.last_read = time.monotonic()
        self.eof = False
        self.closed = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future | None = None
        self.reading = False
        self.reset()

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.stamps: list[float] = []
        self.data: list[bytes] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = True
        self.last_stamp = 0.0

    # httptools callbacks, called from feed_data inside the readiness callback
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.stamps.append(self.last_stamp)
        self.data.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # reading
    def start_reading(self) -> None:
        if not self.reading and not self.closed:
            self.reading = True
            self.loop.add_reader(self.sock.fileno(), self._on_readable)

    def stop_reading(self) -> None:
        if self.reading:
            self.reading = False
            if not self.closed:
                self.loop.remove_reader(self.sock.fileno())

    def _on_readable(self) -> None:
        sock, read_buffer = self.sock, self.read_buffer
        while True:
            try:
                # Into one preallocated buffer: a fresh 256 KiB bytes per read would be an
                # mmap/munmap pair per chunk.
                size, stamp = recv_stamped(sock, read_buffer.buffers)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._fail(httpx.ReadError(str(exc)))
                return
            # Never before what this connection already saw (a step of the wall clock between
            # two readings must not reorder events).
            self.last_stamp = max(stamp, self.last_stamp)
            self.last_read = time.monotonic()
            if not size:
                self.eof = True
                self.stop_reading()
                break
            try:
                self.parser.feed_data(read_buffer.view[:size])  # on_body copies out what it keeps
            except httptools.HttpParserUpgrade:
                pass
            except httptools.HttpParserError as exc:
                self._fail(httpx.RemoteProtocolError(f"malformed HTTP response: {exc}"))
                return
            if size < READ_SIZE:
                break  # drained: no need for a recvmsg that would only say "would block"
        self._wake()

    def _fail(self, error: Exception) -> None:
        self.error = error
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until something arrived, the connection ended or failed."""
        if self.error is not None:
            raise self.error
        if self.eof:
            if not self.headers_done:
                raise httpx.RemoteProtocolError(
                    "the server closed the connection without a response"
                )
            raise httpx.RemoteProtocolError("the server closed the connection mid-response")
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None
        if self.error is not None:
            raise self.error

    def abort(self, error: Exception) -> None:
        """Called by the watchdog: the server stayed silent past the read timeout."""
        self._fail(error)

    def close(self) -> None:
        if not self.closed:
            self.stop_reading()
            self.closed = True
            self.sock.close()


class _Body(httpx.AsyncByteStream):
    """The response body as the bytes of each read, with ``arrived`` = that read's stamp."""

    def __init__(self, transport: FastTransport, key, conn: _Connection):
        self.transport, self.key, self.conn = transport, key, conn
        self.released = False
        self.arrived: float | None = None

    async def __aiter__(self):
        conn = self.conn
        while True:
            if conn.data:
                stamps, data = conn.stamps, conn.data
                conn.stamps, conn.data = [], []
                for stamp, piece in zip(stamps, data, strict=True):
                    self.arrived = stamp
                    yield piece
                continue
            if conn.complete:
                self._release(reuse=conn.keep_alive)
                return
            await conn.wait()

    def _release(self, reuse: bool) -> None:
        if self.released:
            return
        self.released = True
        conn = self.conn
        self.transport._active.discard(conn)
        if reuse and not conn.eof and conn.error is None:
            conn.reset()
            self.transport._idle[self.key].append(conn)
            # Keep watching while idle: the server may close the connection, and the next
            # request must then not be sent into a dead socket.
        else:
            conn.close()

    async def aclose(self) -> None:
        # Closed before the end (error, cancel, early stop): the connection is in an unknown
        # state, so it is not reused.
        self._release(reuse=self.conn.complete and self.conn.keep_alive)


class FastTransport(httpx.AsyncBaseTransport):
    """Plain-HTTP requests over pooled keep-alive connections; HTTPS falls back to httpx."""

    WATCHDOG_INTERVAL = 0.25

    def __init__(self, **https_kwargs):
        # Where this transport's stamps came from: "kernel" while every connection had
        # kernel receive stamps, "read" once one had not (HTTPS, other systems).
        self.stamp_source: str | None = None
        self._idle: dict[tuple, list[_Connection]] = defaultdict(list)
        self._active: set[_Connection] = set()
        self._watchdog: asyncio.Task | None = None
        # HTTPS goes through httpx, verified against the process's one context unless told.
        https_kwargs.setdefault("verify", system_trust())
        self._https = httpx.AsyncHTTPTransport(**https_kwargs)
        self._read_buffer = ReadBuffer()

    async def _watch(self) -> None:
        # One timer for all connections instead of a timeout object per read (that cost more
        # than the read itself at 20k chunks/s).
        while True:
            await asyncio.sleep(self.WATCHDOG_INTERVAL)
            now = time.monotonic()
            for conn in list(self._active):
                if conn.timeout is not None and now - conn.last_read > conn.timeout:
                    self._active.discard(conn)
                    conn.abort(httpx.ReadTimeout("timed out reading the response"))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            self.stamp_source = "read"
            return await self._https.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        host, port = request.url.host, request.url.port or 80
        key = (host, port)
        body = b"".join([part async for part in request.stream])
        head = [f"{request.method} {request.url.raw_path.decode()} HTTP/1.1\r\n".encode()]
        request.headers["Content-Length"] = str(len(body))
        for name, value in request.headers.raw:
            if name.lower() != b"transfer-encoding":
                head.append(name + b": " + value + b"\r\n")
        payload = b"".join(head) + b"\r\n" + body
        loop = asyncio.get_running_loop()
        if self._watchdog is None:
            self._watchdog = loop.create_task(self._watch())
        # A pooled connection may have been closed by the server while idle: retry once on a
        # fresh one if the reused one fails before any byte of the response came back.
        for attempt in range(2):
            conn = self._pooled(key) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(host, port, timeouts, loop)
            conn.timeout = timeouts.get("read")
            conn.last_read = time.monotonic()
            self._active.add(conn)
            try:
                on_sent = request.extensions.get("loadgen.sent")
                if on_sent is not None:
                    on_sent()  # the moment the bytes leave: the start of TTFT
                sent = conn.sock.send(payload)
                if sent < len(payload):  # a long prompt filled the socket buffer
                    await loop.sock_sendall(conn.sock, payload[sent:])
                conn.start_reading()
                while not conn.headers_done:
                    await conn.wait()
                break
            except (httpx.RemoteProtocolError, httpx.ReadError, ConnectionError) as exc:
                self._active.discard(conn)
                conn.close()
                if not reused:
                    if isinstance(exc, ConnectionError):
                        raise httpx.ReadError(str(exc)) from None
                    raise
            except BaseException:
                self._active.discard(conn)
                conn.close()
                raise
        body = _Body(self, key, conn)
        return httpx.Response(
            status_code=conn.parser.get_status_code(),
            headers=conn.headers,
            stream=body,
            # httpx wraps the stream it is given; this is the way back to the stamps.
            extensions={"http_version": b"HTTP/1.1", "loadgen.body": body},
        )

    def _pooled(self, key) -> _Connection | None:
        idle = self._idle[key]
        while idle:
            conn = idle.pop()
            if not (conn.eof or conn.closed or conn.error):
                return conn
            conn.close()
        return None

    async def _connect(self, host: str, port: int, timeouts: dict, loop) -> _Connection:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:  # a name: resolve it (in a thread); an IP needs no lookup
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise httpx.ConnectError(f"{host}:{port}: {exc.strerror or exc}") from None
        else:
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            infos = [(family, socket.SOCK_STREAM, 0, "", (host, port))]
        error: Exception | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, address), timeouts.get("connect"))
            except TimeoutError:
                sock.close()
                error = httpx.ConnectTimeout(f"timed out connecting to {host}:{port}")
                continue
            except OSError as exc:
                sock.close()
                error = httpx.ConnectError(f"{host}:{port}: {exc.strerror or exc}")
                continue
            except BaseException:
                sock.close()
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(sock, loop, self._read_buffer)
            if not conn.kernel_stamps:
                self.stamp_source = "read"
            elif self.stamp_source is None:
                self.stamp_source = "kernel"
            return conn
        raise error or httpx.ConnectError(f"{host}:{port}: no address")

    async def aclose(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        for conn in self._active:
            conn.close()
        self._active.clear()
        for connections in self._idle.values():
            for conn in connections:
                conn.close()
        self._idle.clear()
        await self._https.aclose()


def new_event_loop_factory():
    """uvloop's loop when it is installed (cheaper I/O callbacks keep the client's and the test
    server's own delay out of the numbers), else asyncio's default."""
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return None
