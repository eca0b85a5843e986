"""What every stage of the apply pipeline is made of (``changes.services.stages`` lists them,
``stages_quality`` adds the quality probes): the stage's interface, the failures it raises,
and measuring the change's profile as a stage. Below both, so neither imports the other."""

from __future__ import annotations

from abc import ABC, abstractmethod

from benchmarks.models import BenchmarkRun
from changes.choices import Stage, StageStatus
from changes.models import ChangeRequest
from changes.services import verification
from changes.services.timeline import record_stage
from controlpanel.choices import OperationStatus

WHILE_APPLYING = "a rollback was requested while the change was being applied"


class StageFailed(Exception):
    """A stage could not complete. ``message`` goes on the stage's timeline entry (with
    ``detail`` and ``link``); ``reason`` (the message by default) is the change's outcome.
    ``rollback``: put the snapshot config back; otherwise nothing was changed on the host."""

    def __init__(
        self,
        message: str,
        *,
        rollback: bool,
        reason: str | None = None,
        detail: str = "",
        link: str = "",
    ):
        super().__init__(message)
        self.message, self.rollback = message, rollback
        self.reason = reason or message
        self.detail, self.link = detail, link


class RollbackRequested(Exception):
    """Someone asked for a rollback (``ChangeRequest.rollback_requested``); the message is
    the outcome to record."""


class PipelineStage(ABC):
    """One step. ``stage`` is its name on the timeline; ``rollback_reason`` is the outcome
    when a rollback request is found before it runs (None: don't look before this one)."""

    stage: Stage
    rollback_reason: str | None = WHILE_APPLYING

    @abstractmethod
    def is_done(self, change: ChangeRequest) -> bool:
        """True when this step has nothing left to do for ``change`` (resume skips it)."""

    @abstractmethod
    def run(self, change: ChangeRequest) -> None:
        """Do the step, recording it; raise ``StageFailed`` when it cannot complete."""

    def record(self, change: ChangeRequest, status: StageStatus, message: str = "", **extra):
        record_stage(change, self.stage, status, message, **extra)

    def measure(self, change: ChangeRequest, purpose: str, *, rollback: bool) -> BenchmarkRun:
        """Run the change's profile as this step, recording its start and its numbers."""
        self.record(change, StageStatus.STARTED, str(change.verify_profile))
        run = measure_profile(change, purpose, rollback=rollback)
        link = verification.link(run)
        self.record(change, StageStatus.SUCCEEDED, verification.run_numbers_text(run), link=link)
        return run


def succeeded(run: BenchmarkRun | None) -> bool:
    return run is not None and run.status == OperationStatus.SUCCEEDED


def measure_profile(change: ChangeRequest, purpose: str, *, rollback: bool) -> BenchmarkRun:
    """Run the change's profile now; a run that cannot start or does not succeed fails the
    stage. A rollback asked for during the run wins over judging it."""
    run, refused = verification.run_benchmark(change, purpose)
    if rollback and rollback_asked(change):
        raise RollbackRequested("a rollback was requested during the verification")
    if not succeeded(run):
        message = refused or f"the {purpose} benchmark {run.status}: {run.error}"
        reason = message if rollback else message + " Nothing was changed."
        raise StageFailed(message, rollback=rollback, reason=reason, link=verification.link(run))
    return run


def rollback_asked(change: ChangeRequest) -> bool:
    change.refresh_from_db(fields=["rollback_requested"])
    return change.rollback_requested
