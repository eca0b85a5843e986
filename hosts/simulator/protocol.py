"""The OpenAI-compatible completions protocol the simulated engines speak.

What a request must carry (parsed and checked as vLLM and SGLang check them: ``sampling``), how
it becomes engine requests (one per prompt × ``n``, as both engines expand batches and parallel
sampling), and what it gets back: one JSON body, or server-sent events as the tokens arrive
(their JSON, per engine: ``wire_format``; their text: ``wire_text``). The engine-specific rules
(error envelope, context length, parameter checks) are in ``hosts.simulator.dialects``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import zlib
from dataclasses import dataclass

from hosts.simulator import text
from hosts.simulator.core import Request
from hosts.simulator.quality import AnswerText, request_text
from hosts.simulator.runner import EngineRunner, Stream, wait_done
from hosts.simulator.wire_errors import ApiError
from hosts.simulator.wire_format import WIRES
from hosts.simulator.wire_text import ChoiceText

__all__ = ["ApiError", "Choice", "prompt_ids", "prompt_list", "respond"]


@dataclass(eq=False, slots=True)
class Choice:
    """One choice of a response: one request of the engine."""

    index: int
    prompt_idx: int
    prompt_ids: list[int]
    req: Request
    text: ChoiceText
    rid: str  # SGLang names each choice's stream by its own request id
    chars: int = 0  # characters of text streamed so far


def prompt_ids(data: dict, chat: bool, vocab: int) -> list[int]:
    """The prompt's token ids: from ``messages`` (chat), or ``prompt`` as text or token ids."""
    if chat:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list.")
        return text.chat_prompt_ids(messages, vocab)
    prompts = prompt_list(data.get("prompt"), vocab)
    if len(prompts) != 1:
        raise ApiError(400, "prompt must be one string or one list of token ids.")
    return prompts[0]


def prompt_list(prompt, vocab: int) -> list[list[int]]:
    """A completion request's prompts as token ids: a string, a list of token ids, or a batch
    (a list of either), as vLLM and SGLang accept them."""
    if isinstance(prompt, str):
        return [[1, *text.tokenize(prompt, vocab)]]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [_token_ids(prompt, vocab)]
        if all(isinstance(p, str) for p in prompt):
            return [[1, *text.tokenize(p, vocab)] for p in prompt]
        if all(isinstance(p, list) and p for p in prompt):
            if all(isinstance(t, int) and not isinstance(t, bool) for p in prompt for t in p):
                return [_token_ids(p, vocab) for p in prompt]
    raise ApiError(
        400,
        "prompt must be a string, a list of token ids, or a non-empty list of either "
        f"(0 <= id < {vocab}).",
    )


def _token_ids(ids: list[int], vocab: int) -> list[int]:
    for t in ids:
        if not 0 <= t < vocab:
            # vLLM's Processor._validate_model_input words it so.
            raise ApiError(400, f"Token id {t} is out of vocabulary")
    return list(ids)


async def respond(runner: EngineRunner, dialect, data: dict, chat: bool, request_id: str):
    """Check the request as the engine would, queue one engine request per prompt and choice,
    and answer: (status, JSON body) or an async iterator of server-sent events."""
    params = dialect.parse(data, chat)
    model = dialect.response_model(data)
    vocab = runner.cfg.model.vocab
    if chat:
        prompts = [prompt_ids(data, True, vocab)]
    else:
        dialect.check_prompt(data)
        prompts = prompt_list(data.get("prompt"), vocab)
    requested = dialect.requested_max_tokens(data, params, chat)
    try:
        limits = [dialect.max_tokens(len(ids), requested) for ids in prompts]
        for limit in limits:
            dialect.verify(data, params, limit)
    except ApiError as error:
        if error.engine and params.stream:
            return _error_stream(dialect, error)
        raise
    if params.priority and runner.cfg.scheduling_policy != "priority":
        raise ApiError(
            400, f"Got priority {params.priority} but Priority scheduling is not enabled."
        )
    answers = _answers(runner, data, chat, params, len(prompts))
    choices = _submit(runner, dialect, params, prompts, limits, answers)
    created = int(time.time())
    wire = WIRES[runner.cfg.engine](chat, request_id, created, model, params)
    if params.stream:
        return _events(runner, wire, choices)
    try:
        await asyncio.gather(*(wait_done(c.req) for c in choices))
    finally:
        for c in choices:
            runner.abort(c.req)
    if any(c.req.finish_reason == "abort" for c in choices):
        raise ApiError(
            500,
            "The request was aborted by the engine (it does not fit in the KV cache).",
            "InternalServerError",
        )
    return wire.body(choices)


