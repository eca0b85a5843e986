"""Where the simulated engines' HTTP APIs differ: one class per engine.

The OpenAI-compatible routes are shared (``hosts.simulator.server``); each dialect says how its
engine wraps an error, how it checks a request against the context length, and which routes of
its own it serves (SGLang's native endpoints).
"""

from __future__ import annotations

import asyncio
import json
import os

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hosts.engines import get_spec
from hosts.simulator import sampling
from hosts.simulator.runner import EngineRunner, wait_done
from hosts.simulator.wire_errors import ApiError


class Dialect:
    """One engine's way of speaking the API, for the engine ``runner`` simulates."""

    holds_stop = False  # whether a stream holds back text that may begin a stop string
    COMPLETION_MAX_TOKENS = 16  # both engines' CompletionRequest.max_tokens default

    def __init__(self, runner: EngineRunner):
        self.runner = runner
        self.cfg = runner.cfg

    def error_response(self, error: ApiError) -> JSONResponse:
        if error.status == 401:
            # Both engines' API-key middleware answers with this body, outside any envelope
            # (vLLM api_server.AuthenticationMiddleware, SGLang utils.add_api_key_middleware).
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        body = {"message": error.message, "type": error.kind, "param": None, "code": error.status}
        return JSONResponse(self.error_payload(body), status_code=error.status)

    def error_payload(self, body: dict) -> dict:
        raise NotImplementedError

    def stream_error(self, error: ApiError) -> str:
        """The data of an error event inside a stream."""
        raise NotImplementedError

    def needs_auth(self, path: str) -> bool:
        """Whether the API key guards ``path``."""
        raise NotImplementedError

    def parse(self, data: dict, chat: bool) -> sampling.Params:
        """The request's parameters, or the refusal the engine's request model gives."""
        raise NotImplementedError

    def verify(self, data: dict, params: sampling.Params, max_tokens: int) -> None:
        """The engine's checks of the sampling parameters, for an output limit of
        ``max_tokens``."""
        raise NotImplementedError

    def response_model(self, data: dict) -> str:
        """The model name the response carries, or the engine's refusal of an unknown one."""
        raise NotImplementedError

    def check_prompt(self, data: dict) -> None:
        """The engine's refusal of an empty completion prompt."""

    def requested_max_tokens(self, data: dict, params: sampling.Params, chat: bool):
        """The output limit the client asked for; completions default to 16 tokens."""
        if chat or "max_tokens" in data:
            return params.max_tokens
        return self.COMPLETION_MAX_TOKENS

    def max_tokens(self, prompt_len: int, requested: int | None) -> int:
        """The output limit of a request with ``prompt_len`` input tokens, or the engine's
        refusal (ApiError) when it does not fit the context length."""
        raise NotImplementedError

    def routes(self) -> list[Route]:
        """Routes this engine serves beyond the shared OpenAI-compatible ones."""
        return []


class VllmDialect(Dialect):
    """vLLM 0.11.0's OpenAI-compatible server (vllm/entrypoints/openai/api_server.py)."""

    holds_stop = True  # vllm/v1/engine/detokenizer.py get_next_output_text

    def error_payload(self, body: dict) -> dict:
        return {"error": body}  # vLLM ≥ 0.10.1 wraps errors in {"error": …}

    def stream_error(self, error: ApiError) -> str:
        body = {"message": error.message, "type": error.kind, "param": None, "code": error.status}
        return json.dumps(self.error_payload(body))

    def needs_auth(self, path: str) -> bool:
        return path.startswith("/v1")  # AuthenticationMiddleware guards /v1 only

    def parse(self, data: dict, chat: bool) -> sampling.Params:
        return sampling.parse_vllm(data, chat)

    def verify(self, data: dict, params: sampling.Params, max_tokens: int) -> None:
        sampling.verify_vllm(data, params, max_tokens)

    def response_model(self, data: dict) -> str:
        model = data.get("model")
        if model is not None and model not in (self.cfg.served_model_name, self.cfg.model_name):
            # OpenAIServing._check_model
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        return model or self.cfg.served_model_name

    def check_prompt(self, data: dict) -> None:
        prompt = data.get("prompt")
        if prompt is None or prompt == "":
            raise sampling.value_error(
                "Either prompt or prompt_embeds must be provided and non-empty.", data
            )
        if data.get("suffix") is not None:
            raise ApiError(400, "suffix is not currently supported")  # serving_completion.py

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
        if requested < 1:
            return requested  # SamplingParams refuses it, in its own words
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
    """SGLang 0.5.3's server (sglang/srt/entrypoints/http_server.py and openai/)."""

    DEFAULT_MAX_TOKENS = 128

    def error_payload(self, body: dict) -> dict:
        return {"object": "error", **body}  # SGLang's OpenAI layer does not wrap

    def stream_error(self, error: ApiError) -> str:
        # OpenAIServingBase.create_streaming_error_response wraps its ErrorResponse.
        body = {"message": error.message, "type": error.kind, "param": None, "code": error.status}
        return json.dumps({"error": self.error_payload(body)})

    def needs_auth(self, path: str) -> bool:
        # add_api_key_middleware guards every route but /health* and /metrics
        return not path.startswith(("/health", "/metrics"))

    def parse(self, data: dict, chat: bool) -> sampling.Params:
        params = sampling.parse_sglang(data, chat)
        if chat:
            # OpenAIServingChat._validate_request (before the engine sees it)
            requested = params.max_tokens
            if requested and requested > self.cfg.max_model_len:
                raise ApiError(
                    400,
                    f"max_completion_tokens is too large: {requested}."
                    f"This model supports at most {self.cfg.max_model_len} completion tokens.",
                )
        return params

    def verify(self, data: dict, params: sampling.Params, max_tokens: int) -> None:
        sampling.verify_sglang(data, params, max_tokens)

    def response_model(self, data: dict) -> str:
        # SGLang does not look the name up: it answers with the name it was sent, "default"
        # when none (protocol.py DEFAULT_MODEL_NAME).
        model = data.get("model")
        return model if isinstance(model, str) else "default"

    def check_prompt(self, data: dict) -> None:
        prompt = data.get("prompt")
        if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
            raise ApiError(400, "Prompt cannot be empty")  # OpenAIServingCompletion

    def max_tokens(self, prompt_len: int, requested: int | None) -> int:
        limit = self.cfg.max_model_len
        if prompt_len >= limit:
            raise ApiError(
                400,
                f"The input ({prompt_len} tokens) is longer than the model's "
                f"context length ({limit} tokens).",
                engine=True,  # TokenizerManager._validate_one_request
            )
        max_tokens = self.DEFAULT_MAX_TOKENS if requested is None else requested
        if max_tokens < 1:
            return max(max_tokens, 0)  # SamplingParams.verify refuses below 0
        if prompt_len + max_tokens >= limit:
            raise ApiError(
                400,
                "Requested token count exceeds the model's maximum context "
                f"length of {limit} tokens. You requested a total of "
                f"{prompt_len + max_tokens} tokens: {prompt_len} tokens from the input "
                f"messages and {max_tokens} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit "
                "within the limit.",
                engine=True,
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
