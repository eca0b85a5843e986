"""``/metrics``: who may scrape it, and that each family says what happened."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from celery import signals
from channels.testing import WebsocketCommunicator
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from api import auth
from api.models import TOKEN_PREFIX
from changes.choices import ChangeState, SweepState
from changes.models import ChangeRequest, Sweep
from controlpanel import env, task_stats
from controlpanel import settings as settings_module
from controlpanel.celery import app as celery_app
from controlpanel.embedded import EmbeddedRuntime
from tests.api.conftest import bearer
from tests.conftest import free_port
from tests.factories import make_deployment, make_gpu, make_host, make_profile, make_run
from tests.integration.processes import ROOT


@celery_app.task(name="tests.metrics.noop")
def noop():
    return None


@celery_app.task(name="tests.metrics.boom")
def boom():
    raise RuntimeError("boom")


def families(response) -> dict:
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def value(fams: dict, sample_name: str, **labels) -> float | None:
    for family in fams.values():
        for sample in family.samples:
            if sample.name == sample_name and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return sample.value
    return None


@pytest.fixture
def scraper(token_for, viewer):
    return token_for(viewer, "prometheus")


@pytest.fixture
def scrape(scraper):
    return lambda: families(scraper.get("/metrics"))


# --- who may scrape ---------------------------------------------------------------------------
def test_no_token_is_a_short_401_not_the_login_page(db):
    response = Client().get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert response.content == b"A Bearer API token is needed.\n"


def test_bad_token_is_401_and_counted_by_the_throttle(db, settings):
    settings.API_TOKEN_FAILURE_LIMIT = 2
    bad = bearer(TOKEN_PREFIX + "x" * 43)
    assert bad.get("/metrics").status_code == 401
    assert cache.get(auth._failures_key("127.0.0.1")) == 1
    assert bad.get("/metrics").status_code == 401
    # The same throttle as the API: the address is refused for the rest of the window.
    throttled = bad.get("/metrics")
    assert throttled.status_code == 429
    assert throttled["Retry-After"] == str(settings.API_TOKEN_FAILURE_WINDOW)


def test_a_good_token_still_scrapes_from_an_address_that_sent_bad_ones(
    db, settings, token_for, viewer
):
    # Scrapers behind one NAT: one of them guessing does not lock the others out.
    settings.API_TOKEN_FAILURE_LIMIT = 1
    bad = bearer(TOKEN_PREFIX + "y" * 43)
    assert bad.get("/metrics").status_code == 401
    assert bad.get("/metrics").status_code == 429
    assert token_for(viewer, "scraper").get("/metrics").status_code == 200


def test_revoked_token_is_401(token_for, viewer):
    from api.models import ApiToken

    client = token_for(viewer, "old")
    ApiToken.objects.filter(name="old").update(revoked_at=timezone.now())
    assert client.get("/metrics").status_code == 401


@pytest.mark.parametrize("persona", ["viewer", "operator", "approver", "admin"])
def test_a_token_of_any_role_may_scrape(request, token_for, persona):
    user = request.getfixturevalue(persona)
    assert token_for(user).get("/metrics").status_code == 200


def test_a_token_of_a_user_without_a_role_is_403(token_for, nobody):
    response = token_for(nobody).get("/metrics")
    assert response.status_code == 403
    assert b"llmpanel_" not in response.content


def test_an_allowed_address_needs_no_token(db, settings):
    settings.METRICS_ALLOWED_ADDRESSES = [ipaddress.ip_network("10.0.0.0/8")]
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="::ffff:10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="192.168.1.5").get("/metrics").status_code == 401
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 401


def test_no_address_is_allowed_by_default(db, settings):
    assert settings.METRICS_ALLOWED_ADDRESSES == []
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 401


def test_only_get_and_head(scraper):
    assert scraper.head("/metrics").status_code == 200
    assert scraper.post("/metrics").status_code == 405


def test_plain_http_is_not_redirected_to_https(db, settings):
    """Like /healthz: Prometheus scrapes inside the network, where there is no TLS."""
    settings.SECURE_SSL_REDIRECT = True
    client = Client()
    assert client.get("/metrics").status_code == 401  # answered here, not sent to https
    assert client.get("/hosts/").status_code == 301


def test_allowed_addresses_come_from_the_environment(monkeypatch):
    assert env.env_networks("X", {"X": "10.0.0.5, 10.1.0.0/16,::1"}) == [
        ipaddress.ip_network("10.0.0.5/32"),
        ipaddress.ip_network("10.1.0.0/16"),
        ipaddress.ip_network("::1/128"),
    ]
    assert env.env_networks("X", {}) == []
    monkeypatch.setenv("METRICS_ALLOWED_ADDRESSES", "10.0.0.0/8,prometheus")
    with pytest.raises(ImproperlyConfigured, match="METRICS_ALLOWED_ADDRESSES='prometheus'"):
        settings_module._settings()


def test_a_missing_multiprocess_directory_stops_the_start(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ImproperlyConfigured, match="PROMETHEUS_MULTIPROC_DIR"):
        settings_module._settings()


# --- the exposition ---------------------------------------------------------------------------
def test_the_exposition_parses_and_every_family_is_llmpanel(scrape, scraper):
    noop.apply()  # a Celery task counted, so that family has a sample too
    scraper.get("/hosts/")
    fams = scrape()
    assert fams, "no families"
    assert all(name.startswith("llmpanel_") for name in fams), sorted(fams)
    for name in (
        "llmpanel_http_requests",
        "llmpanel_http_request_duration_seconds",
        "llmpanel_telemetry_poll_lag_seconds",
        "llmpanel_runs_active",
        "llmpanel_changes_active",
        "llmpanel_sweeps_active",
        "llmpanel_websocket_connections",
        "llmpanel_celery_queue_length",
        "llmpanel_celery_tasks",
        "llmpanel_celery_workers",
    ):
        assert name in fams, name
    assert fams["llmpanel_celery_tasks"].type == "counter"
    assert value(fams, "llmpanel_sweeps_active") == 0


def test_requests_are_counted_by_url_name_never_by_path(client, viewer, scrape):
    host = make_host()
    client.force_login(viewer)
    before = scrape()
    labels = {"view": "hosts:detail", "method": "GET", "status": "200"}
    start = value(before, "llmpanel_http_requests_total", **labels) or 0
    assert client.get(f"/hosts/{host.pk}/").status_code == 200
    assert client.get(f"/hosts/{host.pk}/").status_code == 200
    client.get("/no/such/page/")
    after = scrape()
    assert value(after, "llmpanel_http_requests_total", **labels) == start + 2
    assert value(after, "llmpanel_http_requests_total", view="unmatched", status="404") >= 1
    every_label = {v for f in after.values() for s in f.samples for v in s.labels.values()}
    assert not any("/" in label for label in every_label), every_label


def test_requests_through_asgi_are_counted_too(scrape):
    """Under uvicorn the middleware chain is async: the same counting on that path."""
    from django.test import AsyncClient

    labels = {"view": "unmatched", "method": "GET", "status": "404"}
    start = value(scrape(), "llmpanel_http_requests_total", **labels) or 0
    response = asyncio.run(AsyncClient().get("/no/such/page/"))
    assert response.status_code == 404
    assert value(scrape(), "llmpanel_http_requests_total", **labels) == start + 1


def test_latency_is_observed_per_view(client, viewer, scrape):
    client.force_login(viewer)
    labels = {"view": "hosts:list", "method": "GET"}
    before = scrape()
    count = value(before, "llmpanel_http_request_duration_seconds_count", **labels) or 0
    total = value(before, "llmpanel_http_request_duration_seconds_sum", **labels) or 0
    assert client.get("/hosts/").status_code == 200
    after = scrape()
    assert value(after, "llmpanel_http_request_duration_seconds_count", **labels) == count + 1
    assert value(after, "llmpanel_http_request_duration_seconds_sum", **labels) > total
    assert value(after, "llmpanel_http_request_duration_seconds_bucket", le="+Inf", **labels) == (
        count + 1
    )


def test_poll_lag_is_the_age_of_the_hosts_newest_sample(scrape):
    stale, fresh, silent = make_host(), make_host(), make_host()
    now = timezone.now()
    make_gpu(stale, last_sample_at=now - timedelta(seconds=300))
    make_gpu(stale, last_sample_at=now - timedelta(seconds=120))  # the newest of its GPUs
    make_gpu(fresh, last_sample_at=now - timedelta(seconds=2))
    make_gpu(silent)  # never sampled: no lag to report
    fams = scrape()
    lag = "llmpanel_telemetry_poll_lag_seconds"
    assert value(fams, lag, host=stale.name) == pytest.approx(120, abs=5)
    assert value(fams, lag, host=fresh.name) == pytest.approx(2, abs=5)
    assert value(fams, lag, host=silent.name) is None


def test_a_scrape_is_a_handful_of_queries_whatever_the_fleet(scraper):
    def queries() -> int:
        scraper.get("/metrics")  # the token's last_used_at written once, not below
        with CaptureQueriesContext(connection) as ctx:
            families(scraper.get("/metrics"))
        return len(ctx.captured_queries)

    host = make_host()
    make_gpu(host, last_sample_at=timezone.now())
    few = queries()
    for _ in range(5):
        make_gpu(make_host(), last_sample_at=timezone.now())
    assert queries() == few
    assert few <= 8  # runs, changes, sweeps, poll lag, deployments (scaling), the token


def test_active_runs_and_changes_are_counted(scrape):
    make_run(status="queued")
    make_run(status="running")
    make_run(status="succeeded")
    make_run(status="failed")
    for state in (ChangeState.APPLYING, ChangeState.VERIFYING, ChangeState.PENDING):
        ChangeRequest.objects.create(
            deployment=make_deployment(), title="t", rationale="r", state=state
        )
    for state in (SweepState.PREDICTING, SweepState.RUNNING, SweepState.DONE):
        Sweep.objects.create(
            deployment=make_deployment(),
            title="t",
            state=state,
            load_profile=make_profile(),
            space={"max_num_seqs": [32, 64]},
            slo={"ttft_p95_ms": 500},
            max_trials=1,
            max_steps=1,
        )
    fams = scrape()
    assert value(fams, "llmpanel_runs_active") == 2
    assert value(fams, "llmpanel_changes_active") == 2
    assert value(fams, "llmpanel_sweeps_active") == 2


# --- WebSockets -------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_websocket_connections_are_counted_while_open(viewer, nobody):
    from channels.routing import URLRouter

    from controlpanel.realtime_stats import WEBSOCKETS
    from home.routing import websocket_urlpatterns

    host = make_host()
    gauge = WEBSOCKETS.labels("host")
    start = gauge._value.get()

    async def scenario():
        app = URLRouter(websocket_urlpatterns)
        watcher = WebsocketCommunicator(app, f"/ws/hosts/{host.pk}/")
        watcher.scope["user"] = viewer
        assert (await watcher.connect())[0]
        refused = WebsocketCommunicator(app, f"/ws/hosts/{host.pk}/")
        refused.scope["user"] = nobody
        assert not (await refused.connect())[0]
        open_now = gauge._value.get()
        await watcher.disconnect()
        return open_now

    assert asyncio.run(scenario()) == start + 1  # the refused socket is not counted
    assert gauge._value.get() == start


# --- Celery -----------------------------------------------------------------------------------
@pytest.fixture
def clean_task_stats():
    with task_stats._lock:
        task_stats._tasks.clear()
        task_stats._workers.clear()
    yield
    with task_stats._lock:
        task_stats._tasks.clear()
        task_stats._workers.clear()


@pytest.fixture
def runtime(clean_task_stats):
    # What tests/controlpanel/test_embedded_runtime.py does: earlier tests' queued tasks
    # would run here otherwise.
    celery_app.control.purge()
    rt = EmbeddedRuntime(celery_app, concurrency=1, beat=False)
    rt.start()
    yield rt
    rt.stop()


def _wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_celery_tasks_through_the_embedded_worker_are_counted(runtime, scrape):
    fams = scrape()
    assert value(fams, "llmpanel_celery_workers") == 1
    noop.delay()
    boom.delay()
    assert _wait_for(lambda: task_stats.task_counts().get(("tests.metrics.boom", "failed")))
    assert _wait_for(lambda: task_stats.task_counts().get(("tests.metrics.noop", "succeeded")))
    fams = scrape()
    total = "llmpanel_celery_tasks_total"
    assert value(fams, total, task="tests.metrics.noop", state="started") == 1
    assert value(fams, total, task="tests.metrics.noop", state="succeeded") == 1
    assert value(fams, total, task="tests.metrics.boom", state="started") == 1
    assert value(fams, total, task="tests.metrics.boom", state="failed") == 1
    assert value(fams, total, task="tests.metrics.boom", state="succeeded") is None
    runtime.stop()
    assert value(scrape(), "llmpanel_celery_workers") == 0


def test_a_retry_is_counted(clean_task_stats, scrape):
    signals.task_retry.send(sender=noop, request=None, reason="later", einfo=None)
    fams = scrape()
    assert value(fams, "llmpanel_celery_tasks_total", task="tests.metrics.noop", state="retried")


def test_the_embedded_queue_length_counts_waiting_tasks(scrape):
    celery_app.control.purge()
    try:
        before = value(scrape(), "llmpanel_celery_queue_length", queue="celery")
        noop.delay()
        noop.delay()  # no worker running: both wait in the in-memory queue
        after = value(scrape(), "llmpanel_celery_queue_length", queue="celery")
        assert after == before + 2
    finally:
        celery_app.control.purge()


def test_redis_down_leaves_the_rest_of_the_scrape(settings, scrape):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    fams = scrape()
    assert "llmpanel_runs_active" in fams
    assert "llmpanel_celery_tasks" not in fams


# --- several processes ------------------------------------------------------------------------
CHILD = """
from api.metrics_middleware import REQUESTS
from controlpanel.realtime_stats import WEBSOCKETS
REQUESTS.labels("hosts:list", "GET", "200").inc(3)
WEBSOCKETS.labels("host").inc()  # its file goes at exit: a dead process holds no socket
"""


def test_multiprocess_mode_adds_up_every_process(settings, scrape, tmp_path):
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "controlpanel.settings",
    }
    for _ in range(2):
        subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, check=True, timeout=60)
    settings.PROMETHEUS_MULTIPROC_DIR = str(tmp_path)
    fams = scrape()
    labels = {"view": "hosts:list", "method": "GET", "status": "200"}
    assert value(fams, "llmpanel_http_requests_total", **labels) == 6
    assert value(fams, "llmpanel_websocket_connections", kind="host") is None
    assert all(name.startswith("llmpanel_") for name in fams)
    assert "llmpanel_runs_active" in fams
