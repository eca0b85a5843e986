"""Admission control for one web process: at most ``limit`` HTTP requests run at once, the
next ones wait their turn up to ``wait_s``, and past that the answer is a quick 503 with
``Retry-After`` instead of a 500 much later.

Why: under ASGI every request runs Django in a thread of its own, and every thread wants one of
the process's pooled database connections (DATABASE_POOL_SIZE). Offered more page views than
its CPU can serve (scripts/bench_web.py, open loop at 100/s on 2 cores with 4,000 GPUs being
polled), a process started hundreds of threads that queued on the pool, answered in 15-30 s,
and failed 2,114 of 3,000 views with "couldn't get a connection after 10 s" (HTTP 500). Waiting
here instead costs no thread and no connection, serves the requests in arrival order, and
tells a client the truth about an overloaded panel while it stays responsive to the ones it
admits.

WebSockets are not counted (a live page holds its socket for hours); neither are the health
check (an orchestrator must not restart a busy but healthy web tier), ``/metrics`` (the
scraper should see the overload) and static files (no database). A plain ASGI middleware with
no Django import: it wraps Django's application in ``controlpanel.asgi``. Refusals are counted
on ``/metrics`` as ``llmpanel_http_shed_total``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable

from prometheus_client import Counter

# registry=None: /metrics collects it into its own registry (api.metrics).
SHED = Counter(
    "llmpanel_http_shed",
    "HTTP requests answered 503 because their web process was busy past WEB_QUEUE_SECONDS.",
    registry=None,
)
# Paths that never wait (see above).
EXEMPT_PREFIXES = ("/static/", "/healthz", "/metrics", "/favicon.ico")


class Admission:
    """Wraps an ASGI application's HTTP requests; ``on_shed`` is told of each refusal."""

    def __init__(
        self, app, limit: int, wait_s: float, on_shed: Callable[[str], None] | None = None
    ):
        if limit < 1:
            raise ValueError("the limit must be at least 1")
        self.app, self.limit, self.wait_s, self.on_shed = app, limit, wait_s, on_shed
        self._slots: asyncio.Semaphore | None = None
        self._loop = None

    def _semaphore(self) -> asyncio.Semaphore:
        # One per event loop (uvicorn has one per process; tests start several).
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._slots, self._loop = asyncio.Semaphore(self.limit), loop
        return self._slots

    @property
    def in_flight(self) -> int:
        return 0 if self._slots is None else self.limit - self._slots._value

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "").startswith(EXEMPT_PREFIXES):
            return await self.app(scope, receive, send)
        slots = self._semaphore()
        if not slots.locked():
            await slots.acquire()  # a free slot: no wait (wait_for(timeout=0) would refuse)
        else:
            try:
                await asyncio.wait_for(slots.acquire(), timeout=self.wait_s)
            except TimeoutError:
                SHED.inc()
                if self.on_shed is not None:
                    self.on_shed(scope.get("path", ""))
                return await self._busy(scope, send)
        try:
            return await self.app(scope, receive, send)
        finally:
            slots.release()

    async def _busy(self, scope, send) -> None:
        retry = str(max(1, math.ceil(self.wait_s)))
        text = (
            f"The panel is busy: {self.limit} requests are being served by this process and "
            f"this one waited {self.wait_s:g} s for its turn. Try again in {retry} s."
        )
        if scope.get("path", "").startswith("/api/"):
            body, kind = json.dumps({"detail": text}).encode(), b"application/json"
        else:
            body, kind = text.encode(), b"text/plain; charset=utf-8"
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", kind),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", retry.encode()),
                    (b"cache-control", b"no-store"),
                    (b"x-content-type-options", b"nosniff"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
