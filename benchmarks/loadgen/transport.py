"""A fast HTTP/1.1 transport for httpx: asyncio streams + httptools' C parser.

httpx (through httpcore and the pure-Python h11) spends ~100 µs of CPU per streamed chunk and
scans its whole connection pool for every request (encode/httpx #3215). At hundreds of streams
and tens of thousands of SSE chunks a second that client time is charged to the server as TTFT
and ITL. This transport keeps httpx's API — the load generator still calls
``client.stream(...)`` and ``aiter_raw()`` — but moves the bytes with a keep-alive pool per
origin, TCP_NODELAY, and the same C parser uvicorn uses. HTTPS goes to httpx's own transport.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import defaultdict

import httptools
import httpx


class _Connection:
    __slots__ = (
        "reader",
        "writer",
        "parser",
        "status",
        "headers",
        "body",
        "headers_done",
        "complete",
        "keep_alive",
        "last_read",
        "timeout",
        "timed_out",
    )

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.timeout: float | None = None
        self.timed_out = False
        self.last_read = time.monotonic()
        self.reset()

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()  # not GC-tracked, unlike a list of chunks
        self.headers_done = False
        self.complete = False
        self.keep_alive = True

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True

    async def feed(self) -> None:
        # No timeout object per read (it cost more than the read at 20k chunks/s): the
        # transport's watchdog aborts connections that stay silent past their timeout.
        try:
            data = await self.reader.read(65536)
        except OSError as exc:
            if self.timed_out:
                raise httpx.ReadTimeout("timed out reading the response") from None
            raise httpx.ReadError(str(exc)) from None
        if self.timed_out:
            raise httpx.ReadTimeout("timed out reading the response")
        self.last_read = time.monotonic()
        if not data:
            if self.headers_done and not self.complete:
                raise httpx.RemoteProtocolError("the server closed the connection mid-response")
            if not self.headers_done:
                raise httpx.RemoteProtocolError(
                    "the server closed the connection without a response"
                )
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"malformed HTTP response: {exc}") from None

    def close(self) -> None:
        self.writer.close()


class _Body(httpx.AsyncByteStream):
    def __init__(self, transport: FastTransport, key, conn: _Connection):
        self.transport, self.key, self.conn = transport, key, conn
        self.released = False

    async def __aiter__(self):
        conn = self.conn
        while True:
            if conn.body:
                data = bytes(conn.body)
                conn.body.clear()
                yield data
            if conn.complete:
                self._release(reuse=conn.keep_alive)
                return
            await conn.feed()
            if conn.reader.at_eof() and not conn.complete and not conn.body:
                raise httpx.RemoteProtocolError("the server closed the connection mid-response")

    def _release(self, reuse: bool) -> None:
        if self.released:
            return
        self.released = True
        self.transport._active.discard(self.conn)
        if reuse:
            self.conn.reset()
            self.transport._idle[self.key].append(self.conn)
        else:
            self.conn.close()

    async def aclose(self) -> None:
        # Closed before the end (error, cancel, early stop): the connection is in an unknown
        # state, so it is not reused.
        self._release(reuse=self.conn.complete and self.conn.keep_alive)


class FastTransport(httpx.AsyncBaseTransport):
    """Plain-HTTP requests over pooled keep-alive connections; HTTPS falls back to httpx."""

    WATCHDOG_INTERVAL = 0.25

    def __init__(self, **https_kwargs):
        self._idle: dict[tuple, list[_Connection]] = defaultdict(list)
        self._active: set[_Connection] = set()
        self._watchdog: asyncio.Task | None = None
        self._https = httpx.AsyncHTTPTransport(**https_kwargs)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.WATCHDOG_INTERVAL)
            now = time.monotonic()
            for conn in list(self._active):
                if conn.timeout is not None and now - conn.last_read > conn.timeout:
                    conn.timed_out = True
                    conn.writer.transport.abort()
                    self._active.discard(conn)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
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
        # A pooled connection may have been closed by the server while idle: retry once on a
        # fresh one if the reused one fails before any byte of the response came back.
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        for attempt in range(2):
            reused = bool(self._idle[key]) and attempt == 0
            conn = self._idle[key].pop() if reused else await self._connect(host, port, timeouts)
            conn.timeout = timeouts.get("read")
            conn.timed_out = False
            conn.last_read = time.monotonic()
            self._active.add(conn)
            try:
                on_sent = request.extensions.get("loadgen.sent")
                if on_sent is not None:
                    on_sent()  # the moment the bytes leave: the start of TTFT
                conn.writer.write(payload)
                while not conn.headers_done:
                    await conn.feed()
                break
            except (httpx.RemoteProtocolError, httpx.ReadError, ConnectionError):
                self._active.discard(conn)
                conn.close()
                if not reused:
                    raise
            except BaseException:
                self._active.discard(conn)
                conn.close()
                raise
        return httpx.Response(
            status_code=conn.parser.get_status_code(),
            headers=conn.headers,
            stream=_Body(self, key, conn),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def _connect(self, host: str, port: int, timeouts: dict) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=2**20), timeouts.get("connect")
            )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as exc:
            raise httpx.ConnectError(f"{host}:{port}: {exc.strerror or exc}") from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer)

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
