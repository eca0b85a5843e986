"""A fixed-latency OpenAI-compatible streaming server: the ruler the load generator is
checked against. It sends the first token ``--ttft-ms`` after a request has arrived and one
token every ``--itl-ms`` after that, on absolute deadlines, so anything a client measures above
those numbers is the client's own error. Modes make it misbehave on purpose for tests.

"Arrived" is the kernel's receive stamp of the request (``SO_TIMESTAMPNS``, as the load
generator's transport uses), not the moment this server's event loop got to it: otherwise a
busy server loop would shorten the TTFT it reports and that lateness would be blamed on the
client. ``/stats`` gives, per ``X-Request-Id``, the TTFT the server actually produced, and
with ``--record-tokens`` when each token was written: the ``CLOCK`` time (CLOCK_MONOTONIC,
the same in every process of the machine) before and after the write that carried it, so
a test can check a client's stamps against the moment the bytes left instead of against the
nominal delays, which a busy machine does not keep. ``--exit-after N`` makes the process exit
as the request after the Nth arrives (a server going away mid-run, at a known point).

    python -m benchmarks.loadgen.testserver --port 9000 --ttft-ms 50 --itl-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys

from benchmarks.loadgen.transport import (
    CLOCK,
    enable_rx_stamps,
    new_event_loop_factory,
    recv_stamped,
)

MODES = ("ok", "no_usage", "malformed", "no_done", "error_500", "hang", "close", "json")
MAX_HEAD = 64 * 1024


async def sleep_until(deadline: float) -> None:
    """Return no earlier than ``deadline`` (``CLOCK`` time). One ``asyncio.sleep`` is not
    enough under uvloop: libuv rounds timers to whole milliseconds of a loop time cached at the
    start of the iteration, so a sleep can end a millisecond or more early (more when the
    process was descheduled), and a token sent early makes a client's TTFT look shorter than
    the server's delay. Sleeping again for what is left keeps the ruler exact."""
    while (left := deadline - CLOCK()) > 0:
        await asyncio.sleep(left)


