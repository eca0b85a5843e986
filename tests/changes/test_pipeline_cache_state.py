"""Issue 14 item 11, the pipeline's side: a harmless change was rolled back for a "+1489 % TTFT
p95 regression" because its fresh baseline ran on a warm engine (98.6 % prefix-cache hits,
the same prompts as an earlier run) and its verification right after the restart (0 %).

Here the engine is a fake with a prefix cache: a run on a warm engine is served from it
(fast TTFT, high hit rate), a restart empties it. The baseline now starts from a restart, as
the verification does, and the verdict compares the runs' conditions: when they still differ
(a chosen baseline that ran warm) it is inconclusive — applied, marked not verified, notified
— never a regression. The same against a real agent and simulator:
``test_pipeline_cache_state_agent.py``."""

from __future__ import annotations

from unittest import mock

import pytest
from django.urls import reverse

from changes.models import ChangeRequest
from changes.notify import message
from changes.services import apply as change_apply
from changes.services import pipeline, review, verification
from controlpanel.models import AuditEntry
from hosts.models import EngineOperation
from hosts.services import operations as host_operations
from hosts.transport.base import ApplyOutcome
from tests.factories import make_config, make_deployment, make_finished_run, make_host, make_profile

pytestmark = pytest.mark.django_db

COLD_TTFT, WARM_TTFT = 470.0, 29.6  # ms: +1489 % from warm to cold


