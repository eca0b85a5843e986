"""When an engine is ready to serve: the one rule, and the probes that apply it (pure: no Django).

Every place that waits for an engine uses this module: the host agent's supervisor, the SSH
transport, the change pipeline's health check and the load generator. The rule:

1. ``GET /health`` answers 200. vLLM and SGLang bind their port before the model is loaded;
   vLLM's ``/health`` answers once the engine is up (503 when its engine core has died),
   SGLang's answers 503 until its warm-up request went through. A 404 means a server without
   that route (an OpenAI-compatible gateway the load generator may be pointed at): the model
   list alone decides then. Neither engine ever answers 404 there.
2. ``GET /v1/models`` answers 200 with an OpenAI model list (``{"data": [{"id": …}, …]}``)
   naming at least one model: the API requests go to is up and serves the model. Behind
   ``--api-key`` this route wants the key, so probes send it (a 401 is "not ready", said so).

The paths come from ``hosts.engines.metrics.endpoints`` (the same for both engines today).
``judge`` decides from what the two requests answered; ``ask`` sends them with any GET function
(the SSH transport's goes through its SSH connection), ``probe``/``aprobe`` with an httpx
client; ``wait_ready`` repeats any such check until it passes or a deadline passes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from hosts.engines.metrics import endpoints

# A server that has no /health route: the model list decides alone.
NO_HEALTH_ROUTE = 404


@dataclass(frozen=True)
class Answer:
    """What one GET got: its status and body, or (``status`` None) why nothing answered."""

    status: int | None
    body: bytes = b""
    error: str = ""

    @classmethod
    def failed(cls, exc: BaseException) -> Answer:
        """No answer, because of ``exc`` (connection refused, a timeout, …)."""
        return cls(None, error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


@dataclass(frozen=True)
class Readiness:
    """A probe's verdict: ``problem`` None when ready, and the models the server lists."""

    problem: str | None
    models: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        return self.problem is None


def health_passes(health: Answer) -> bool:
    """Whether ``/health``'s answer lets the probe go on to the model list."""
    return health.status in (200, NO_HEALTH_ROUTE)


def served_models(body: bytes | str) -> tuple[str, ...]:
    """The model ids of an OpenAI model list; ValueError when ``body`` is not one."""
    document = json.loads(body)
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise ValueError("not an OpenAI model list")
    return tuple(str(m.get("id")) for m in data)


def judge(health: Answer, models: Answer | None, *, engine: str = "vllm") -> str | None:
    """None when the answers say the engine is ready, else why not (one line).

    ``models`` is None when it was not asked for (``/health`` did not pass)."""
    paths = endpoints(engine)
    if health.status is None:
        return health.error or f"{paths.health}: no answer"
    if not health_passes(health):
        return f"{paths.health} answered {health.status}"
    if models is None:
        return f"{paths.models} was not asked"
    if models.status is None:
        return models.error or f"{paths.models}: no answer"
    if models.status != 200:
        return f"{paths.models} answered {models.status}"
    try:
        served = served_models(models.body)
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors too
        return f"{paths.models} did not answer an OpenAI model list"
    if not served:
        return f"{paths.models} lists no model"
    return None


def readiness_of(health: Answer, models: Answer | None, *, engine: str = "vllm") -> Readiness:
    """``judge``'s answer with the served models (empty unless ready)."""
    problem = judge(health, models, engine=engine)
    return Readiness(problem, served_models(models.body) if problem is None and models else ())


def ask(get: Callable[[str], Answer], *, engine: str = "vllm") -> Readiness:
    """The rule applied with any way of sending a GET: ``get(path)`` → its Answer. The model
    list is asked for only once ``/health`` has passed."""
    paths = endpoints(engine)
    health = get(paths.health)
    models = get(paths.models) if health_passes(health) else None
    return readiness_of(health, models, engine=engine)


def _get(client: httpx.Client, url: str, timeout) -> Answer:
    try:
        response = client.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return Answer.failed(exc)
    return Answer(response.status_code, response.content)


async def _aget(client: httpx.AsyncClient, url: str, timeout) -> Answer:
    try:
        response = await client.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return Answer.failed(exc)
    return Answer(response.status_code, response.content)


def probe(
    client: httpx.Client,
    base_url: str = "",
    *,
    engine: str = "vllm",
    timeout: float | None = None,
) -> Readiness:
    """Ask the engine at ``base_url`` (or the client's own base URL) once, with ``client``
    (which carries the API key, if any); ``timeout`` per request, else the client's."""
    base = base_url.rstrip("/")
    limit = httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
    return ask(lambda path: _get(client, base + path, limit), engine=engine)


async def aprobe(
    client: httpx.AsyncClient,
    base_url: str = "",
    *,
    engine: str = "vllm",
    timeout: float | None = None,
) -> Readiness:
    """``probe`` for asyncio code."""
    paths, base = endpoints(engine), base_url.rstrip("/")
    limit = httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
    health = await _aget(client, base + paths.health, limit)
    models = await _aget(client, base + paths.models, limit) if health_passes(health) else None
    return readiness_of(health, models, engine=engine)


def wait_ready(
    check: Callable[[], str | None],
    timeout_s: float,
    *,
    interval_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Call ``check`` (None = ready, else why not) until it passes: None, or its last problem
    once ``timeout_s`` has passed. It is always called at least once; it may raise to give up
    early (the engine exited, a stop was asked for): that goes to the caller untouched."""
    deadline = clock() + timeout_s
    while True:
        problem = check()
        if problem is None:
            return None
        remaining = deadline - clock()
        if remaining <= 0:
            return problem
        sleep(min(interval_s, remaining))
