"""The simulated engine's HTTP API (Starlette on uvicorn), in real time.

``create_app`` serves an ``EngineRunner`` (``hosts.simulator.runner``, the engine core stepped on
the event loop) over vLLM's OpenAI-compatible API or SGLang's: the routes both engines share are
here, the request and response formats in ``hosts.simulator.protocol``, and what differs between
the engines in ``hosts.simulator.dialects``.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import re
import uuid

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from hosts.simulator import protocol, text
from hosts.simulator.dialects import DIALECTS, Dialect
from hosts.simulator.protocol import ApiError
from hosts.simulator.runner import EngineRunner


def create_app(runner: EngineRunner) -> Starlette:
    """The engine's HTTP API; starting the app starts the runner."""
    dialect = DIALECTS[runner.cfg.engine](runner)
    api = EngineApi(runner, dialect)

    async def api_error(request: HttpRequest, exc: ApiError) -> Response:
        return dialect.error_response(exc)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await runner.start()
        yield
        await runner.stop()

    return Starlette(
        routes=api.routes() + dialect.routes(),
        exception_handlers={ApiError: api_error},
        lifespan=lifespan,
    )


class SentLog:
    """What the engine streamed, by the id the response carries (its first event's ``"id"``;
    SGLang's differ from vLLM's): the SHA-256 and length of the body's bytes, and whether the
    stream reached its end. A client can then prove that what it stored is
    byte for byte what was sent (the load generator's isolation tests). The newest ``keep``
    are kept. One per app, used only on the app's event loop."""

    def __init__(self, keep: int = 10_000):
        self.bodies: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.keep = keep

    ID = re.compile(rb'"id":\s*"([^"]+)"')

    async def recorded(self, events):
        digest, size, complete, rid = hashlib.sha256(), 0, False, None
        try:
            async for event in events:
                data = event.encode() if isinstance(event, str) else event
                digest.update(data)
                size += len(data)
                if rid is None and (match := self.ID.search(data)):
                    rid = match.group(1).decode()
                yield event
            complete = True
        finally:
            self.bodies[rid or f"no id {len(self.bodies)}"] = {
                "sha256": digest.hexdigest(),
                "bytes": size,
                "complete": complete,
            }
            while len(self.bodies) > self.keep:
                self.bodies.popitem(last=False)


class EngineApi:
    """The routes every simulated engine serves: OpenAI-compatible generation, models,
    tokenizer, health, version and metrics, and the simulator's own readings."""

    def __init__(self, runner: EngineRunner, dialect: Dialect):
        self.runner = runner
        self.cfg = runner.cfg
        self.dialect = dialect
        self.sent = SentLog()

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health),
            Route("/v1/models", self.models),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/version", self.version),
            Route("/metrics", self.metrics),
            Route("/simulator/gpus", self.gpus),
            Route("/simulator/loop-lag", self.loop_lag),
            Route("/simulator/quality", self.quality),
            Route("/simulator/sent", self.sent_bodies),
        ]

    # --- checks shared by the handlers -----------------------------------------------------
    def check_auth(self, request: HttpRequest) -> None:
        api_key = self.cfg.api_key
        if not api_key or not self.dialect.needs_auth(request.url.path):
            return
        scheme, _, key = (request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or key != api_key:
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def check_ready(self) -> None:
        if not self.runner.ready:
            raise ApiError(503, "The engine is starting.", "ServiceUnavailableError")

    async def body_of(self, request: HttpRequest) -> dict:
        """The request's JSON object."""
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(400, "The request body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        return data

    # --- generation ------------------------------------------------------------------------
    async def completions(self, request: HttpRequest) -> Response:
        return await self.generate(request, chat=False)

    async def chat_completions(self, request: HttpRequest) -> Response:
        return await self.generate(request, chat=True)

    async def generate(self, request: HttpRequest, chat: bool) -> Response:
        """Check the request as the engine would, queue it, and answer as its tokens come:
        streamed as server-sent events, or in one body once it finishes."""
        self.check_auth(request)
        self.check_ready()
        data = await self.body_of(request)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        answer = await protocol.respond(self.runner, self.dialect, data, chat, rid)
        if isinstance(answer, dict):
            return JSONResponse(answer)
        return StreamingResponse(self.sent.recorded(answer), media_type="text/event-stream")

    # --- the model and its tokenizer -------------------------------------------------------
    async def models(self, request: HttpRequest) -> Response:
        self.check_auth(request)
        cfg, created = self.cfg, self.runner.created
        card = {
            "id": cfg.served_model_name,
            "object": "model",
            "created": created,
            "owned_by": cfg.engine,
            "root": cfg.model_name,
            "parent": None,
            "max_model_len": cfg.max_model_len,
            "permission": [
                {
                    "id": "modelperm-" + uuid.uuid4().hex,
                    "object": "model_permission",
                    "created": created,
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

    async def tokenize(self, request: HttpRequest) -> Response:
        self.check_auth(request)
        data = await self.body_of(request)
        self.dialect.response_model(data)  # vLLM: 404 for a model it does not serve
        vocab = self.cfg.model.vocab
        if "messages" in data:
            ids = protocol.prompt_ids(data, True, vocab)
        else:
            ids = protocol.prompt_ids({"prompt": data.get("prompt")}, False, vocab)
        return JSONResponse(
            {"count": len(ids), "max_model_len": self.cfg.max_model_len, "tokens": ids}
        )

    async def detokenize(self, request: HttpRequest) -> Response:
        self.check_auth(request)
        data = await self.body_of(request)
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise ApiError(400, "tokens must be a list of token ids.")
        return JSONResponse({"prompt": text.detokenize(tokens)})

    # --- health, version, metrics, the simulator's readings --------------------------------
    async def health(self, request: HttpRequest) -> Response:
        return Response(status_code=200 if self.runner.ready else 503)

    async def version(self, request: HttpRequest) -> Response:
        return JSONResponse({"version": self.runner.engine_version})

    async def metrics(self, request: HttpRequest) -> Response:
        if not self.cfg.metrics_enabled:
            return PlainTextResponse("Not Found", status_code=404)
        return Response(
            self.runner.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def gpus(self, request: HttpRequest) -> Response:
        return JSONResponse({"gpus": self.runner.telemetry.sample()})

    async def loop_lag(self, request: HttpRequest) -> Response:
        # clock_resets: stalls long enough that the engine's clock restarted (its pace fell
        # behind the model's rather than catching up in a burst).
        summary = {**self.runner.loop_lag.summary(), "clock_resets": self.runner.clock_resets}
        if request.query_params.get("reset"):
            self.runner.loop_lag.samples.clear()
        return JSONResponse(summary)

    async def sent_bodies(self, request: HttpRequest) -> Response:
        """The streamed bodies' digests by response id (``SentLog``)."""
        return JSONResponse({"bodies": self.sent.bodies})

    async def quality(self, request: HttpRequest) -> Response:
        """Prompts the simulated model knows and its accuracy table for this config."""
        quality = self.runner.quality
        if quality is None:
            return JSONResponse({"items": 0, "accuracy": None})
        return JSONResponse(quality.report())
