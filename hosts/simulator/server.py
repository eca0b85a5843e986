"""The simulated engine's HTTP API (Starlette on uvicorn), in real time.

An ``EngineRunner`` task steps the engine core on the event loop: it plans a step, sleeps until
the step would end on the simulated GPU, then hands each request its new token. HTTP handlers
speak vLLM's OpenAI-compatible API (or SGLang's) on top.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
import uuid
import zlib
from collections import deque

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from hosts.simulator import text
from hosts.simulator.config import SimConfig
from hosts.simulator.core import FINISHED, EngineCore, Request
from hosts.simulator.metrics import EngineMetrics
from hosts.simulator.telemetry import Telemetry

NATURAL_MEDIAN_TOKENS = 180  # typical answer length when a request may stop at "EOS"
DELIVERY_BATCH = 16  # streams woken per event-loop turn


class Stream:
    """The tokens of one request as they are delivered to its HTTP handler."""

    __slots__ = ("delivered", "done", "_waiter")

    def __init__(self):
        self.delivered = 0
        self.done = False
        self._waiter: asyncio.Future | None = None

    def push(self, count: int, done: bool) -> None:
        self.delivered = count
        self.done = done
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, seen: int) -> None:
        while self.delivered <= seen and not self.done:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter


class LoopLagMonitor:
    """Measures how late the event loop wakes a sleeper: the server's own responsiveness."""

    INTERVAL = 0.005

    def __init__(self, keep: int = 20000):
        self.samples: deque[float] = deque(maxlen=keep)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def _run(self) -> None:
        clock = time.perf_counter  # loop.time() may tick in whole milliseconds (uvloop)
        while True:
            expected = clock() + self.INTERVAL
            await asyncio.sleep(self.INTERVAL)
            self.samples.append(max(0.0, clock() - expected))

    def summary(self) -> dict:
        ordered = sorted(self.samples)
        if not ordered:
            return {"samples": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}

        def pct(p):
            return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000

        return {
            "samples": len(ordered),
            "p50_ms": pct(50),
            "p99_ms": pct(99),
            "max_ms": ordered[-1] * 1000,
        }


class EngineRunner:
    """Drives the engine core in real time (scaled by ``time_scale``; 0 = as fast as possible)."""

    def __init__(
        self,
        cfg: SimConfig,
        *,
        time_scale: float = 1.0,
        startup_seconds: float = 0.0,
        seed: int = 0,
        engine_version: str = "",
    ):
        self.cfg = cfg
        self.core = EngineCore(cfg)
        self.metrics = EngineMetrics(cfg)
        self.core.itl = self.metrics
        self.telemetry = Telemetry(cfg)
        self.time_scale = time_scale
        self.startup_seconds = startup_seconds
        self.engine_version = engine_version
        self.rng = random.Random(seed)
        self.seed = seed
        self.ready = False
        self.created = int(time.time())
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.loop_lag = LoopLagMonitor()
        self._t0 = 0.0
        self._virtual = 0.0
        self._ids = 0

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._t0 = loop.time()
        self._task = loop.create_task(self._run(), name="engine-core")
        self.loop_lag.start()
        if self.startup_seconds > 0:
            loop.call_later(self.startup_seconds * max(self.time_scale, 0), self._set_ready)
        else:
            self._set_ready()

    def _set_ready(self) -> None:
        self.ready = True

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def now(self) -> float:
        """Simulated seconds since start."""
        if self.time_scale <= 0:
            return self._virtual
        return (asyncio.get_running_loop().time() - self._t0) / self.time_scale

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        step = None
        while True:
            if step is None:
                if not core.has_work:
                    self._wake.clear()
                    await self._wake.wait()
                step = core.step(self.now())
                continue
            self._account(step)
            if self.time_scale > 0:
                delay = self._t0 + step.end * self.time_scale - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            else:
                self._virtual = step.end
            # Like a real engine, start the next step before streaming this one's tokens out,
            # so that the time spent writing to a thousand sockets does not stretch the step.
            following = core.step(self.now()) if core.has_work else None
            await self._deliver(step)
            step = following

    def _account(self, step) -> None:
        self.metrics.on_step(self.core, step)
        self.telemetry.record_step(
            step.duration * max(self.time_scale, 0), step.num_prefill_tokens, step.num_decode_tokens
        )

    async def _deliver(self, step) -> None:
        finished = {id(req) for req in step.finished}
        for i, req in enumerate(step.emitted, start=1):
            if req.sink is not None:
                req.sink.push(req.sink.delivered + 1, id(req) in finished)
            if i % DELIVERY_BATCH == 0:
                # Let the woken handlers write before waking more: with a thousand streams
                # one burst would hold the loop for tens of milliseconds.
                await asyncio.sleep(0)
        for req in step.finished:
            self.metrics.on_finished(req)
            if req.sink is not None and not req.sink.done:
                req.sink.push(req.sink.delivered, True)
        if self.time_scale <= 0:
            await asyncio.sleep(0)

    # --- requests ------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        ignore_eos: bool,
        min_tokens: int,
        priority: int = 0,
    ) -> Request:
        self._ids += 1
        if ignore_eos:
            target = max_tokens
        else:
            natural = int(self.rng.lognormvariate(math.log(NATURAL_MEDIAN_TOKENS), 0.6))
            target = min(max_tokens, max(min_tokens, natural, 1))
        req = Request(
            id=f"{self._ids}",
            prompt_len=len(prompt_ids),
            block_hashes=text.block_hashes(prompt_ids, self.cfg.block_size),
            max_tokens=max_tokens,
            output_target=target,
            arrival=self.now(),
            priority=priority,
        )
        req.sink = Stream()
        self.core.add(req)
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        if req.status != FINISHED:
            self.core.abort(req, self.now())


