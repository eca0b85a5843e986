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


class Decision(ColouredChoices):
    APPROVE = "approve", "Approved", "green"
    REJECT = "reject", "Rejected", "red"


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
    ROLLBACK = "rollback", "Roll back"
    DONE = "done", "Done"


class StageStatus(ColouredChoices):
    STARTED = "started", "Started", "blue"
    SUCCEEDED = "succeeded", "Succeeded", "green"
    FAILED = "failed", "Failed", "red"
    SKIPPED = "skipped", "Skipped", "grey"
    INCONCLUSIVE = "inconclusive", "Inconclusive", "amber"
