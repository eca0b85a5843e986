"""The OpenAI-compatible completions protocol the simulated engines speak.

What a request must carry (parsed and checked as vLLM and SGLang check them) and what it gets
back: one JSON body, or server-sent events as the tokens arrive. The engine-specific parts (error
envelope, context-length rule) are in ``hosts.simulator.dialects``.
"""

from __future__ import annotations

import json
import time

from hosts.simulator import text
from hosts.simulator.core import Request
from hosts.simulator.runner import EngineRunner, Stream


class ApiError(Exception):
    """A request the engine refuses: answered with ``status`` in the dialect's error envelope."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def int_field(data: dict, name: str, default=None, minimum: int = 0):
    """``data[name]`` as an integer >= ``minimum``, ``default`` when absent or null."""
    value = data.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(400, f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value


def check_temperature(data: dict) -> None:
    temperature = data.get("temperature", 1.0)
    if temperature is not None and (not isinstance(temperature, int | float) or temperature < 0):
        raise ApiError(400, f"temperature must be a number >= 0, got {temperature!r}.")


def prompt_ids(data: dict, chat: bool, vocab: int) -> list[int]:
    """The prompt's token ids: from ``messages`` (chat), or ``prompt`` as text or token ids."""
    if chat:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list.")
        return text.chat_prompt_ids(messages, vocab)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return [1, *text.tokenize(prompt, vocab)]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt)
    ):
        return list(prompt)
    raise ApiError(
        400,
        "prompt must be a string or a non-empty list of token ids "
        f"(0 <= id < {vocab}); batches of prompts are not supported.",
    )


def requested_max_tokens(data: dict, chat: bool) -> int | None:
    """The client's output limit: ``max_completion_tokens`` (chat, when given) or ``max_tokens``."""
    name = "max_completion_tokens" if chat and "max_completion_tokens" in data else "max_tokens"
    return int_field(data, name, None, 1)


def completion_body(req: Request, rid: str, key: int, model: str, chat: bool) -> dict:
    """The JSON answer to a finished request that was not streamed."""
    content = "".join(text.token_text(key, i) for i in range(req.num_output))
    usage = {
        "prompt_tokens": req.prompt_len,
        "total_tokens": req.prompt_len + req.num_output,
        "completion_tokens": req.num_output,
        "prompt_tokens_details": None,
    }
    if req.finish_reason == "abort":
        raise ApiError(
            500,
            "The request was aborted by the engine (it does not fit in the KV cache).",
            "InternalServerError",
        )
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content, "tool_calls": []},
            "logprobs": None,
            "finish_reason": req.finish_reason,
            "stop_reason": None,
        }
        kind = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": content,
            "logprobs": None,
            "finish_reason": req.finish_reason,
            "stop_reason": None,
        }
        kind = "text_completion"
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


async def sse_events(
    runner: EngineRunner,
    req: Request,
    rid: str,
    key: int,
    model: str,
    chat: bool,
    include_usage: bool,
):
    """The server-sent events of a streamed completion (or chat completion), as the engine's
    tokens arrive; the last one carries the finish reason, then usage when asked, then
    ``[DONE]``. A client that goes away aborts the request."""
    created = int(time.time())
    if chat:
        head = (
            f'{{"id":"{rid}","object":"chat.completion.chunk","created":{created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":0,"delta":'
        )
        yield (
            f'data: {head}{{"role":"assistant","content":""}},"logprobs":null,'
            '"finish_reason":null}]}\n\n'
        )
    else:
        head = (
            f'{{"id":"{rid}","object":"text_completion","created":{created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":0,"text":'
        )
    sink: Stream = req.sink
    sent = 0
    try:
        while True:
            await sink.wait(sent)
            upto, done = sink.delivered, sink.done
            parts = []
            for pos in range(sent, upto):
                piece = json.dumps(text.token_text(key, pos))
                last = done and pos == upto - 1
                reason = f'"{req.finish_reason}"' if last else "null"
                if chat:
                    parts.append(
                        f'data: {head}{{"content":{piece}}},"logprobs":null,'
                        f'"finish_reason":{reason}}}]}}\n\n'
                    )
                else:
                    parts.append(
                        f'data: {head}{piece},"logprobs":null,"finish_reason":{reason},'
                        '"stop_reason":null}],"usage":null}\n\n'
                    )
            sent = upto
            if parts:
                yield "".join(parts)
            if done:
                break
        if include_usage:
            yield _usage_event(req, rid, created, model, chat)
        yield "data: [DONE]\n\n"
    finally:
        runner.abort(req)


def _usage_event(req: Request, rid: str, created: int, model: str, chat: bool) -> str:
    """The closing event with the token counts (``stream_options.include_usage``)."""
    usage = {
        "prompt_tokens": req.prompt_len,
        "total_tokens": req.prompt_len + req.num_output,
        "completion_tokens": req.num_output,
    }
    body = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    }
    return "data: " + json.dumps(body, separators=(",", ":")) + "\n\n"
