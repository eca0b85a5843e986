"""A minimal streaming client for the simulator's own checks (benchmark, agreement test).

Raw asyncio HTTP/1.1 over one connection per stream, so that a thousand concurrent streams cost
the client little and the measurement is about the server. The panel's real load generator is
``benchmarks/loadgen``; this is only what the simulator needs to measure itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    ok: bool
    ttft: float | None = None
    token_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    error: str = ""

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]


async def stream_completion(host: str, port: int, body: dict) -> StreamResult:
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return StreamResult(False, error=str(exc))
    writer.write(
        (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            f"{payload}"
        ).encode()
    )
    result = StreamResult(True)
    buffer = b""
    try:
        status = await reader.readline()
        if b" 200 " not in status:
            result.ok = False
            result.error = status.decode().strip()
        while await reader.readline() not in (b"\r\n", b""):
            pass
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            now = time.perf_counter()
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = event.split(b"data: ", 1)[-1]
                if data.startswith(b"[DONE]"):
                    continue
                if not data.startswith(b"{"):
                    continue  # chunked-encoding size lines
                message = json.loads(data)
                if message.get("choices"):
                    if result.ttft is None:
                        result.ttft = now - start
                    result.token_times.append(now)
                elif message.get("usage"):
                    result.completion_tokens = message["usage"]["completion_tokens"]
    finally:
        writer.close()
    return result
