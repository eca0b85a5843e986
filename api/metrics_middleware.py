"""Counts every HTTP request and times it, for ``/metrics``.

Labelled by the URL pattern's name (``hosts:detail``), never the path: ``/hosts/17/`` and
``/hosts/18/`` are one series, and a scanner probing random paths adds one ("unmatched"), not
thousands. First in ``MIDDLEWARE`` so the time covers the other middleware too.
"""

from __future__ import annotations

import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from prometheus_client import Counter, Histogram

UNMATCHED = "unmatched"
# From a static file or a cached page (a few ms) to a slow export or an API call that waits on
# a host (seconds); anything slower than 30 s is a problem whatever its exact time.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# registry=None: /metrics collects these into its own registry (api.metrics).
REQUESTS = Counter(
    "llmpanel_http_requests",
    "HTTP requests answered, by URL name, method and status code.",
    ["view", "method", "status"],
    registry=None,
)
LATENCY = Histogram(
    "llmpanel_http_request_duration_seconds",
    "Time to answer an HTTP request, by URL name and method.",
    ["view", "method"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)
# Methods outside this set are one label value, so odd verbs cannot grow the series either.
KNOWN_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


def view_label(request) -> str:
    match = getattr(request, "resolver_match", None)
    # A path no pattern matched, or a request answered before URL resolution (an HTTPS
    # redirect, a refused Host header): no name to give.
    return (match.view_name if match is not None else None) or UNMATCHED


def record(request, status: int, seconds: float) -> None:
    view = view_label(request)
    method = request.method if request.method in KNOWN_METHODS else "other"
    REQUESTS.labels(view, method, str(status)).inc()
    LATENCY.labels(view, method).observe(seconds)


class MetricsMiddleware:
    """Sync and async, like Django's own: under uvicorn the chain stays async."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        started = time.perf_counter()
        response = self.get_response(request)
        record(request, response.status_code, time.perf_counter() - started)
        return response

    async def _acall(self, request):
        started = time.perf_counter()
        response = await self.get_response(request)
        record(request, response.status_code, time.perf_counter() - started)
        return response
