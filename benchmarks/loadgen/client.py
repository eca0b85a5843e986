"""One streaming request, timed where the bytes arrive.

Timestamps are on the ``time.perf_counter()`` clock and belong to the bytes, not to the moment
this code sees them: the transport stamps each read with the kernel's receive time (see
transport.py), so JSON parsing, a busy event loop or a GC pause never land in TTFT or ITL. SSE
events are split on blank lines as bytes; a read holding several events gives them the same
arrival time (they did arrive together). Over HTTPS the stamp is taken as the read is seen.
"""

from __future__ import annotations

import json
import math
import re

import httpx

from benchmarks.loadgen.dataset import Prompt
from benchmarks.loadgen.stats import RequestRecord
from benchmarks.loadgen.transport import CLOCK, FastTransport

TEXT_FIELD = re.compile(rb'"(?:text|content)":\s*"(?!")')  # a non-empty text or content
USAGE_OBJECT = re.compile(rb'"usage":\s*\{')


class MalformedStream(Exception):
    """The server's answer is not the SSE stream an OpenAI-compatible server sends."""


class UnreadableStream(MalformedStream):
    """Bytes the client could not make sense of (an event that is not JSON, spliced with
    another): what a client reading two streams into one buffer produces, as well as a broken
    server. Counted as ``client_error``, never as what the engine answered."""


# Failures the load generator itself can cause: a mangled read (its transport, a starved or
# racing client), its own connection pool or write timing out. Their own error class, so a run
# never reports them as the engine's answer; ``benchmarks.evidence`` refuses runs that have any.
CLIENT_ERROR = "client_error"


def server_closed(exc: httpx.RemoteProtocolError) -> bool:
    """Whether a protocol error says the server ended the connection (its doing), rather than
    that the bytes read made no sense (possibly the client's)."""
    text = str(exc).lower()
    return "closed" in text or "disconnected" in text


def request_body(endpoint: str, model: str, prompt: Prompt, ignore_eos: bool) -> dict:
    body = {
        "model": model,
        "max_tokens": prompt.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = prompt.output_len
    if endpoint.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": prompt.payload}]
    else:
        body["prompt"] = prompt.payload
    return body


def _token_text(event: dict) -> str | None:
    """The text a chunk carries, or None for chunks without choices (usage, keep-alives)."""
    choices = event.get("choices")
    if not choices:
        return None
    choice = choices[0]
    if "delta" in choice:
        delta = choice["delta"] or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


async def send(
    client: httpx.AsyncClient,
    url: str,
    body: dict,
    record: RequestRecord,
    headers: dict,
    epoch: float,
) -> RequestRecord:
    """POST ``body`` and fill ``record`` (times relative to ``epoch``)."""
    record.sent = CLOCK() - epoch

    def sent_now():
        # The transport calls this as it writes the request: what came before (building the
        # request, waiting for the event loop) is client-side queueing, not server latency.
        record.sent = CLOCK() - epoch

    chunks = 0
    try:
        async with client.stream(
            "POST", url, json=body, headers=headers, extensions={"loadgen.sent": sent_now}
        ) as response:
            record.status = response.status_code
            if response.status_code >= 400:
                detail = (await response.aread())[:300].decode(errors="replace")
                record.error_class = f"http_{response.status_code // 100}xx"
                record.error = f"HTTP {response.status_code}: {detail}"
                return record
            if "text/event-stream" not in response.headers.get("content-type", ""):
                raise MalformedStream(
                    f"expected text/event-stream, got {response.headers.get('content-type')!r}"
                )
            buffer = b""
            done = False
            # The transport's own body stream, not aiter_raw(): its reads carry arrival stamps,
            # and there is one wrapper generator less per chunk.
            stream = response.extensions.get("loadgen.body")
            stamped = stream is not None
            if not stamped:
                stream = response.stream
            last = math.nan
            async for raw in stream:
                now = (stream.arrived if stamped else CLOCK()) - epoch
                last = now
                buffer += raw
                while True:
                    cut = buffer.find(b"\n\n")
                    if cut < 0:
                        break
                    event, buffer = buffer[:cut], buffer[cut + 2 :]
                    # One "data:" line per event is the norm: no list allocated for it (fewer
                    # GC-tracked objects per chunk means shorter, rarer GC pauses).
                    lines = (
                        (event,)
                        if b"\n" not in event and b"\r" not in event
                        else event.replace(b"\r", b"").split(b"\n")
                    )
                    for line in lines:
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            done = True
                            continue
                        if (
                            data.endswith(b"}")
                            and b'"error"' not in data
                            and TEXT_FIELD.search(data)
                            and not USAGE_OBJECT.search(data)
                        ):
                            # A plain token chunk: no need to parse the JSON just to learn
                            # that it carries text (half the client's CPU at 20k chunks/s).
                            # Anything else (usage, errors, empty deltas) is parsed.
                            text, message = True, None
                        else:
                            try:
                                message = json.loads(data)
                            except json.JSONDecodeError:
                                raise UnreadableStream(f"not JSON: {data[:80]!r}") from None
                            if "error" in message and not message.get("choices"):
                                raise MalformedStream(f"error in stream: {message['error']}")
                            text = _token_text(message)
                        if text:  # the role-only first chat chunk is not a token
                            chunks += 1
                            if record.first_token is None:
                                record.first_token = now
                            record.chunk_times.append(now)
                        usage = message.get("usage") if message else None
                        if usage:
                            record.output_tokens = usage.get("completion_tokens") or 0
                            record.prompt_tokens = usage.get("prompt_tokens")
                            record.token_source = "usage"
            # The end of the request is when its last bytes arrived.
            record.end = last if stamped and last == last else CLOCK() - epoch
            if not done:
                raise MalformedStream("the stream ended without data: [DONE]")
            if record.token_source != "usage":
                record.output_tokens = chunks
            if chunks == 0:
                raise MalformedStream("the stream carried no tokens")
    except UnreadableStream as exc:
        record.error_class, record.error = CLIENT_ERROR, str(exc)
    except MalformedStream as exc:
        record.error_class, record.error = "malformed_stream", str(exc)
    except (httpx.PoolTimeout, httpx.WriteTimeout) as exc:
        # The client's own queue (its pool) or its own sending timed out.
        record.error_class, record.error = CLIENT_ERROR, f"{type(exc).__name__}: {exc}"
    except httpx.RemoteProtocolError as exc:
        # Broken HTTP framing ("Invalid character in chunk size") is what a client reading
        # another request's bytes sees; a server that closed the connection is the server's.
        record.error_class = "connection" if server_closed(exc) else CLIENT_ERROR
        record.error = f"{type(exc).__name__}: {exc}"
    except httpx.TimeoutException as exc:
        record.error_class, record.error = "timeout", f"{type(exc).__name__}: {exc}"
    except (
        httpx.ConnectError,
        httpx.ReadError,
        httpx.WriteError,
    ) as exc:
        record.error_class, record.error = "connection", f"{type(exc).__name__}: {exc}"
    except httpx.HTTPError as exc:
        record.error_class, record.error = "http", f"{type(exc).__name__}: {exc}"
    finally:
        if record.end != record.end:  # NaN: ended by an error or a cancel
            record.end = CLOCK() - epoch
    return record


def make_client(
    timeout: float, api_key: str | None, transport: FastTransport | None = None
) -> httpx.AsyncClient:
    """The run's one client: httpx's API over the fast transport (see transport.py)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        transport=transport or FastTransport(),
        headers=headers,
        timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
    )
