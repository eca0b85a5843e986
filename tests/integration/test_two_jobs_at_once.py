"""Background jobs two at a time in one process, as the embedded worker runs them (issue 37,
"Isolation"): the in-process Celery worker's threads run two benchmarks on two deployments at
once while this test edits the host's price (as an admin does) and polls the fleet's
telemetry and the engines' signals from two more threads; a benchmark beside a quality probe;
a benchmark beside a sweep's lane (its trials restart an engine the host agent supervises)
under the same polling.

What each client stored must be exactly what each engine sent: no client error, every
request's answer complete, each response body the load generator read byte for byte the body the
simulator streamed for that response id (its ``/simulator/sent``), the tokens and requests each
simulator counted on its own /metrics equal to what the run recorded, and a probe's answers
byte for byte those it got alone (the engine's answers are data: ``--knowledge``). The host is
never marked unreachable (its poll transport was once closed under a reader when the price
changed), and no poll fails.

Waits are on conditions (task signals, events), never on sleeps; the profiles are short."""

from __future__ import annotations

import hashlib
import re
import threading
from decimal import Decimal
from unittest import mock

import httpx
import pytest
from celery.signals import task_postrun, task_prerun
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import records
from benchmarks.loadgen import transport
from benchmarks.models import BenchmarkRun, RunRequestLog
from benchmarks.models_quality import ProbeResult, ProbeSet
from benchmarks.quality.builtin import SETS_DIR
from benchmarks.services import probes
from benchmarks.services import runs as services
from changes.models import Sweep
from changes.services import sweep_prediction, sweeps
from controlpanel.celery import app
from controlpanel.embedded import EmbeddedRuntime
from hosts.choices import DeploymentStatus, HostStatus
from hosts.models import EngineConfig, EngineOperation, Host
from hosts.services import operations as host_operations
from hosts.services import telemetry, telemetry_fleet
from scaling.services import signals
from tests.factories import (
    make_config,
    make_deployment,
    make_host,
    make_profile,
    make_sim_deployment,
)
from tests.hosts.agent.conftest import AgentProcess
from tests.hosts.simulator.conftest import module_sim_server  # noqa: F401 - shared fixture

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REQUESTS, OUTPUT = 40, 16
PROFILE = {
    "stages": [{"name": "main", "concurrency": 8, "num_requests": REQUESTS}],
    "input_len": {"kind": "fixed", "mean": 64},
    "output_len": {"kind": "fixed", "mean": OUTPUT},
    "warmup_requests": 0,
}
WAIT_S = 120  # the most a wait for a condition may take before the test fails
BENCHMARK_TASK = "benchmarks.tasks.run_benchmark"
PROBE_TASK = "benchmarks.tasks.run_probe"
PROBE_ITEMS = 24


@pytest.fixture(scope="module")
def engines(module_sim_server, tmp_path_factory):  # noqa: F811
    # The probe items' answers as data (as the demo fleet's engines get them): what the
    # engine answers an item is then fixed, whichever request of the engine asks it.
    knowledge = tmp_path_factory.mktemp("knowledge") / "knowledge.jsonl"
    probes.write_knowledge(knowledge)
    return [
        module_sim_server("vllm", "--time-scale", "0.05", "--knowledge", str(knowledge))
        for _ in range(2)
    ]


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    process = AgentProcess(tmp_path_factory.mktemp("agent"), "--simulate", "h100-sxm:2")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def runtime():
    assert app.conf.task_always_eager is False
    app.control.purge()  # what earlier tests queued with no worker to take it
    rt = EmbeddedRuntime(app, concurrency=4, beat=False)
    rt.start()
    yield rt
    rt.stop()


class Tasks:
    """The worker's tasks by name as they start and end (celery's own signals)."""

    def __init__(self):
        self.started: dict[str, threading.Semaphore] = {}
        self.finished: dict[str, threading.Semaphore] = {}
        self.lock = threading.Lock()

    def _of(self, table: dict, name: str) -> threading.Semaphore:
        with self.lock:
            return table.setdefault(name, threading.Semaphore(0))

    def prerun(self, sender=None, **kwargs):
        if sender is not None:
            self._of(self.started, sender.name).release()

    def postrun(self, sender=None, **kwargs):
        if sender is not None:
            self._of(self.finished, sender.name).release()

    def wait(self, table: dict, name: str, count: int = 1) -> None:
        for _ in range(count):
            assert self._of(table, name).acquire(timeout=WAIT_S), f"{name}: {count} never came"


