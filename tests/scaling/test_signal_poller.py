"""The signal poller against real simulator processes: a running deployment on an online
host gets a sample with its signals; an engine that does not answer is skipped without
failing the others (and logged once); SGLang without --enable-metrics and hosts that are not
online are not asked; old samples go; the queries do not grow with the deployments."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from django.utils import timezone

from hosts.choices import DeploymentStatus, HostStatus
from scaling.models import EngineSample
from scaling.services import signals
from tests.conftest import free_port
from tests.factories import make_config, make_deployment, make_host
from tests.hosts.simulator.conftest import LLAMA, QWEN, SimServer

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _fresh_poller_state():
    signals._snapshots.clear()
    signals._failing.clear()
    yield
    signals._snapshots.clear()
    signals._failing.clear()


@pytest.fixture(scope="module")
def vllm_sim():
    server = SimServer("vllm", ["--time-scale", "0.05", "--api-key", "sekrit"])
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def running(port: int, *, engine="vllm", model=LLAMA, host=None, settings=None):
    host = host or make_host(status=HostStatus.ONLINE)
    d = make_deployment(host, engine=engine, model=model, port=port)
    d.active_config = make_config(d, settings if settings is not None else {"api_key": "sekrit"})
    d.status = DeploymentStatus.RUNNING
    d.save()
    return d


def complete(sim: SimServer, n: int = 1) -> None:
    for _ in range(n):
        body = {"model": sim.model, "prompt": "hello " * 80, "max_tokens": 6}
        headers = {"Authorization": "Bearer sekrit"}
        r = httpx.post(sim.url + "/v1/completions", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text


def test_a_running_deployment_gets_a_sample_with_its_signals(vllm_sim):
    d = running(vllm_sim.port)
    assert signals.poll_signals() == 1
    complete(vllm_sim, 3)
    assert signals.poll_signals() == 1
    samples = signals.recent_samples(d, 60)
    assert len(samples) == 2 and samples[0].time < samples[1].time
    newest = samples[-1]
    assert newest.snapshot["engine"] == "vllm" and "ttft" in newest.snapshot["histograms"]
    latest = signals.latest_signals([d.pk])
    at, s = latest[d.pk]
    assert at == newest.time and s.engine == "vllm"
    assert s.requests_waiting == 0 and s.kv_cache_usage_ratio is not None
    # Three requests finished between the two polls: they are in the windows.
    assert s.ttft["1m"].requests == 3 and s.ttft["1m"].p95 is not None
    assert s.ttft["1m"].seconds > 0 and s.finished_rps > 0
    assert s.pending_prompt_tokens == 0


def test_latest_signals_is_one_query_and_honours_max_age(vllm_sim, django_assert_num_queries):
    d = running(vllm_sim.port)
    other = running(vllm_sim.port)
    signals.poll_signals()
    EngineSample.objects.filter(deployment=other).update(time=timezone.now() - timedelta(hours=1))
    with django_assert_num_queries(1):
        latest = signals.latest_signals([d.pk, other.pk])
    assert set(latest) == {d.pk, other.pk}
    assert set(signals.latest_signals([d.pk, other.pk], max_age_s=60)) == {d.pk}


def test_an_engine_that_does_not_answer_is_skipped_and_logged_once(vllm_sim, caplog):
    good = running(vllm_sim.port)
    dead = running(free_port())
    caplog.set_level(logging.WARNING, logger="scaling.services.signals")
    for _ in range(3):
        assert signals.poll_signals() == 1
    assert set(EngineSample.objects.values_list("deployment_id", flat=True)) == {good.pk}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and dead.name in warnings[0].getMessage()
    assert "ConnectError" in warnings[0].getMessage()


class _FakeEngine(BaseHTTPRequestHandler):
    """Serves a fixture as /metrics (or an error status), noting the Authorization header."""

    status = 200
    seen: list = []

    def do_GET(self):  # noqa: N802 - the http.server API
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        body = (FIXTURES / "expo_vllm_real_v0_qwen3.txt").read_bytes()
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_engine():
    def start(status: int):
        handler = type("Handler", (_FakeEngine,), {"status": status, "seen": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1], handler

    servers: list = []
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_key_is_sent_and_an_error_status_fails_only_that_engine(fake_engine):
    ok_port, ok = fake_engine(200)
    bad_port, bad = fake_engine(500)
    good = running(ok_port, settings={"api_key": "sekrit"})
    broken = running(bad_port, settings={})
    assert signals.poll_signals() == 1
    assert ok.seen == [("/metrics", "Bearer sekrit")] and bad.seen == [("/metrics", None)]
    assert signals._failing == {broken.pk: "HTTP 500"}
    sample = EngineSample.objects.get()
    assert sample.deployment_id == good.pk
    assert sample.snapshot["histograms"]["itl"]["count"] == 4805  # the older vLLM names


def test_sglang_is_asked_only_with_enable_metrics():
    sim = SimServer("sglang", ["--time-scale", "0.05", "--enable-metrics"])
    try:
        sim.wait_ready()
        without = running(sim.port, engine="sglang", model=QWEN, settings={})
        assert signals.pollable_deployments() == []
        assert signals.poll_signals() == 0 and not signals._failing
        with_metrics = running(
            sim.port, engine="sglang", model=QWEN, settings={"enable_metrics": True}
        )
        complete(sim, 2)
        assert signals.poll_signals() == 1
    finally:
        sim.stop()
    sample = EngineSample.objects.get()
    assert sample.deployment_id == with_metrics.pk != without.pk
    assert sample.signals["engine"] == "sglang" and sample.signals["requests_waiting"] == 0


def test_only_running_deployments_on_online_hosts_are_asked(vllm_sim):
    offline = running(vllm_sim.port, host=make_host(status=HostStatus.UNREACHABLE))
    stopped = running(vllm_sim.port)
    stopped.status = DeploymentStatus.STOPPED
    stopped.save()
    assert offline and signals.poll_signals() == 0
    assert not EngineSample.objects.exists()


def test_old_samples_are_deleted(vllm_sim, settings):
    settings.SCALING_SAMPLE_RETENTION_MINUTES = 10
    d = running(vllm_sim.port)
    old = EngineSample.objects.create(deployment=d, time=timezone.now() - timedelta(minutes=11))
    recent = EngineSample.objects.create(deployment=d, time=timezone.now() - timedelta(minutes=9))
    signals.poll_signals()
    kept = set(EngineSample.objects.values_list("pk", flat=True))
    assert old.pk not in kept and recent.pk in kept and len(kept) == 2


def test_history_is_read_from_the_database_when_another_process_wrote_it(vllm_sim):
    d = running(vllm_sim.port)
    signals.poll_signals()
    complete(vllm_sim, 2)
    signals._snapshots.clear()  # the next poll runs in a worker that has seen nothing
    signals.poll_signals()
    s = signals.latest_signals([d.pk])[d.pk][1]
    assert s.ttft["1m"].requests == 2


def test_the_queries_do_not_grow_with_the_deployments(vllm_sim, django_assert_max_num_queries):
    def poll_queries(n: int) -> int:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        for _ in range(n):
            running(vllm_sim.port)
        signals.poll_signals()  # warm: every deployment has a sample
        signals._snapshots.clear()  # and the worker that polls next has seen none of them
        with CaptureQueriesContext(connection) as ctx:
            stored = signals.poll_signals()
        assert stored == len(signals.pollable_deployments())
        return len(ctx.captured_queries)

    one = poll_queries(1)
    six = poll_queries(5)
    assert six == one
    with django_assert_max_num_queries(6):
        signals.poll_signals()
