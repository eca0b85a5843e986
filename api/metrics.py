"""``/metrics``: the panel's own numbers for Prometheus (text exposition format).

Who may scrape: a Bearer API token of a user holding a role (the API's own check, with its
throttle of bad tokens), or an address in ``METRICS_ALLOWED_ADDRESSES`` for a Prometheus
without a token. Anything else gets a short 401, not the login page.

Where the numbers come from:

- HTTP requests and WebSocket connections are counted in the process that serves them
  (``api.metrics_middleware``, ``controlpanel.realtime_stats``). prometheus-client keeps them
  per process; with ``PROMETHEUS_MULTIPROC_DIR`` set (several uvicorn workers) every process
  writes them to files there and this view adds them up (prometheus-client's multiprocess
  mode). Unset, each process reports its own, which is exact for one web process (embedded
  mode, or one uvicorn worker per container with one scrape target each).
- Celery tasks and workers come from Redis, where every worker counts them
  (``controlpanel.task_stats``); embedded, from the worker thread in this process.
- The rest is read from the database at scrape time: three queries, whatever the fleet's size,
  and the deployments' scaling families (``api.metrics_scaling``): about ten more.
"""

from __future__ import annotations

import ipaddress
import logging
import time

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Max
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from rest_framework import exceptions

from api import auth
from api.metrics_middleware import LATENCY, REQUESTS
from api.metrics_scaling import scaling_families
from benchmarks.models import BenchmarkRun
from benchmarks.services.runs import ACTIVE as RUN_ACTIVE
from changes.choices import LOCK_STATES, SweepState
from changes.models import ChangeRequest, Sweep
from controlpanel import task_stats
from controlpanel.admission import SHED
from controlpanel.celery import app as celery_app
from controlpanel.realtime_stats import WEBSOCKETS
from hosts.models import Host

log = logging.getLogger(__name__)

# A token's user must hold a role; every role can see the fleet (host names are labels here).
SCRAPE_PERMISSION = "hosts.view_host"


@login_not_required
@never_cache
@require_safe
def metrics(request):
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    # The classic text format (0.0.4), which every Prometheus since 2.0 reads; the names here
    # are all plain, so it loses nothing.
    body = generate_latest(scrape_registry())
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)


def _refusal(request) -> HttpResponse | None:
    if address_allowed(auth.client_address(request)):
        return None
    try:
        found = auth.BearerTokenAuthentication().authenticate(request)
    except exceptions.Throttled as exc:
        response = _text(429, "Too many bad API tokens from this address.")
        response["Retry-After"] = str(int(exc.wait or settings.API_TOKEN_FAILURE_WINDOW))
        return response
    except exceptions.AuthenticationFailed:
        found = None
    if found is None:
        response = _text(401, "A Bearer API token is needed.")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    user, _token = found
    if not user.has_perm(SCRAPE_PERMISSION):
        return _text(403, "This token's user holds no role.")
    return None


def _text(status: int, message: str) -> HttpResponse:
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")


def address_allowed(address: str) -> bool:
    networks = settings.METRICS_ALLOWED_ADDRESSES
    if not networks:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # "unknown", or not an IP (a Unix socket)
        return False
    candidates = [ip]
    if ip.version == 6 and ip.ipv4_mapped is not None:  # ::ffff:10.0.0.5 from a dual stack
        candidates.append(ip.ipv4_mapped)
    return any(c in network for c in candidates for network in networks)


def scrape_registry() -> CollectorRegistry:
    """A registry for one scrape: the per-process instruments (or, in multiprocess mode,
    every process's files) and the panel's own numbers read now."""
    # Not prometheus-client's default registry: that one adds python_* and process_*
    # families; every family here starts with llmpanel_.
    registry = CollectorRegistry(auto_describe=False)
    if settings.PROMETHEUS_MULTIPROC_DIR:
        multiprocess.MultiProcessCollector(registry, path=settings.PROMETHEUS_MULTIPROC_DIR)
    else:
        for instrument in (REQUESTS, LATENCY, WEBSOCKETS, SHED):
            registry.register(instrument)
    registry.register(PanelCollector())
    return registry


class PanelCollector:
    """What the database and Celery say at the moment of the scrape."""

    def collect(self):
        yield from self._work()
        yield self._poll_lag()
        try:
            yield from self._celery()
        except redis.RedisError as exc:
            # The rest of the scrape still stands; the Celery families are simply absent.
            log.warning("/metrics: Celery numbers unavailable: %s", exc)
        try:
            families = scaling_families()
        except Exception:  # noqa: BLE001 - the rest of the scrape must still stand
            # A bug or a bad row in the scaling state must not take the panel's own numbers
            # (and Prometheus' view of the panel) down with it; the families are absent.
            log.exception("/metrics: deployment scaling families unavailable")
            families = []
        yield from families

    def _work(self):
        runs = BenchmarkRun.objects.filter(status__in=RUN_ACTIVE).count()
        yield GaugeMetricFamily(
            "llmpanel_runs_active", "Benchmark runs queued or running.", value=runs
        )
        changes = ChangeRequest.objects.filter(state__in=LOCK_STATES).count()
        yield GaugeMetricFamily(
            "llmpanel_changes_active",
            "Changes being applied or verified (holding their deployment's lock).",
            value=changes,
        )
        sweeps = Sweep.objects.filter(state__in=(SweepState.PREDICTING, SweepState.RUNNING)).count()
        yield GaugeMetricFamily(
            "llmpanel_sweeps_active",
            "Tuning sweeps predicting or running trials.",
            value=sweeps,
        )

    def _poll_lag(self):
        family = GaugeMetricFamily(
            "llmpanel_telemetry_poll_lag_seconds",
            "Seconds since the newest telemetry sample of the host's GPUs (hosts with one).",
            labels=["host"],
        )
        now = timezone.now()
        # Gpu.last_sample_at is stamped with every sample (hosts.services.telemetry), so the
        # newest per host is one aggregate over the GPUs, not a scan of the samples.
        newest = (
            Host.objects.annotate(newest=Max("gpus__last_sample_at"))
            .filter(newest__isnull=False)
            .values_list("name", "newest")
        )
        for name, when in newest:
            family.add_metric([name], max(0.0, (now - when).total_seconds()))
        return family

    def _celery(self):
        queues = GaugeMetricFamily(
            "llmpanel_celery_queue_length",
            "Tasks waiting in the broker queue (not those a worker has taken).",
            labels=["queue"],
        )
        for name, length in task_stats.queue_lengths(celery_app).items():
            queues.add_metric([name], length)
        tasks = CounterMetricFamily(
            "llmpanel_celery_tasks",
            "Celery tasks by state (started, succeeded, failed, retried), counted by the "
            "workers since Redis (embedded: this process) started.",
            labels=["task", "state"],
        )
        for (task, state), count in sorted(task_stats.task_counts().items()):
            tasks.add_metric([task, state], count)
        workers = GaugeMetricFamily(
            "llmpanel_celery_workers",
            f"Celery workers heard from in the last {task_stats.WORKER_STALE_SECONDS:g} s.",
            value=task_stats.workers_alive(time.time()),
        )
        return [queues, tasks, workers]