def _answers(runner, data: dict, chat: bool, params, count: int) -> list[list[str] | None]:
    """Per prompt, the pieces of the answer the simulated model knows (None: unknown)."""
    quality = runner.quality
    if quality is None or not quality.items:
        return [None] * count
    texts = request_text(data, chat)
    return [
        quality.answer_pieces(texts[i] if i < len(texts) else None, params.structured)
        for i in range(count)
    ]


def _submit(runner, dialect, params, prompts, limits, answers) -> list[Choice]:
    """One engine request per prompt × ``n`` (choice index = prompt × n + sample, as both
    engines number them), each with the client's ``n``. A prompt the model knows gets its
    answer, every choice the same one (sampling does not change what the model knows)."""
    choices = []
    batch = uuid.uuid4().hex
    for prompt_idx, (ids, limit, pieces) in enumerate(zip(prompts, limits, answers, strict=True)):
        # vLLM fans each prompt out to n children of one parent request: the parent's
        # histograms (request_params_n, max generation) observe once per prompt, not n times.
        parent = f"{batch}-{prompt_idx}" if params.n > 1 else None
        for _ in range(params.n):
            req = runner.submit(
                ids,
                max(limit, 1),
                ignore_eos=params.ignore_eos,
                min_tokens=min(params.min_tokens, limit),
                priority=params.priority,
                natural=None if pieces is None else len(pieces),
            )
            req.params_n = params.n
            req.parent_id = parent
            req.stream = params.stream
            key = zlib.crc32(f"{runner.seed}:{req.id}".encode())
            stops = (params.stop, params.include_stop_str, params.min_tokens, dialect.holds_stop)
            out = ChoiceText(key, *stops) if pieces is None else AnswerText(pieces, key, *stops)
            # The engine steps the request only once this handler yields: a stop string that
            # ends the text early ends the request there, as the engine's detokenizer would.
            req.output_target = out.plan(req.output_target)
            choices.append(Choice(len(choices), prompt_idx, ids, req, out, uuid.uuid4().hex))
    return choices


async def _events(runner: EngineRunner, wire, choices: list[Choice]):
    """The server-sent events of a streamed response, as the engine's tokens arrive: nothing
    before the first token (the engines send even the chat role chunk with it), then each
    token's chunk, the closing chunks, ``[DONE]``. A client that goes away aborts them all."""
    try:
        pending = list(choices)
        while pending:
            await _wait_any(pending)
            parts = []
            for c in pending:
                sink: Stream = c.req.sink
                upto, done = sink.delivered, sink.done
                start = c.text.sent_tokens
                if upto > start or done:
                    texts = c.text.deltas(upto, done)
                    parts.append(wire.events(c, start, texts, done, choices))
            pending = [c for c in pending if not c.req.sink.done]
            if parts:
                yield "".join(parts)
        closing = wire.closing(choices)
        if closing:
            yield closing
        yield "data: [DONE]\n\n"
    finally:
        for c in choices:
            runner.abort(c.req)


async def _wait_any(pending: list[Choice]) -> None:
    """Until one of the choices has news (one stream: just wait on it)."""
    for c in pending:
        sink = c.req.sink
        if sink.delivered > c.text.sent_tokens or sink.done:
            return
    if len(pending) == 1:
        await pending[0].req.sink.wait(pending[0].text.sent_tokens)
        return
    waits = [asyncio.ensure_future(c.req.sink.wait(c.text.sent_tokens)) for c in pending]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def _error_stream(dialect, error: ApiError):
    """SGLang's answer to an engine-side refusal of a streamed request: a 200 whose stream
    carries the error (``create_streaming_error_response``), then ``[DONE]``."""
    yield f"data: {dialect.stream_error(error)}\n\n"
    yield "data: [DONE]\n\n"
