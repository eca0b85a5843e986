"""The advisor's snapshot of a deployment, gathered from the panel's rows: the config with the
engine's defaults resolved, GPU telemetry over the window, the host, the latest runs (stages,
errors by class and message, lengths, the server window) in a fixed number of queries, and
the engine's /metrics scraped live from a real simulator process (or its absence, in words)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from benchmarks import records as request_records
from benchmarks.models import RunPoint, RunRequestLog
from changes.services import diagnosis, diagnosis_facts
from hosts.models import GpuSample
from tests.conftest import free_port
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_gpu,
    make_host,
    make_profile,
)
from tests.hosts.simulator.conftest import SimServer

pytestmark = pytest.mark.django_db

CONTEXT_ERROR = "This model's maximum context length is 8192 tokens. However, you requested 9000"


@pytest.fixture(autouse=True)
def _fresh_caches():
    diagnosis_facts.clear_caches()
    yield
    diagnosis_facts.clear_caches()


def request(index, *, prompt=500, output=100, error=None, prefix=None, stage="peak"):
    sent = 1.0 + index * 0.01
    chunks = [] if error else [sent + 0.1 + i * 0.01 for i in range(output)]
    return {
        "index": index,
        "stage": stage,
        "warmup": False,
        "input_len": prompt,
        "max_tokens": output,
        "prompt_tokens": None if error else prompt,
        "output_tokens": 0 if error else output,
        "token_source": "usage",
        "scheduled": sent,
        "sent": sent,
        "first_token": chunks[0] if chunks else None,
        "end": chunks[-1] if chunks else sent + 0.05,
        "chunk_times": chunks,
        "status": 400 if error else 200,
        "error_class": "HTTP_4XX" if error else None,
        "error": error or "",
        "prefix_id": prefix,
    }


def logged_run(deployment, **kw):
    run = make_finished_run(deployment, **kw)
    rows = [request(i, prompt=100 + i, output=50, prefix=0 if i % 2 else None) for i in range(100)]
    rows += [request(100 + i, error=CONTEXT_ERROR) for i in range(10)]
    blob = request_records.encode(rows)
    RunRequestLog.objects.create(run=run, count=request_records.count(blob), data=blob)
    RunPoint.objects.bulk_create(
        [
            RunPoint(
                run=run, t=t, data={"server_waiting": w, "server_running": 4, "kv_cache_usage": 0.3}
            )
            for t, w in ((1.0, 10), (2.0, 20), (3.0, 30))
        ]
    )
    return run


@pytest.fixture
def deployment():
    host = make_host(
        cpu_count=32, numa_nodes=[{"node": 0, "cpus": "0-15"}, {"node": 1, "cpus": "16-31"}]
    )
    host.host_readings = {"cpu_percent": 85.0, "load_avg": [30.5, 20.0, 10.0]}
    host.save()
    gpu = make_gpu(host, index=0, numa_node=1)
    gpu.last_sample = {"max_sm_clock_mhz": 1980, "memory_used_bytes": 70 * 2**30}
    gpu.save()
    d = make_deployment(host, name="llama")
    d.gpus.add(gpu)
    config = make_config(d, {"max_num_seqs": 4}, placement={"numa_node": 0, "cpus": "0-3"})
    d.active_config = config
    d.save()
    return d


def test_config_defaults_are_resolved_as_the_engine_would(deployment):
    config = diagnosis_facts.config_facts(deployment)
    assert config.engine == "vllm" and config.settings == {"max_num_seqs": 4}
    assert config.max_num_seqs == 4  # as set
    # Unset: vLLM's defaults on an 80 GB H100 and the model's own context.
    assert config.max_model_len == 131072
    assert config.max_num_batched_tokens == 8192
    assert config.prefix_caching is True and config.chunked_prefill is True
    assert config.memory_fraction == 0.9
    assert config.kv_cache_dtype == "auto"
    assert config.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert config.weights_bytes == 16_060_000_000  # 8.03 B parameters in bf16
    assert config.kv_capacity_tokens > 100_000
    assert config.cpus == (0, 1, 2, 3) and config.numa_node == 0


def test_a_model_the_simulator_does_not_know_keeps_the_flag_tables_defaults():
    d = make_deployment(model="acme/unknown-13b", engine="sglang")
    d.active_config = make_config(d, {"mem_fraction_static": 0.97})
    d.save()
    config = diagnosis_facts.config_facts(d)
    assert config.memory_fraction == 0.97
    assert config.prefix_caching is True  # radix cache unless disabled
    assert config.weights_bytes is None and config.kv_bytes_per_token is None


def test_telemetry_is_aggregated_over_the_window(deployment, settings):
    settings.ADVISOR_TELEMETRY_SECONDS = 120
    gpu = deployment.gpus.get()
    now = timezone.now()
    GpuSample.objects.bulk_create(
        [
            GpuSample(
                gpu=gpu,
                time=now - timedelta(seconds=s),
                utilization_pct=util,
                power_w=power,
                power_limit_w=400.0,
                temperature_c=temp,
                sm_clock_mhz=clock,
                clocks_event_reasons=mask,
            )
            for s, util, power, temp, clock, mask in (
                (10, 90.0, 390.0, 80.0, 1500, 0x4),
                (20, 100.0, 400.0, 84.0, 1400, 0x4 | 0x40),
                (30, 80.0, 380.0, 78.0, 1600, 0x0),
                (40, 90.0, 390.0, 79.0, 1500, 0x4),
                # Outside the window: not counted.
                (600, 0.0, 50.0, 99.0, 300, 0x1),
            )
        ]
    )
    gathered = diagnosis_facts.gather(deployment, live=False)
    (facts,) = gathered.snapshot.gpus
    assert facts.utilization_pct == pytest.approx(90.0)
    assert facts.power_w == pytest.approx(390.0) and facts.power_limit_w == 400.0
    assert facts.temperature_c == 84.0
    assert facts.sm_clock_mhz == pytest.approx(1500.0)
    assert facts.max_sm_clock_mhz == 1980
    assert facts.clock_events == {"sw_power_cap": 0.75, "hw_thermal_slowdown": 0.25}
    assert facts.numa_node == 1 and facts.memory_used_bytes == 70 * 2**30
    assert gathered.snapshot.telemetry_seconds == 120
    host = gathered.snapshot.host
    assert host.cpu_count == 32 and host.load_1m == 30.5 and host.cpu_util_pct == 85.0
    assert host.numa_cpus[1] == tuple(range(16, 32))
    assert gathered.engine_status == "skipped" and gathered.snapshot.engine is None


def test_runs_carry_stages_errors_lengths_and_the_server_window(deployment):
    run = logged_run(
        deployment,
        engine_config=deployment.active_config,
        failed=10,
        completed=100,
        error_rate=10 / 110,
        summary={"errors_by_class": {"HTTP_4XX": 10}, "warmup_requests": 0},
        stages={
            "peak": {
                "completed": 90,
                "failed": 10,
                "error_rate": 0.1,
                "median_ttft_ms": 200.0,
                "p95_ttft_ms": 2500.0,
                "p99_ttft_ms": 4000.0,
                "median_itl_ms": 20.0,
                "p95_itl_ms": 40.0,
                "p99_itl_ms": 60.0,
                "output_throughput": 900.0,
                "max_concurrent_requests": 32,
            }
        },
        server={
            "available": True,
            "server_mean_queue_ms": 1800.0,
            "server_mean_prefill_ms": 50.0,
            "preemptions": 3,
            "prefix_cache_hit_rate": 0.1,
            "kv_cache_usage_max": 0.45,
            "scraped_at": 1_700_000_000.0,
        },
    )
    old = make_finished_run(deployment, finished_at=timezone.now() - timedelta(hours=1))
    snap = diagnosis.snapshot(deployment, live=False)
    assert [r.run_id for r in snap.runs] == [run.pk, old.pk]
    facts = snap.runs[0]
    assert facts.config_current and not snap.runs[1].config_current
    assert facts.errors_by_class == {"HTTP_4XX": 10}
    assert facts.errors_by_message == {CONTEXT_ERROR: 10}
    (stage,) = facts.stages
    assert stage.name == "peak" and stage.requests == 100 and stage.ttft_p95_ms == 2500.0
    assert stage.itl_p99_ms == 60.0 and stage.max_concurrent == 32
    lengths = facts.lengths
    assert lengths.input_p50 == pytest.approx(149.5) and lengths.output_p99 == 50
    assert lengths.total_p99 == pytest.approx(100 + 98.01 + 50, abs=0.1)
    assert lengths.shared_prefix_share == 0  # the profile has no shared prefix
    server = facts.server
    assert server.source == f"run {run.pk}" and server.queue_ms == 1800.0
    assert server.preemptions == 3 and server.hit_rate == 0.1
    assert server.waiting_mean == 20 and server.waiting_max == 30 and server.kv_usage_max == 0.45
    assert snap.runs[1].lengths is None and snap.runs[1].server is None


def test_runs_cost_the_same_queries_for_one_run_or_five(deployment):
    def queries() -> int:
        diagnosis_facts.clear_caches()
        with CaptureQueriesContext(connection) as seen:
            diagnosis.snapshot(deployment, live=False)
        return len(seen)

    logged_run(deployment)
    one = queries()
    for _ in range(4):
        logged_run(deployment)
    five = queries()
    assert five == one
    # A second evaluation reads no request log or point again: the finished runs are cached.
    with CaptureQueriesContext(connection) as again:
        diagnosis.snapshot(deployment, live=False)
    assert len(again) < five
    assert len(diagnosis.snapshot(deployment, live=False).runs) == 5


def test_only_the_newest_five_runs(deployment):
    for _ in range(7):
        make_finished_run(deployment)
    assert len(diagnosis.snapshot(deployment, live=False).runs) == 5


def test_a_replayed_traffic_sample_gives_the_traffic_lengths(deployment):
    from tests.factories import make_profile

    profile = make_profile(
        "traffic",
        spec={
            "stages": [],
            "prefix_len": 100,
            "replay": {"rows": [[i * 0.1, 200 + i, 50, 0 if i < 5 else None] for i in range(10)]},
        },
        source="replay",
    )
    make_finished_run(deployment, load_profile=profile)
    traffic = diagnosis.snapshot(deployment, live=False).traffic
    assert traffic.input_p99 == pytest.approx(208.91)
    assert traffic.shared_prefix_share == pytest.approx(500 / sum(200 + i for i in range(10)))


def test_no_traffic_sample_no_traffic_facts(deployment):
    assert diagnosis.snapshot(deployment, live=False).traffic is None


# --- the live scrape -----------------------------------------------------------------------
@pytest.fixture
def simulator():
    server = SimServer("vllm", ["--max-model-len", "8192", "--time-scale", "0.2"])
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_the_engine_is_scraped_live_from_a_real_simulator(simulator, settings):
    import httpx

    settings.ADVISOR_SCRAPE_SECONDS = 1.0
    host = make_host(address="127.0.0.1")
    d = make_deployment(host, port=simulator.port, model=simulator.model)
    body = {"model": simulator.model, "prompt": "hello " * 50, "max_tokens": 4}
    assert httpx.post(simulator.url + "/v1/completions", json=body, timeout=30).status_code == 200
    gathered = diagnosis_facts.gather(d, live=True)
    window = gathered.snapshot.engine
    assert gathered.engine_status == "live" and gathered.engine_error == ""
    assert window.source == "live" and window.seconds >= 0.9
    assert window.running_mean is not None and window.waiting_mean is not None
    assert window.kv_usage_mean is not None


def test_an_engine_that_does_not_answer_is_no_window_with_the_reason(settings):
    settings.ADVISOR_SCRAPE_SECONDS = 0.5
    d = make_deployment(make_host(address="127.0.0.1"), port=free_port())
    gathered = diagnosis_facts.gather(d, live=True)
    assert gathered.snapshot.engine is None
    assert gathered.engine_status == "unavailable"
    assert "ConnectError" in gathered.engine_error and "/metrics" in gathered.engine_error


def test_sglang_without_metrics_says_so_without_asking():
    d = make_deployment(engine="sglang", model="Qwen/Qwen2.5-7B-Instruct")
    d.active_config = make_config(d, {})
    d.save()
    window, why = diagnosis_facts.scrape_engine(d, 0.1)
    assert window is None and "--enable-metrics" in why


def test_the_registered_rules_read_a_gathered_snapshot(deployment):
    """The contract between the two halves: whatever rules are registered run on what the
    panel gathers (every fact type filled in) without tripping over a missing or odd one."""
    from changes.advisor.engine import evaluate

    logged_run(
        deployment,
        engine_config=deployment.active_config,
        summary={"errors_by_class": {"HTTP_4XX": 10}, "warmup_requests": 0},
        stages={"peak": {"completed": 90, "failed": 10, "p95_ttft_ms": 2500.0}},
        server={"available": True, "server_mean_queue_ms": 1800.0, "kv_cache_usage_max": 0.4},
    )
    snap = diagnosis.snapshot(deployment, live=False)
    for finding in evaluate(snap):
        assert finding.rule and finding.severity in ("critical", "warning", "info")
        assert finding.as_dict()["title"]


def test_a_run_faster_than_the_previous_config_under_the_same_load_is_questioned(deployment):
    """The panel tells the advisor which earlier run (same profile version, another config) a
    run beat, so errors-behind-speed can ask what the speed cost in errors."""
    from changes.advisor.engine import evaluate

    old_config = deployment.active_config
    profile = make_profile("same-load")
    before = make_finished_run(
        deployment,
        engine_config=old_config,
        load_profile=profile,
        ttft_p95_ms=900.0,
        completed=100,
        failed=0,
        error_rate=0.0,
    )
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    after = make_finished_run(
        deployment,
        engine_config=deployment.active_config,
        load_profile=profile,
        ttft_p95_ms=400.0,
        completed=90,
        failed=10,
        error_rate=0.1,
    )
    snap = diagnosis.snapshot(deployment, live=False)
    assert [r.faster_than for r in snap.runs] == [before.pk, None]
    found = [f for f in evaluate(snap) if f.rule == "errors-behind-speed"]
    assert found and f"reported faster than run {before.pk}" in found[0].seen
    assert found[0].evidence["run"] == after.pk
