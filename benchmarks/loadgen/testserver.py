"""A fixed-latency OpenAI-compatible streaming server: the ruler the load generator is
checked against. It sends the first token ``--ttft-ms`` after a request has arrived and one
token every ``--itl-ms`` after that, on absolute deadlines, so anything a client measures above
those numbers is the client's own error. Modes make it misbehave on purpose for tests.

    python -m benchmarks.loadgen.testserver --port 9000 --ttft-ms 50 --itl-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

MODES = ("ok", "no_usage", "malformed", "no_done", "error_500", "hang", "close", "json")


class FixedLatencyServer:
    def __init__(
        self,
        ttft_ms: float,
        itl_ms: float,
        mode: str = "ok",
        error_every: int = 0,
        model: str = "fixed-latency",
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
        self.request_id: str | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = asyncio.get_running_loop().time()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                length = int(headers.get("content-length", 0))
                body = await reader.readexactly(length) if length else b""
                self.request_id = headers.get("x-request-id")
                if not await self.route(method, path, body, writer, arrived):
                    break
                if headers.get("connection", "").lower() == "close":
                    await writer.drain()
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def route(self, method, path, body, writer, arrived) -> bool:
        if method == "GET" and path == "/health":
            return self.reply(writer, 200, b"")
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
            }
            return self.reply(writer, 200, json.dumps(data).encode(), "application/json")
        if method == "GET" and path == "/v1/models":
            data = json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]})
            return self.reply(writer, 200, data.encode(), "application/json")
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self.requests += 1
            if self.mode == "error_500" or (
                self.error_every and self.requests % self.error_every == 0
            ):
                return self.reply(
                    writer, 500, b'{"error": {"message": "injected"}}', "application/json"
                )
            if self.mode == "hang":
                await asyncio.sleep(3600)
                return False
            request = json.loads(body or b"{}")
            return await self.stream(writer, request, path.endswith("chat/completions"), arrived)
        return self.reply(writer, 404, b"not found")

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
    def reply(writer, status: int, body: bytes, kind: str = "text/plain") -> bool:
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: "
            f"{len(body)}\r\n\r\n".encode()
            + body
        )
        return True

    async def stream(self, writer, request: dict, chat: bool, arrived: float) -> bool:
        loop = asyncio.get_running_loop()
        request_id = self.request_id
        tokens = int(request.get("max_tokens") or 16)
        if self.mode == "json":
            return self.reply(writer, 200, b'{"choices": []}', "application/json")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )

        def send(payload: bytes) -> None:
            writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))

        kind = "chat.completion.chunk" if chat else "text_completion"
        chunk, last_chunk = self._chunks(kind, chat)
        for k in range(tokens):
            delay = arrived + self.ttft + k * self.itl - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.mode == "malformed" and k == 1:
                send(b"data: {this is not json\n\n")
                break
            writer.write(last_chunk if k == tokens - 1 else chunk)
            if k == 0:
                # How late the server itself sent the first token: not the client's error.
                now = loop.time()
                self.lateness.append(now - (arrived + self.ttft))
                if request_id:
                    self.actual_ttft[request_id] = now - arrived
            if self.mode == "close" and k == 1:
                writer.close()
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
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


async def serve(port: int, server: FixedLatencyServer) -> None:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", port, backlog=2048)
    print(f"listening on 127.0.0.1:{listener.sockets[0].getsockname()[1]}", flush=True)
    async with listener:
        await listener.serve_forever()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--error-every", type=int, default=0)
    parser.add_argument("--model", default="fixed-latency")
    args = parser.parse_args(argv)
    server = FixedLatencyServer(args.ttft_ms, args.itl_ms, args.mode, args.error_every, args.model)
    try:
        asyncio.run(serve(args.port, server))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