class _Connection:
    """One client connection on a non-blocking socket: requests in, bytes out (buffered only
    when the socket is full)."""

    def __init__(self, server: FixedLatencyServer, sock: socket.socket, loop):
        self.server, self.sock, self.loop = server, sock, loop
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_rx_stamps(sock)
        self.inbox = bytearray()
        self.arrived = 0.0
        self.outbox = bytearray()
        self.busy = False
        self.closed = False
        self.drained: asyncio.Future | None = None
        self.buffer = memoryview(bytearray(65536))
        loop.add_reader(sock.fileno(), self.on_readable)

    def on_readable(self) -> None:
        while not self.closed:
            try:
                size, stamp = recv_stamped(self.sock, [self.buffer])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                return
            if not size:
                self.close()
                return
            self.inbox += self.buffer[:size]
            self.arrived = stamp
        self.next_request()

    def next_request(self) -> None:
        """Start handling the next complete request (one at a time, as HTTP/1.1 without
        pipelining asks)."""
        if self.busy or self.closed:
            return
        end = self.inbox.find(b"\r\n\r\n")
        if end < 0:
            if len(self.inbox) > MAX_HEAD:
                self.close()
            return
        lines = self.inbox[:end].decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(":") for line in lines[1:] if line)
        }
        length = int(headers.get("content-length") or 0)
        if len(self.inbox) < end + 4 + length:
            return
        body = bytes(self.inbox[end + 4 : end + 4 + length])
        del self.inbox[: end + 4 + length]
        try:
            method, path, _ = lines[0].split(" ", 2)
        except ValueError:
            self.close()
            return
        self.busy = True
        self.loop.create_task(self.run(method, path, headers, body, self.arrived))

    async def run(self, method, path, headers, body, arrived) -> None:
        try:
            keep = await self.server.route(self, method, path, headers, body, arrived)
        except Exception:  # noqa: BLE001 - a test server answers the next request anyway
            keep = False
        if not keep or headers.get("connection", "").lower() == "close":
            await self.drain()
            self.close()
            return
        self.busy = False
        self.next_request()

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.outbox:
            self.outbox += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.close()
            return
        if sent < len(data):
            self.outbox += data[sent:]
            self.loop.add_writer(self.sock.fileno(), self.on_writable)

    def on_writable(self) -> None:
        try:
            sent = self.sock.send(self.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        del self.outbox[:sent]
        if not self.outbox:
            self.loop.remove_writer(self.sock.fileno())
            self._wake()

    async def drain(self) -> None:
        while self.outbox and not self.closed:
            self.drained = self.loop.create_future()
            await self.drained

    def _wake(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.sock.fileno())
        if self.outbox:
            self.loop.remove_writer(self.sock.fileno())
        self.sock.close()
        self._wake()


class FixedLatencyServer:
    def __init__(
        self,
        ttft_ms: float,
        itl_ms: float,
        mode: str = "ok",
        error_every: int = 0,
        model: str = "fixed-latency",
        record_tokens: bool = False,
        exit_after: int = 0,
    ):
        self.ttft = ttft_ms / 1000
        self.itl = itl_ms / 1000
        self.mode = mode
        self.error_every = error_every
        self.model = model
        self.requests = 0
        self._framed: dict = {}
        self.lateness: list[float] = []
        self.actual_ttft: dict[str, float] = {}  # request id → first token sent - arrival
        # request id → {"arrived": s, "sends": [[before, after], ...]}, one pair per token
        self.token_times: dict[str, dict] | None = {} if record_tokens else None
        self.exit_after = exit_after

    async def route(self, conn, method, path, headers, body, arrived) -> bool:
        if method == "GET" and path == "/health":
            return self.reply(conn, 200, b"")
        if method == "GET" and path == "/stats":
            late = sorted(self.lateness)
            pick = (
                (lambda q: late[min(len(late) - 1, int(q * len(late)))] * 1000)
                if late
                else (lambda q: None)
            )
            data = {
                "requests": self.requests,
                "first_token_late_p50_ms": pick(0.5),
                "first_token_late_p99_ms": pick(0.99),
                "actual_ttft_s": self.actual_ttft,
                "token_times": self.token_times,
            }
            return self.reply(conn, 200, json.dumps(data).encode(), "application/json")
        if method == "GET" and path == "/v1/models":
            data = json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]})
            return self.reply(conn, 200, data.encode(), "application/json")
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self.requests += 1
            if self.exit_after and self.requests > self.exit_after:
                os._exit(0)  # no clean-up, no goodbye: connections just break
            if self.mode == "error_500" or (
                self.error_every and self.requests % self.error_every == 0
            ):
                return self.reply(
                    conn, 500, b'{"error": {"message": "injected"}}', "application/json"
                )
            if self.mode == "hang":
                await asyncio.sleep(3600)
                return False
            request = json.loads(body or b"{}")
            chat = path.endswith("chat/completions")
            return await self.stream(conn, request, chat, arrived, headers.get("x-request-id"))
        return self.reply(conn, 404, b"not found")

    def _chunks(self, kind: str, chat: bool) -> tuple[bytes, bytes]:
        """The two SSE chunks every stream sends, framed once (chunked encoding included):
        the server must stay far below its budget so that its lateness is not measured."""
        key = (kind, chat)
        if key not in self._framed:
            framed = []
            for reason in (None, "length"):
                choice = (
                    {"index": 0, "delta": {"content": " tok"}}
                    if chat
                    else {"index": 0, "text": " tok"}
                )
                choice["finish_reason"] = reason
                event = (
                    b"data: "
                    + json.dumps(  # compact, as vLLM's pydantic serialiser writes it
                        {
                            "id": "x",
                            "object": kind,
                            "model": self.model,
                            "choices": [choice],
                            "usage": None,
                        },
                        separators=(",", ":"),
                    ).encode()
                    + b"\n\n"
                )
                framed.append(b"%x\r\n%s\r\n" % (len(event), event))
            self._framed[key] = tuple(framed)
        return self._framed[key]

    @staticmethod
    def reply(conn: _Connection, status: int, body: bytes, kind: str = "text/plain") -> bool:
        conn.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: "
            f"{len(body)}\r\n\r\n".encode()
            + body
        )
        return True

    async def stream(self, conn, request: dict, chat: bool, arrived: float, request_id) -> bool:
        tokens = int(request.get("max_tokens") or 16)
        if self.mode == "json":
            return self.reply(conn, 200, b'{"choices": []}', "application/json")
        conn.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )

        def send(payload: bytes) -> None:
            conn.write(b"%x\r\n%s\r\n" % (len(payload), payload))

        kind = "chat.completion.chunk" if chat else "text_completion"
        chunk, last_chunk = self._chunks(kind, chat)
        sends = None
        if self.token_times is not None and request_id:
            sends = []
            self.token_times[request_id] = {"arrived": arrived, "sends": sends}
        for k in range(tokens):
            await sleep_until(arrived + self.ttft + k * self.itl)
            if conn.closed:
                return False
            if self.mode == "malformed" and k == 1:
                send(b"data: {this is not json\n\n")
                break
            before = CLOCK()
            conn.write(last_chunk if k == tokens - 1 else chunk)
            if sends is not None:
                sends.append((before, CLOCK()))
            if k == 0:
                # How late the server itself sent the first token: not the client's error.
                now = CLOCK()
                self.lateness.append(now - (arrived + self.ttft))
                if request_id:
                    self.actual_ttft[request_id] = now - arrived
            if self.mode == "close" and k == 1:
                conn.close()
                return False
        if self.mode not in ("no_usage", "malformed"):
            usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
            send(
                b"data: "
                + json.dumps({"id": "x", "object": kind, "choices": [], "usage": usage}).encode()
                + b"\n\n"
            )
        if self.mode != "no_done":
            send(b"data: [DONE]\n\n")
        conn.write(b"0\r\n\r\n")
        await conn.drain()
        return True


async def serve(port: int, server: FixedLatencyServer) -> None:
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(2048)
    listener.setblocking(False)

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            _Connection(server, sock, loop)

    loop.add_reader(listener.fileno(), accept)
    print(f"listening on 127.0.0.1:{listener.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--error-every", type=int, default=0)
    parser.add_argument("--model", default="fixed-latency")
    parser.add_argument("--record-tokens", action="store_true", help="/stats: token send times")
    parser.add_argument("--exit-after", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    server = FixedLatencyServer(
        args.ttft_ms,
        args.itl_ms,
        args.mode,
        args.error_every,
        args.model,
        record_tokens=args.record_tokens,
        exit_after=args.exit_after,
    )

    try:
        with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
            runner.run(serve(args.port, server))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
