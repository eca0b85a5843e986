"""Where the simulated engines' HTTP APIs differ: one class per engine.

The OpenAI-compatible routes are shared (``hosts.simulator.server``); each dialect says how its
engine wraps an error, how it checks a request against the context length, and which routes of
its own it serves (SGLang's native endpoints).
"""

from __future__ import annotations

import asyncio
import os

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hosts.engines import get_spec
from hosts.simulator.protocol import ApiError
from hosts.simulator.runner import EngineRunner, wait_done


class Dialect:
    """One engine's way of speaking the API, for the engine ``runner`` simulates."""

    def __init__(self, runner: EngineRunner):
        self.runner = runner
        self.cfg = runner.cfg

    def error_response(self, error: ApiError) -> JSONResponse:
        body = {"message": error.message, "type": error.kind, "param": None, "code": error.status}
        return JSONResponse(self.error_payload(body), status_code=error.status)

    def error_payload(self, body: dict) -> dict:
        raise NotImplementedError

    def max_tokens(self, prompt_len: int, requested: int | None) -> int:
        """The output limit of a request with ``prompt_len`` input tokens, or the engine's
        refusal (ApiError) when it does not fit the context length."""
        raise NotImplementedError

    def routes(self) -> list[Route]:
        """Routes this engine serves beyond the shared OpenAI-compatible ones."""
        return []


class VllmDialect(Dialect):
    def error_payload(self, body: dict) -> dict:
        return {"error": body}  # vLLM ≥ 0.10.1 wraps errors in {"error": …}

    def routes(self) -> list[Route]:
        # vLLM serves its cache and sleep endpoints only in development mode
        # (vllm/entrypoints/serve/dev: attach_router returns unless VLLM_SERVER_DEV_MODE).
        if os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("1", "true", "True"):
            return []
        return [Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"])]

    async def reset_prefix_cache(self, request: HttpRequest) -> Response:
        """Like vLLM: 200 with an empty body whether or not the cache was reset (vLLM refuses
        while requests hold blocks, logs a warning and still answers 200)."""
        self.runner.core.kv.reset_prefix_cache()
        return Response(status_code=200)

    def max_tokens(self, prompt_len: int, requested: int | None) -> int:
        limit = self.cfg.max_model_len
        if prompt_len >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. "
                f"However, your request has {prompt_len} input tokens. Please "
                "reduce the length of the input messages.",
            )
        if requested is None:
            return limit - prompt_len
        if prompt_len + requested > limit:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: "
                f"{requested}. This model's maximum context length is {limit} "
                f"tokens and your request has {prompt_len} input tokens "
                f"({requested} > {limit} - {prompt_len}).",
            )
        return requested


class SglangDialect(Dialect):
    DEFAULT_MAX_TOKENS = 128

    def error_payload(self, body: dict) -> dict:
        return {"object": "error", **body}  # SGLang's OpenAI layer does not wrap

    def max_tokens(self, prompt_len: int, requested: int | None) -> int:
        limit = self.cfg.max_model_len
        if prompt_len >= limit:
            raise ApiError(
                400,
                f"The input ({prompt_len} tokens) is longer than the model's "
                f"context length ({limit} tokens).",
            )
        max_tokens = self.DEFAULT_MAX_TOKENS if requested is None else requested
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

    def routes(self) -> list[Route]:
        return [
            Route("/health_generate", self.health_generate),
            Route("/get_server_info", self.server_info),
            Route("/get_model_info", self.model_info),
            Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
        ]

    async def health_generate(self, request: HttpRequest) -> Response:
        """Healthy when the engine generates one token within 20 s, as SGLang checks."""
        runner = self.runner
        if not runner.ready:
            return Response(status_code=503)
        req = runner.submit([0], 1, ignore_eos=True, min_tokens=0)
        try:
            await asyncio.wait_for(wait_done(req), timeout=20)
        except TimeoutError:
            return Response(status_code=503)
        finally:
            runner.abort(req)
        return Response(status_code=200)

    async def server_info(self, request: HttpRequest) -> Response:
        cfg, runner = self.cfg, self.runner
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

    async def model_info(self, request: HttpRequest) -> Response:
        name = self.cfg.model_name
        return JSONResponse({"model_path": name, "tokenizer_path": name, "is_generation": True})

    async def flush_cache(self, request: HttpRequest) -> Response:
        core = self.runner.core
        if core.has_work or not core.kv.reset_prefix_cache():
            return PlainTextResponse(
                "Cache not flushed: there are running or waiting requests.\n", status_code=400
            )
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )


DIALECTS: dict[str, type[Dialect]] = {"vllm": VllmDialect, "sglang": SglangDialect}
