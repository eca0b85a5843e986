"""Where a change stands, for the top of its page: its state in words, the pipeline's current
stage (step n of m) and, while a baseline or verification benchmark runs, that run's progress
and time left. Everything here is read from the rows each time, never from a one-shot flash, so
what the page says cannot outlive the state it describes."""

from __future__ import annotations

from django.utils import timezone

from benchmarks.models import BenchmarkRun, RunPoint
from changes.choices import ChangeState, Stage
from changes.models import ChangeRequest
from changes.rules import start_problem
from changes.services import stages as pipeline_stages

S = ChangeState

# The stages whose work is a benchmark run of the change, and the field holding that run.
BENCHMARK_STAGES = {Stage.BASELINE: "baseline_run", Stage.VERIFY: "verification_run"}


def _order() -> list[str]:
    return [stage.stage.value for stage in pipeline_stages.STAGES]


def headline(change: ChangeRequest) -> str:
    """The change's state as a sentence: what happens now, or how it ended."""
    state = change.state_choice
    if change.holds_lock:
        if change.rollback_requested:
            return "Rollback requested: the pipeline rolls back at its next step."
        if change.pipeline_heartbeat_at is None:
            return f"{state.label}: the pipeline is queued for a worker."
        if change.pipeline_alive():
            return f"{state.label}: the pipeline is running."
        return f"{state.label}: no heartbeat from the pipeline: resume it or roll back."
    if state == S.DRAFT:
        return "Draft: not submitted for review yet."
    if state == S.PENDING:
        if start_problem(change):
            return "Pending review, approval blocked: the engine is predicted not to start."
        count = change.approvals_count()
        return f"Waiting for review: {count} of {change.required_approvals} approvals."
    if state == S.APPROVED:
        return "Approved: ready to apply."
    return change.outcome or f"{state.label}."


def _elapsed(run: BenchmarkRun, now) -> float | None:
    return (now - run.started_at).total_seconds() if run.started_at else None


def time_left(run: BenchmarkRun, now=None) -> float | None:
    """Seconds left in a running benchmark: the run's own estimate at its newest point (its
    schedule and observed rate, as its page shows it) less the time since that point, else the
    planned duration less the time elapsed; None when neither is known."""
    now = now or timezone.now()
    elapsed = _elapsed(run, now)
    point = RunPoint.objects.filter(run=run).order_by("-t").values_list("t", "data").first()
    if point is not None and elapsed is not None:
        t, data = point
        eta = data.get("eta_s")
        if isinstance(eta, int | float):
            return max(0.0, eta - max(0.0, elapsed - t))
    if run.planned_duration_s and elapsed is not None:
        return max(0.0, run.planned_duration_s - elapsed)
    return None


def benchmark(change: ChangeRequest, stage: str) -> dict | None:
    """The benchmark the current stage is running (queued or running), with its progress."""
    if stage == Stage.COMPARE:
        # An extra verification run, measured when the noise was too wide to judge.
        run = change.extra_runs.order_by("-pk").first()
        spent = change.extra_runs.count()
        purpose = f"extra verification ({spent} of up to {change.max_extra_runs})"
    else:
        try:
            field = BENCHMARK_STAGES[Stage(stage)]
        except (KeyError, ValueError):
            return None
        run_id = getattr(change, f"{field}_id")
        run = BenchmarkRun.objects.filter(pk=run_id).first() if run_id is not None else None
        purpose = "baseline" if field == "baseline_run" else "verification"
    if run is None or run.is_finished:
        return None
    now = timezone.now()
    return {
        "run": run,
        "purpose": purpose,
        "percent": round(100 * (run.progress or 0.0)),
        "elapsed_s": _elapsed(run, now),
        "planned_s": run.planned_duration_s,
        "left_s": time_left(run, now),
    }


def progress(change: ChangeRequest) -> dict:
    """What the progress block at the top of the change page shows."""
    order = _order()
    stage = change.stage if change.holds_lock else ""
    step = order.index(stage) + 1 if stage in order else None
    return {
        "headline": headline(change),
        "running": change.holds_lock,
        "stage": Stage(stage).label if stage in Stage.values else "",
        "step": step,
        "steps": len(order),
        "step_percent": round(100 * step / len(order)) if step else 0,
        "benchmark": benchmark(change, stage) if stage else None,
    }