@pytest.fixture
def tasks():
    seen = Tasks()
    task_prerun.connect(seen.prerun, weak=False)
    task_postrun.connect(seen.postrun, weak=False)
    yield seen
    task_prerun.disconnect(seen.prerun)
    task_postrun.disconnect(seen.postrun)


def engine_counts(url: str) -> tuple[float, float]:
    """(requests finished, tokens generated) as the simulator counts them on /metrics."""
    text = httpx.get(url + "/metrics", timeout=30).text
    finished = generated = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                finished += sample.value
            elif sample.name == "vllm:generation_tokens_total":
                generated += sample.value
    return finished, generated


class Received:
    """What each streamed generation brought the load generator, byte for byte: its SHA-256
    and length by response id (the body's first ``"id"``), teed from the transport's body
    stream that the client reads."""

    RID = re.compile(rb'"id":\s*"([^"]+)"')

    def __init__(self, monkeypatch):
        self.bodies: dict[str, dict] = {}
        self.lock = threading.Lock()
        original, received = transport._Body.__aiter__, self

        async def tee(body):
            digest, size, head = hashlib.sha256(), 0, b""
            async for piece in original(body):
                digest.update(piece)
                size += len(piece)
                if len(head) < 512:
                    head += piece
                yield piece
            # Reached only when the body was read to its end. Only the generations' event
            # streams: the same transport reads the engine's /metrics and /v1/models.
            if not head.startswith(b"data:"):
                return
            match = received.RID.search(head)
            with received.lock:
                received.bodies[match.group(1).decode() if match else f"no id #{size}"] = {
                    "sha256": digest.hexdigest(),
                    "bytes": size,
                    "complete": True,
                }

        monkeypatch.setattr(transport._Body, "__aiter__", tee)


@pytest.fixture
def received(monkeypatch):
    return Received(monkeypatch)


def engine_sent(url: str) -> dict[str, dict]:
    """The bodies the simulator streamed, by response id."""
    return httpx.get(url + "/simulator/sent", timeout=30).json()["bodies"]


def assert_read_what_the_engines_sent(received: Received, engines, before: list[dict]) -> None:
    """Every body the load generator read is, byte for byte, the body one of the engines
    streamed under that id, and each engine's new bodies were all read in full."""
    with received.lock:
        read = dict(received.bodies)
    claimed = set()
    for engine, earlier in zip(engines, before, strict=True):
        sent = {rid: body for rid, body in engine_sent(engine.url).items() if rid not in earlier}
        assert len(sent) == REQUESTS, (engine.url, len(sent))
        assert {rid: read.get(rid) for rid in sent} == sent
        claimed |= set(sent)
    assert set(read) <= claimed, sorted(set(read) - claimed)


def polling(name: str, poll, stop: threading.Event, failures: list) -> threading.Thread:
    """``poll()`` again and again on a thread of its own until ``stop``; what it raised is
    kept in ``failures``."""

    def body():
        try:
            while not stop.is_set():
                poll()
                stop.wait(0.1)  # beat polls every second; ten times as often here
        except Exception as exc:  # noqa: BLE001 - reported by the test
            failures.append((name, repr(exc)))
        finally:
            connection.close()

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread


def recorded_statuses(monkeypatch) -> list[tuple[str, str]]:
    """Every status a poll gives the host, as it gives it."""
    statuses: list[tuple[str, str]] = []
    for module in (telemetry, telemetry_fleet):
        original = module.set_status

        def recorded(host, status, error="", _original=original):
            statuses.append((status, error))
            _original(host, status, error)

        monkeypatch.setattr(module, "set_status", recorded)
    return statuses


