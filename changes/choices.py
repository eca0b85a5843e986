"""Choices of the changes app, each with a badge colour (see panel.css)."""

from django.db import models


class ChangeState(models.TextChoices):
    DRAFT = "draft", "Draft"
    PENDING = "pending", "Pending review"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    WITHDRAWN = "withdrawn", "Withdrawn"
    APPLYING = "applying", "Applying"
    VERIFYING = "verifying", "Verifying"
    APPLIED = "applied", "Applied"
    ROLLED_BACK = "rolled_back", "Rolled back"
    FAILED = "failed", "Failed"

    @property
    def colour(self) -> str:
        return STATE_COLOURS[self]

    @property
    def finished(self) -> bool:
        return self in FINISHED_STATES

    @property
    def in_review(self) -> bool:
        return self in REVIEW_STATES


STATE_COLOURS = {
    ChangeState.DRAFT: "grey",
    ChangeState.PENDING: "amber",
    ChangeState.APPROVED: "blue",
    ChangeState.REJECTED: "red",
    ChangeState.WITHDRAWN: "grey",
    ChangeState.APPLYING: "blue",
    ChangeState.VERIFYING: "blue",
    ChangeState.APPLIED: "green",
    ChangeState.ROLLED_BACK: "amber",
    ChangeState.FAILED: "red",
}
FINISHED_STATES = frozenset(
    {
        ChangeState.REJECTED,
        ChangeState.WITHDRAWN,
        ChangeState.APPLIED,
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


class Decision(models.TextChoices):
    APPROVE = "approve", "Approved"
    REJECT = "reject", "Rejected"

    @property
    def colour(self) -> str:
        return "green" if self == Decision.APPROVE else "red"


class Stage(models.TextChoices):
    """The steps of the apply pipeline, in the order they run, as the timeline shows them."""

    SNAPSHOT = "snapshot", "Snapshot current config"
    BASELINE = "baseline", "Baseline benchmark"
    APPLY = "apply", "Apply config"
    RESTART = "restart", "Restart engine"
    HEALTH = "health", "Health check"
    VERIFY = "verify", "Verification benchmark"
    COMPARE = "compare", "Compare with baseline"
    ROLLBACK = "rollback", "Roll back"
    DONE = "done", "Done"


class StageStatus(models.TextChoices):
    STARTED = "started", "Started"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"

    @property
    def colour(self) -> str:
        return {
            StageStatus.STARTED: "blue",
            StageStatus.SUCCEEDED: "green",
            StageStatus.FAILED: "red",
            StageStatus.SKIPPED: "grey",
        }[self]