class CachingEngine:
    """A host whose engine keeps a prefix cache: every apply or restart empties it, every
    benchmark fills it (the same profile sends the same prompts)."""

    def __init__(self):
        self.warm = False
        self.restarts = 0
        self.applied: list[dict] = []

    # --- the transport -------------------------------------------------------------------------
    def apply_config(self, name, launch, *, previous, ready_timeout_s):
        self.applied.append(launch.settings)
        self.warm = False
        return ApplyOutcome("ready")

    def restart_engine(self, name, *, ready_timeout_s):
        self.restarts += 1
        self.warm = False
        return ApplyOutcome("ready")

    def engine_status(self, name):
        return {"name": name, "state": "ready"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    # --- a benchmark ---------------------------------------------------------------------------
    def measure(self, deployment, profile, **kw):
        hits = 0.986 if self.warm else 0.0
        run = make_finished_run(
            deployment,
            load_profile=profile,
            ttft_p95_ms=WARM_TTFT if self.warm else COLD_TTFT,
            server={"available": True, "prefix_cache_hit_rate": hits, "kv_cache_usage_max": 0.3},
            **kw,
        )
        self.warm = True
        return run

    def run_benchmark(self, change, purpose):
        run = self.measure(change.deployment, change.verify_profile)
        field = verification.BENCHMARK_FIELDS[purpose]
        setattr(change, field, run)
        change.save(update_fields=[field])
        return run, ""


@pytest.fixture
def engine(monkeypatch, settings):
    settings.CHANGE_HEARTBEAT_SECONDS = 3600
    fake = CachingEngine()
    monkeypatch.setattr("hosts.services.operations.transport_for", lambda h, d=None: fake)
    monkeypatch.setattr("hosts.services.transports.transport_for", lambda h, d=None: fake)
    monkeypatch.setattr(verification, "health_problem", lambda deployment, config=None: None)
    monkeypatch.setattr(verification, "run_benchmark", fake.run_benchmark)
    return fake


@pytest.fixture
def deployment(db, engine):
    """A deployment running v1, started through the panel, warmed by an earlier run of the
    profile the changes verify with."""
    deployment = make_deployment(make_host())
    config = make_config(deployment, {"max_num_seqs": 64, "gpu_memory_utilization": 0.9})
    operation = host_operations.request_operation(None, deployment, "apply", config, enqueue=False)
    host_operations.run_operation(EngineOperation.objects.get(pk=operation.pk))
    deployment.refresh_from_db()
    assert deployment.active_config == config
    return deployment


@pytest.fixture
def profile():
    return make_profile("chat")


def apply(operator, approver, deployment, profile, before_pipeline=None, **kw) -> ChangeRequest:
    change = review.propose_change(
        operator,
        deployment,
        title="A harmless change",
        rationale="Logs less.",
        settings={**deployment.active_config.settings, "max_num_seqs": 65},
        verify_profile=profile,
        **kw,
    )
    review.approve_change(approver, change)
    with mock.patch("changes.tasks.apply_change.apply_async"):
        change_apply.apply_change(operator, ChangeRequest.objects.get(pk=change.pk))
    if before_pipeline:
        before_pipeline()
    return pipeline.run_pipeline(change.pk, "worker-1")


def steps(change) -> list[tuple[str, str]]:
    rows = AuditEntry.objects.filter(object_id=str(change.pk), action="change.stage").order_by("pk")
    return [(e.after["stage"], e.after["status"]) for e in rows]


def test_a_fresh_baseline_on_a_warm_engine_no_longer_rolls_a_harmless_change_back(
    operator, approver, deployment, profile, engine
):
    """The issue's scenario. The earlier run left the engine warm; the change's baseline is
    now taken after a restart, cold like the verification, and the change is verified."""
    engine.measure(deployment, profile)  # an earlier run: the same prompts are now cached
    assert engine.warm

    change = apply(operator, approver, deployment, profile)

    assert change.state == "applied", change.outcome
    assert change.comparison["outcome"] == "verified"
    assert engine.restarts == 1  # before the baseline
    assert ("prepare", "succeeded") in steps(change)
    baseline, after = change.baseline_run, change.verification_run
    assert baseline.ttft_p95_ms == after.ttft_p95_ms == COLD_TTFT
    assert verification.cache_state(baseline) == verification.cache_state(after) == "cold"
    rows = {row["key"]: row for row in change.comparison["conditions"]}
    assert rows["prefix_cache_hit_rate"]["baseline"] == rows["prefix_cache_hit_rate"]["after"]


def test_a_chosen_baseline_that_ran_warm_gives_no_verdict_and_is_not_a_regression(
    operator, approver, deployment, profile, engine, client, viewer, settings
):
    """A baseline picked from the history ran on a warm engine: the conditions comparison is
    what protects the verdict. The change stays applied, marked not verified, and says why."""
    engine.measure(deployment, profile)  # warms the engine
    warm = engine.measure(deployment, profile)  # 98.6 % hits, 29.6 ms
    assert verification.cache_state(warm) == "warm"

    change = apply(operator, approver, deployment, profile, baseline_run=warm)

    assert change.state == "unverified", change.outcome
    assert change.get_state_display() == "Applied, not verified"
    assert engine.restarts == 0  # the chosen baseline is used as it is
    assert change.comparison["outcome"] == "inconclusive"
    assert not change.comparison["regressed"]
    assert "baseline ran with 98.6% prefix-cache hits, verification with 0.0%" in change.outcome
    assert "not verified" in change.outcome and "within limits" not in change.outcome
    assert ("compare", "inconclusive") in steps(change)
    assert change.deployment.active_config == change.applied_config  # kept, not rolled back

    subject, text = message(change, change.state_choice)
    assert "NOT verified" in subject and "prefix-cache hits" in text

    client.force_login(viewer)
    page = client.get(reverse("changes:detail", args=[change.pk])).content.decode()
    assert 'data-verdict="inconclusive"' in page
    assert "within limits" not in page.split('data-testid="comparison"')[0].split("Verdict")[-1]
    assert 'data-condition="prefix_cache_hit_rate"' in page and "98.6 %" in page


def test_a_chosen_baseline_above_its_error_threshold_is_replaced_by_a_fresh_one(
    operator, approver, deployment, profile, engine
):
    """A baseline that failed most of its requests but was recorded "succeeded" (before
    runs stopped on errors) is never used: a fresh one is measured, from a restart."""
    broken = make_finished_run(
        deployment, load_profile=profile, completed=100, failed=1234, error_rate=0.925
    )

    change = apply(operator, approver, deployment, profile, baseline_run=broken)

    assert change.baseline_run != broken
    assert change.state == "applied", change.outcome
    assert engine.restarts == 1
    skipped = [
        e.after["message"]
        for e in AuditEntry.objects.filter(object_id=str(change.pk), action="change.stage")
        if e.after["stage"] == "baseline" and e.after["status"] == "skipped"
    ]
    assert skipped and "cannot be the baseline" in skipped[0]


def test_a_refused_restart_before_the_baseline_changes_nothing(
    operator, approver, deployment, profile, engine
):
    def someone_restarts():
        EngineOperation.objects.create(
            deployment=deployment, kind="restart", config=deployment.active_config, status="running"
        )

    change = apply(operator, approver, deployment, profile, before_pipeline=someone_restarts)

    assert change.state == "failed" and change.outcome.endswith("Nothing was changed.")
    assert steps(change)[-1] == ("prepare", "failed")
    assert engine.applied == [{"max_num_seqs": 64, "gpu_memory_utilization": 0.9}]


def test_a_restart_before_the_baseline_that_fails_says_the_engine_needs_attention(
    operator, approver, deployment, profile, engine, monkeypatch
):
    monkeypatch.setattr(
        engine, "restart_engine", lambda name, **kw: ApplyOutcome("failed", error="CUDA OOM")
    )
    change = apply(operator, approver, deployment, profile)

    assert change.state == "failed"
    assert "the restart of v1 before the baseline failed: CUDA OOM" in change.outcome
    assert change.applied_config is None and change.baseline_run is None


def request(index: int, ttft_s: float | None) -> dict:
    """One measured request as the load generator records it (failed when ``ttft_s`` is
    None)."""
    sent = 1.0 + index
    first = None if ttft_s is None else sent + ttft_s
    return {
        "index": index,
        "stage": "main",
        "warmup": False,
        "input_len": 512,
        "max_tokens": 2,
        "prompt_tokens": 510,
        "output_tokens": 0 if first is None else 2,
        "token_source": "usage",
        "scheduled": sent,
        "sent": sent,
        "first_token": first,
        "end": sent + 0.5 if first is None else first + 0.01,
        "chunk_times": [] if first is None else [first, first + 0.01],
        "status": 500 if first is None else 200,
        "error_class": "http_500" if first is None else None,
        "error": "boom" if first is None else "",
        "prefix_id": None,
    }


def test_the_ttft_noise_band_is_read_from_the_runs_request_log(deployment, profile):
    from benchmarks import records
    from benchmarks.models import RunRequestLog

    run = make_finished_run(deployment, load_profile=profile)
    assert verification.ttft_p95_band(run) is None  # no request log: no band
    # 100 successful requests at 101..200 ms, and failed ones that have no TTFT.
    logged = [request(i, (101 + i) / 1000) for i in range(100)]
    logged += [request(100 + i, None) for i in range(5)]
    RunRequestLog.objects.create(run=run, count=len(logged), data=records.encode(logged))
    low, high = verification.ttft_p95_band(run)
    assert (round(low), round(high)) == (191, 200)