def fleet(agent, engines) -> tuple[Host, list]:
    """A host (the agent) online with its GPUs, and a running deployment per engine."""
    host = make_host(name="busy-host", port=agent.port, agent_token=agent.token)
    assert telemetry.poll_host(host) > 0  # online, its GPUs learnt
    deployments = []
    for i, engine in enumerate(engines):
        deployment = make_deployment(
            host, name=f"llama-{i}", port=engine.port, engine_version="0.11.0"
        )
        deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
        deployment.status = DeploymentStatus.RUNNING
        deployment.save()
        deployments.append(deployment)
    return host, deployments


def assert_stored_what_the_engine_sent(run, engine, before: tuple[float, float]) -> None:
    run = BenchmarkRun.objects.get(pk=run.pk)
    assert run.status == "succeeded", (run.error, run.log)
    assert (run.completed, run.failed) == (REQUESTS, 0), run.log
    rows = list(records.iter_rows(bytes(RunRequestLog.objects.get(run=run).data)))
    assert [r for r in rows if r["error_class"]] == []
    assert len(rows) == REQUESTS and {r["output_tokens"] for r in rows} == {OUTPUT}
    # What the engine itself counts it answered is what this run stored, to the token.
    finished, generated = engine_counts(engine.url)
    assert finished - before[0] == REQUESTS
    assert generated - before[1] == run.output_tokens_total == REQUESTS * OUTPUT


def test_two_benchmarks_a_price_edit_and_polls_at_once(
    runtime, tasks, engines, agent, received, monkeypatch
):
    statuses = recorded_statuses(monkeypatch)
    host, deployments = fleet(agent, engines)
    before = [engine_counts(engine.url) for engine in engines]
    sent_before = [engine_sent(engine.url) for engine in engines]

    profile = make_profile(spec=PROFILE)
    runs = [services.start_benchmark(None, d, profile, label="two at once") for d in deployments]
    tasks.wait(tasks.started, BENCHMARK_TASK, 2)  # both on the worker's threads now

    stop, failures = threading.Event(), []
    pollers = [
        polling("telemetry", telemetry.poll_telemetry, stop, failures),
        polling("signals", signals.poll_signals, stop, failures),
    ]
    try:
        # An admin edits the host's price during the runs (the admin saves the whole row).
        edited = Host.objects.get(pk=host.pk)
        edited.hourly_price = Decimal("9.75")
        edited.save()
        tasks.wait(tasks.finished, BENCHMARK_TASK, 2)
    finally:
        stop.set()
        for thread in pollers:
            thread.join(WAIT_S)
    assert failures == []

    for run, engine, counts in zip(runs, engines, before, strict=True):
        assert_stored_what_the_engine_sent(run, engine, counts)
    assert_read_what_the_engines_sent(received, engines, sent_before)

    host.refresh_from_db()
    assert host.status == HostStatus.ONLINE and host.hourly_price == Decimal("9.75")
    assert [s for s in statuses if s[0] != HostStatus.ONLINE] == [], statuses


def tiny_probe_set() -> ProbeSet:
    """The first items of a built-in set: a probe of a few seconds."""
    lines = (SETS_DIR / "knowledge-en.jsonl").read_bytes().splitlines()[:PROBE_ITEMS]
    return probes.upload_set(None, "two-at-once", b"\n".join(lines) + b"\n")


def answers(probe) -> list[tuple]:
    return list(
        ProbeResult.objects.filter(run=probe)
        .order_by("item_id")
        .values_list("item_id", "answer", "correct")
    )


def test_a_benchmark_and_a_probe_at_once_answer_as_each_alone(
    runtime, tasks, engines, agent, received
):
    _host, (benchmarked, probed) = fleet(agent, engines)
    probe_set = tiny_probe_set()
    alone = probes.start_probe(None, probed, probe_set, concurrency=4)
    tasks.wait(tasks.finished, PROBE_TASK)
    expected = answers(alone)
    assert len(expected) == PROBE_ITEMS and all(answer for _, answer, _ in expected)

    before = engine_counts(engines[0].url)
    sent_before = engine_sent(engines[0].url)
    run = services.start_benchmark(None, benchmarked, make_profile(spec=PROFILE), label="t")
    probe = probes.start_probe(None, probed, probe_set, concurrency=4)
    for name in (BENCHMARK_TASK, PROBE_TASK):
        tasks.wait(tasks.finished, name)

    probe.refresh_from_db()
    assert probe.status == "succeeded", (probe.error, probe.log)
    assert answers(probe) == expected  # every answer as the engine gave it alone
    # ... which is, byte for byte, one of the two the engine was given for the item.
    given = {item.id: (item.reference, item.wrong) for item in probes.items_of(probe_set)}
    assert all(answer in given[item] for item, answer, _ in expected), expected
    assert_stored_what_the_engine_sent(run, engines[0], before)
    assert_read_what_the_engines_sent(received, engines[:1], [sent_before])