# --- HTTP -------------------------------------------------------------------------------------
class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def create_app(runner: EngineRunner) -> Starlette:
    cfg = runner.cfg
    vllm_mode = cfg.engine == "vllm"

    def error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
        body = {"message": message, "type": kind, "param": None, "code": status}
        # vLLM ≥ 0.10.1 wraps errors in {"error": …}; SGLang's OpenAI layer does not.
        payload = {"error": body} if vllm_mode else {"object": "error", **body}
        return JSONResponse(payload, status_code=status)

    def check_auth(request: HttpRequest) -> None:
        if cfg.api_key and request.headers.get("authorization") != f"Bearer {cfg.api_key}":
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def check_ready() -> None:
        if not runner.ready:
            raise ApiError(503, "The engine is starting.", "ServiceUnavailableError")

    async def body_of(request: HttpRequest) -> dict:
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(400, "The request body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        model = data.get("model")
        if model is not None and model not in (cfg.served_model_name, cfg.model_name):
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        return data

    def int_field(data: dict, name: str, default=None, minimum: int = 0):
        value = data.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ApiError(400, f"{name} must be an integer >= {minimum}, got {value!r}.")
        return value

    def length_checks(prompt_len: int, max_tokens: int | None) -> int:
        limit = cfg.max_model_len
        if vllm_mode:
            if prompt_len >= limit:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {limit} tokens. "
                    f"However, your request has {prompt_len} input tokens. Please "
                    "reduce the length of the input messages.",
                )
            if max_tokens is None:
                return limit - prompt_len
            if prompt_len + max_tokens > limit:
                raise ApiError(
                    400,
                    f"'max_tokens' or 'max_completion_tokens' is too large: "
                    f"{max_tokens}. This model's maximum context length is {limit} "
                    f"tokens and your request has {prompt_len} input tokens "
                    f"({max_tokens} > {limit} - {prompt_len}).",
                )
            return max_tokens
        if prompt_len >= limit:
            raise ApiError(
                400,
                f"The input ({prompt_len} tokens) is longer than the model's "
                f"context length ({limit} tokens).",
            )
        max_tokens = 128 if max_tokens is None else max_tokens
        if prompt_len + max_tokens >= limit:
            raise ApiError(
                400,
                "Requested token count exceeds the model's maximum context "
                f"length of {limit} tokens. You requested a total of "
                f"{prompt_len + max_tokens} tokens: {prompt_len} tokens from the input "
                f"messages and {max_tokens} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit "
                "within the limit.",
            )
        return max_tokens

    def prompt_ids_of(data: dict, chat: bool) -> list[int]:
        vocab = cfg.model.vocab
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
            and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt
            )
        ):
            return list(prompt)
        raise ApiError(
            400,
            "prompt must be a string or a non-empty list of token ids "
            f"(0 <= id < {vocab}); batches of prompts are not supported.",
        )

    async def generate(request: HttpRequest, chat: bool) -> Response:
        check_auth(request)
        check_ready()
        data = await body_of(request)
        if int_field(data, "n", 1, 1) != 1:
            raise ApiError(400, "The simulator supports n=1 only.")
        temperature = data.get("temperature", 1.0)
        if temperature is not None and (
            not isinstance(temperature, int | float) or temperature < 0
        ):
            raise ApiError(400, f"temperature must be a number >= 0, got {temperature!r}.")
        ids = prompt_ids_of(data, chat)
        requested = int_field(
            data,
            "max_completion_tokens" if chat and "max_completion_tokens" in data else "max_tokens",
            None,
            1,
        )
        max_tokens = length_checks(len(ids), requested)
        min_tokens = int_field(data, "min_tokens", 0)
        priority = int_field(data, "priority", 0, -(2**31))
        if priority and cfg.scheduling_policy != "priority":
            raise ApiError(400, f"Got priority {priority} but Priority scheduling is not enabled.")
        req = runner.submit(
            ids,
            max_tokens,
            ignore_eos=bool(data.get("ignore_eos")),
            min_tokens=min(min_tokens, max_tokens),
            priority=priority,
        )
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        key = zlib.crc32(f"{runner.seed}:{req.id}".encode())
        model = data.get("model") or cfg.served_model_name
        if data.get("stream"):
            options = data.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage", True)
            return StreamingResponse(
                _stream(runner, req, rid, key, model, chat, bool(usage)),
                media_type="text/event-stream",
            )
        try:
            await _wait_done(req)
        finally:
            runner.abort(req)
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
            body = {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        else:
            choice = {
                "index": 0,
                "text": content,
                "logprobs": None,
                "finish_reason": req.finish_reason,
                "stop_reason": None,
            }
            body = {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        return JSONResponse(body)

    async def completions(request: HttpRequest) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: HttpRequest) -> Response:
        return await generate(request, chat=True)

    async def health(request: HttpRequest) -> Response:
        return Response(status_code=200 if runner.ready else 503)

    async def models(request: HttpRequest) -> Response:
        check_auth(request)
        card = {
            "id": cfg.served_model_name,
            "object": "model",
            "created": runner.created,
            "owned_by": cfg.engine,
            "root": cfg.model_name,
            "parent": None,
            "max_model_len": cfg.max_model_len,
            "permission": [
                {
                    "id": "modelperm-" + uuid.uuid4().hex,
                    "object": "model_permission",
                    "created": runner.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def tokenize(request: HttpRequest) -> Response:
        data = await body_of(request)
        if "messages" in data:
            ids = prompt_ids_of(data, chat=True)
        else:
            ids = prompt_ids_of({"prompt": data.get("prompt")}, chat=False)
        return JSONResponse({"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids})

    async def detokenize(request: HttpRequest) -> Response:
        data = await body_of(request)
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise ApiError(400, "tokens must be a list of token ids.")
        return JSONResponse({"prompt": text.detokenize(tokens)})

    async def version(request: HttpRequest) -> Response:
        return JSONResponse({"version": runner.engine_version})

    async def metrics(request: HttpRequest) -> Response:
        if not cfg.metrics_enabled:
            return PlainTextResponse("Not Found", status_code=404)
        return Response(
            runner.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def health_generate(request: HttpRequest) -> Response:
        if not runner.ready:
            return Response(status_code=503)
        req = runner.submit([0], 1, ignore_eos=True, min_tokens=0)
        try:
            await asyncio.wait_for(_wait_done(req), timeout=20)
        except TimeoutError:
            return Response(status_code=503)
        finally:
            runner.abort(req)
        return Response(status_code=200)

    async def server_info(request: HttpRequest) -> Response:
        from hosts.engines import get_spec

        info = get_spec(cfg.engine).effective(cfg.settings)
        info.update(
            {
                "model_path": cfg.model_name,
                "max_total_num_tokens": cfg.kv_capacity_tokens,
                "max_running_requests": cfg.max_num_seqs,
                "chunked_prefill_size": cfg.token_budget if cfg.chunked_prefill else -1,
                "context_length": cfg.max_model_len,
                "tp_size": cfg.tp,
                "version": runner.engine_version,
                "internal_states": [
                    {
                        "last_gen_throughput": 0.0,
                        "num_running_reqs": len(runner.core.running),
                        "num_queue_reqs": len(runner.core.waiting),
                    }
                ],
            }
        )
        info.pop("api_key", None)
        return JSONResponse(info)

    async def model_info(request: HttpRequest) -> Response:
        return JSONResponse(
            {"model_path": cfg.model_name, "tokenizer_path": cfg.model_name, "is_generation": True}
        )

    async def flush_cache(request: HttpRequest) -> Response:
        if runner.core.has_work or not runner.core.kv.reset_prefix_cache():
            return PlainTextResponse(
                "Cache not flushed: there are running or waiting requests.\n", status_code=400
            )
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )

    async def gpus(request: HttpRequest) -> Response:
        return JSONResponse({"gpus": runner.telemetry.sample()})

    async def loop_lag(request: HttpRequest) -> Response:
        summary = runner.loop_lag.summary()
        if request.query_params.get("reset"):
            runner.loop_lag.samples.clear()
        return JSONResponse(summary)

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/version", version),
        Route("/metrics", metrics),
        Route("/simulator/gpus", gpus),
        Route("/simulator/loop-lag", loop_lag),
    ]
    if not vllm_mode:
        routes += [
            Route("/health_generate", health_generate),
            Route("/get_server_info", server_info),
            Route("/get_model_info", model_info),
            Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        ]

    async def api_error(request: HttpRequest, exc: ApiError) -> Response:
        return error(exc.status, exc.message, exc.kind)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await runner.start()
        yield
        await runner.stop()

    return Starlette(routes=routes, exception_handlers={ApiError: api_error}, lifespan=lifespan)


async def _wait_done(req: Request) -> None:
    sink: Stream = req.sink
    seen = -1
    while not sink.done:
        seen = sink.delivered
        await sink.wait(seen)


async def _stream(
    runner: EngineRunner,
    req: Request,
    rid: str,
    key: int,
    model: str,
    chat: bool,
    include_usage: bool,
):
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
            usage = {
                "prompt_tokens": req.prompt_len,
                "total_tokens": req.prompt_len + req.num_output,
                "completion_tokens": req.num_output,
            }
            kind = "chat.completion.chunk" if chat else "text_completion"
            yield (
                "data: "
                + json.dumps(
                    {
                        "id": rid,
                        "object": kind,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    },
                    separators=(",", ":"),
                )
                + "\n\n"
            )
        yield "data: [DONE]\n\n"
    finally:
        runner.abort(req)
