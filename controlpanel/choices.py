"""Choices shared by every app. Each status has a badge colour (see base.css)."""

from django.db import models


class OperationStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"

    @property
    def colour(self) -> str:
        return OPERATION_COLOURS[self]

    @property
    def finished(self) -> bool:
        return self in (self.SUCCEEDED, self.FAILED, self.CANCELLED)


OPERATION_COLOURS = {
    OperationStatus.QUEUED: "grey",
    OperationStatus.RUNNING: "blue",
    OperationStatus.SUCCEEDED: "green",
    OperationStatus.FAILED: "red",
    OperationStatus.CANCELLED: "amber",
}