SWEEP_LOAD = {
    "stages": [{"name": "main", "request_rate": 10, "num_requests": 30}],
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
    "warmup_requests": 2,
}


def test_a_sweep_trial_beside_a_benchmark_with_telemetry_polling(
    runtime, tasks, engines, agent, operator, settings, received, monkeypatch
):
    settings.CHANGE_HEALTH_TIMEOUT = 10
    statuses = recorded_statuses(monkeypatch)
    host, (benchmarked, _) = fleet(agent, engines)
    # The sweep's deployment is an engine the agent supervises: trials restart it.
    swept = make_sim_deployment(
        host, simulator={"gpu": "h100-sxm", "startup_seconds": 0.3, "time_scale": 0.5}
    )
    config = EngineConfig.objects.create_next(swept, {"max_num_seqs": 4, "max_model_len": 8192})
    apply = EngineOperation.objects.create(deployment=swept, kind="apply", config=config)
    host_operations.run_operation(EngineOperation.objects.get(pk=apply.pk))
    swept.refresh_from_db()
    assert swept.active_config == config, EngineOperation.objects.get(pk=apply.pk).error
    with mock.patch("changes.services.sweeps.enqueue_on_commit"):
        sweep = sweeps.create_sweep(
            operator,
            swept,
            title="beside a benchmark",
            profile=make_profile(spec=SWEEP_LOAD),
            space={"max_num_seqs": [2, 8]},
            slo={"ttft_p95_ms": 1000},
            max_trials=2,
            max_steps=2,
        )
    sweep = sweep_prediction.predict(Sweep.objects.get(pk=sweep.pk))

    before = engine_counts(engines[0].url)
    sent_before = engine_sent(engines[0].url)
    stop, failures = threading.Event(), []
    pollers = [
        polling("telemetry", telemetry.poll_telemetry, stop, failures),
        polling("signals", signals.poll_signals, stop, failures),
    ]
    try:
        sweeps.start_sweep(operator, sweep)  # its lane goes to the worker
        tasks.wait(tasks.started, sweeps.LANE_TASK)
        run = services.start_benchmark(None, benchmarked, make_profile(spec=PROFILE), label="t")
        tasks.wait(tasks.finished, BENCHMARK_TASK)
        tasks.wait(tasks.finished, sweeps.LANE_TASK)
    finally:
        stop.set()
        for thread in pollers:
            thread.join(WAIT_S)
    assert failures == []
    assert_stored_what_the_engine_sent(run, engines[0], before)
    # The trials' engine restarts with each trial (its record with it): the benchmark's bodies
    # are checked byte for byte here, the trials' by their token counts below.
    benchmark_sent = engine_sent(engines[0].url)
    with received.lock:
        received.bodies = {r: b for r, b in received.bodies.items() if r in benchmark_sent}
    assert_read_what_the_engines_sent(received, engines[:1], [sent_before])

    sweep.refresh_from_db()
    swept.refresh_from_db()
    assert swept.active_config == config  # restored after the trials
    trial_runs = BenchmarkRun.objects.filter(deployment=swept)
    assert trial_runs.exists()
    for trial_run in trial_runs:  # every request of every trial answered in full
        assert trial_run.status == "succeeded", (trial_run.error, trial_run.log)
        assert trial_run.failed == 0, trial_run.log
        assert trial_run.output_tokens_total == trial_run.completed * 32
    assert [s for s in statuses if s[0] != HostStatus.ONLINE] == [], statuses
