"""Choices of the changes app; states and outcomes declare their badge colour
(``ColouredChoices``)."""

from django.db import models

from controlpanel.choices import ColouredChoices


class ChangeState(ColouredChoices):
    DRAFT = "draft", "Draft", "grey"
    PENDING = "pending", "Pending review", "amber"
    APPROVED = "approved", "Approved", "blue"
    REJECTED = "rejected", "Rejected", "red"
    WITHDRAWN = "withdrawn", "Withdrawn", "grey"
    APPLYING = "applying", "Applying", "blue"
    VERIFYING = "verifying", "Verifying", "blue"
    APPLIED = "applied", "Applied", "green"
    # Applied and healthy, but the verification could not be compared with the baseline
    # (different conditions, too few requests): kept, marked and notified, never "applied".
    UNVERIFIED = "unverified", "Applied, not verified", "amber"
    ROLLED_BACK = "rolled_back", "Rolled back", "amber"
    FAILED = "failed", "Failed", "red"

    @property
    def finished(self) -> bool:
        return self in FINISHED_STATES

    @property
    def in_review(self) -> bool:
        return self in REVIEW_STATES


FINISHED_STATES = frozenset(
    {
        ChangeState.REJECTED,
        ChangeState.WITHDRAWN,
        ChangeState.APPLIED,
        ChangeState.UNVERIFIED,
        ChangeState.ROLLED_BACK,
        ChangeState.FAILED,
    }
)
# Before apply: the running config may move under these, which makes them stale.
REVIEW_STATES = frozenset({ChangeState.DRAFT, ChangeState.PENDING, ChangeState.APPROVED})
# The deployment's lock: at most one change per deployment in these (a partial unique index).
LOCK_STATES = (ChangeState.APPLYING, ChangeState.VERIFYING)


class ChangeKind(models.TextChoices):
    SETTINGS = "settings", "Settings change"
    ROLLBACK = "rollback", "Rollback to an earlier version"


# A reviewer's decision: the workflows' one (a change's, a sweep's, a first start's).
from controlpanel.workflow import Decision  # noqa: E402, F401


class Stage(models.TextChoices):
    """The steps of the apply pipeline, in the order they run, as the timeline shows them."""

    SNAPSHOT = "snapshot", "Snapshot current config"
    PREPARE = "prepare", "Restart before the baseline"
    BASELINE = "baseline", "Baseline benchmark"
    APPLY = "apply", "Apply config"
    RESTART = "restart", "Restart engine"
    HEALTH = "health", "Health check"
    VERIFY = "verify", "Verification benchmark"
    COMPARE = "compare", "Compare with baseline"
    QUALITY_BASELINE = "quality_baseline", "Quality probe before"
    QUALITY = "quality", "Quality probe after"
    ROLLBACK = "rollback", "Roll back"
    DONE = "done", "Done"


class StageStatus(ColouredChoices):
    STARTED = "started", "Started", "blue"
    SUCCEEDED = "succeeded", "Succeeded", "green"
    FAILED = "failed", "Failed", "red"
    SKIPPED = "skipped", "Skipped", "grey"
    INCONCLUSIVE = "inconclusive", "Inconclusive", "amber"


class SweepState(ColouredChoices):
    """A tuning sweep's life: predicted at once (it touches nothing), reviewed when a
    production-labelled host takes part, then its trials run on the deployments."""

    PREDICTING = "predicting", "Predicting", "blue"
    PENDING = "pending", "Pending review", "amber"
    READY = "ready", "Ready to run", "blue"
    RUNNING = "running", "Running trials", "blue"
    DONE = "done", "Done", "green"
    FAILED = "failed", "Failed", "red"
    CANCELLED = "cancelled", "Cancelled", "amber"
    REJECTED = "rejected", "Rejected", "red"

    @property
    def finished(self) -> bool:
        return self in (self.DONE, self.FAILED, self.CANCELLED, self.REJECTED)


class TrialState(ColouredChoices):
    QUEUED = "queued", "Queued", "grey"
    RUNNING = "running", "Running", "blue"
    SUCCEEDED = "succeeded", "Measured", "green"
    FAILED = "failed", "Failed", "red"
    CANCELLED = "cancelled", "Cancelled", "amber"
    SKIPPED = "skipped", "Skipped", "grey"

    @property
    def finished(self) -> bool:
        return self not in (self.QUEUED, self.RUNNING)


class LaneState(ColouredChoices):
    """One deployment's part in a sweep: it runs trials, then gets its config back."""

    PLANNED = "planned", "Planned", "grey"
    QUEUED = "queued", "Queued", "grey"
    RUNNING = "running", "Running trials", "blue"
    # Its original config could not be put back because the host did not answer: retried
    # with backoff until it does (controlpanel.lostwork), the deployment held meanwhile.
    RESTORE_PENDING = "restore_pending", "Restore pending", "amber"
    RESTORED = "restored", "Config restored", "green"
    FAILED = "failed", "Restore failed", "red"


# A deployment taking part in a sweep in these lane states is held by it (partial unique index).
LANE_LOCK_STATES = (LaneState.QUEUED, LaneState.RUNNING, LaneState.RESTORE_PENDING)


class VersionOutcome(ColouredChoices):
    """How a config version ended, read from the operations and changes that applied it
    (``changes.services.config_history``). Only a version that ran healthy and was kept is
    a sound place to go back to."""

    RUNNING = "running", "Running now", "green"
    GOOD = "good", "Was good", "green"
    APPLYING = "applying", "Being applied", "blue"
    ROLLED_BACK = "rolled_back", "Rolled back", "amber"
    FAILED = "failed", "Failed to start", "red"
    NEVER = "never", "Never applied", "grey"

    @property
    def rollback_target(self) -> bool:
        """The one rule for "Propose rollback to this version": the button and the service
        that creates the proposal both ask it."""
        return self == VersionOutcome.GOOD
