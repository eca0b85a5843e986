"""The quality probe as pipeline stages, for a change that touches what the model answers
(another model, its dtype, its quantisation, the KV cache's precision: ``Flag.affects_answers``):
the change's probe set asked of the running config before the apply (``QualityBaseline``) and
of the new one after it (``QualityVerify``), compared item by item; a loss beyond the change's
threshold at 95 % confidence rolls the change back, with the table on the timeline, and a
comparison that cannot tell leaves it applied but not verified.
"""

from __future__ import annotations

from django.urls import reverse

from benchmarks.models import ProbeRun
from benchmarks.services import probes
from changes.choices import Stage, StageStatus
from changes.models import ChangeRequest
from changes.services.quality import PROBE_CONCURRENCY, PROBE_FIELDS
from changes.services.stage_base import (
    PipelineStage,
    RollbackRequested,
    StageFailed,
    rollback_asked,
)
from controlpanel.choices import OperationStatus


def run_probe(change: ChangeRequest, purpose: str) -> tuple[ProbeRun | None, str]:
    """Ask the change's probe set of its deployment now, inline on this worker (an ordinary
    probe run: its page shows it). ``(run, "")`` or ``(None, why it could not start)``."""
    field = PROBE_FIELDS[purpose]
    earlier = getattr(change, field)
    if earlier is not None and not earlier.is_finished:
        probes.fail_probe(earlier, "the change's pipeline stopped during the probe")
    try:
        run = probes.start_probe(
            change.applied_by,
            change.deployment,
            change.probe_set,
            concurrency=PROBE_CONCURRENCY,
            label=f"change #{change.pk} quality {purpose}",
            enqueue=False,
            owner=change,
        )
    except probes.ProbeRefused as exc:
        return None, f"the quality probe could not start: {exc}"
    setattr(change, field, run)
    change.save(update_fields=[field])
    try:
        probes.execute_probe(
            ProbeRun.objects.select_related("deployment__host", "probe_set").get(pk=run.pk)
        )
    except Exception as exc:  # noqa: BLE001 - recorded on the run, judged by the stage
        probes.fail_probe(run, f"{type(exc).__name__}: {exc}")
    run.refresh_from_db()
    return run, ""


def _measure(stage: PipelineStage, change: ChangeRequest, purpose: str, *, rollback: bool):
    stage.record(
        change,
        StageStatus.STARTED,
        f"{change.probe_set} ({change.probe_set.item_count} items, {PROBE_CONCURRENCY} at a time)",
    )
    run, refused = run_probe(change, purpose)
    if rollback and rollback_asked(change):
        raise RollbackRequested("a rollback was requested during the quality probe")
    if run is None or run.status != OperationStatus.SUCCEEDED:
        message = refused or f"the {purpose} quality probe {run.status}: {run.error}"
        reason = message if rollback else message + " Nothing was changed."
        link = run.get_absolute_url() if run is not None else ""
        raise StageFailed(message, rollback=rollback, reason=reason, link=link)
    return run


def accuracy_text(run: ProbeRun) -> str:
    overall = (run.summary or {}).get("overall") or {}
    if not overall.get("n"):
        return "no scored items"
    text = f"{overall['accuracy']:.1%} of {overall['n']} items right"
    return text + (" (simulated engine)" if run.simulated else "")


class QualityBaseline(PipelineStage):
    """The probe set on the running config, before anything changes."""

    stage = Stage.QUALITY_BASELINE

    def is_done(self, change):
        if not change.probe_set_id or change.applied_config_id is not None:
            return True
        run = change.quality_baseline
        return run is not None and run.status == OperationStatus.SUCCEEDED

    def run(self, change):
        run = _measure(self, change, "baseline", rollback=False)
        self.record(change, StageStatus.SUCCEEDED, accuracy_text(run), link=run.get_absolute_url())


class QualityVerify(PipelineStage):
    """The probe set on the new config, compared item by item with the baseline: a loss
    rolls the change back; "cannot tell" leaves it applied, not verified (``Done``)."""

    stage = Stage.QUALITY

    def is_done(self, change):
        return not change.probe_set_id or bool(change.quality_comparison)

    def run(self, change):
        run = change.quality_run
        if run is None or run.status != OperationStatus.SUCCEEDED:
            run = _measure(self, change, "candidate", rollback=True)
        result = probes.compare_runs(change.quality_baseline, run, max_loss=change.max_quality_loss)
        result["change_verdict"] = verdict = probes.quality_verdict(result)
        change.quality_comparison = result
        change.save(update_fields=["quality_comparison"])
        link = reverse("benchmarks:probe_compare", args=[change.quality_baseline.pk, run.pk])
        table = probes.comparison_table(result)
        if verdict["verdict"] == "loss":
            raise StageFailed(
                f"quality regression: {verdict['reason']}",
                rollback=True,
                reason=f"the quality probe found a loss: {verdict['reason']}",
                detail=table,
                link=link,
            )
        status = (
            StageStatus.INCONCLUSIVE
            if verdict["verdict"] == "cannot tell"
            else StageStatus.SUCCEEDED
        )
        self.record(
            change,
            status,
            f"{accuracy_text(run)}; {verdict['text']}",
            detail=table,
            link=link,
        )
