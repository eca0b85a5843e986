"""Cross-cutting models: the audit log and the base of every background operation."""

from __future__ import annotations

from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from controlpanel.choices import OperationStatus


class InvalidTransition(Exception):
    """A status change that the object's state machine does not allow."""


class BackgroundOperation(models.Model):
    """Base for every row that a Celery task works on: status, timestamps, log and error.

    The task receives only the primary key; what happened is written back here, so a page
    (or a colleague tomorrow) can always tell how an operation went, including its failure.
    """

    TRANSITIONS = {
        OperationStatus.QUEUED: {
            OperationStatus.RUNNING,
            OperationStatus.CANCELLED,
            OperationStatus.FAILED,
        },
        OperationStatus.RUNNING: {
            OperationStatus.SUCCEEDED,
            OperationStatus.FAILED,
            OperationStatus.CANCELLED,
        },
    }

    status = models.CharField(
        max_length=16,
        choices=OperationStatus.choices,
        default=OperationStatus.QUEUED,
        db_index=True,
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Empty when the scheduler started it.",
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    log = models.TextField(blank=True)
    error = models.TextField(blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-pk"]

    @property
    def status_choice(self) -> OperationStatus:
        return OperationStatus(self.status)

    @property
    def is_finished(self) -> bool:
        return self.status_choice.finished

    @property
    def duration(self):
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None

    def transition_to(self, status: OperationStatus, *, error: str = "") -> None:
        """Move to ``status`` if the state machine allows it, stamping times; saves the row."""
        allowed = self.TRANSITIONS.get(OperationStatus(self.status), set())
        if status not in allowed:
            raise InvalidTransition(f"{self.status} → {status} is not allowed")
        now = timezone.now()
        self.status = status
        fields = ["status"]
        if status == OperationStatus.RUNNING:
            self.started_at = now
            fields.append("started_at")
        if status.finished:
            self.finished_at = now
            fields.append("finished_at")
        if error:
            self.error = error
            fields.append("error")
        self.save(update_fields=fields)

    def append_log(self, line: str) -> None:
        stamp = timezone.now().strftime("%H:%M:%S")
        self.log = f"{self.log}{stamp} {line}\n"
        self.save(update_fields=["log"])


class AuditEntry(models.Model):
    """One change someone (or the system) made: who, what, when, to which object, before/after.

    Written by the service functions of every app through ``controlpanel.services.audit``;
    never edited. ``actor_name`` and ``object_repr`` are snapshots so the history stays
    readable after the user or the object is deleted.
    """

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="audit_entries",
    )
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64, db_index=True, help_text="e.g. host.create")
    content_type = models.ForeignKey(ContentType, null=True, blank=True, on_delete=models.SET_NULL)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    after = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    # How the actor reached the panel when it was not a browser session: "token NAME" for a
    # write through the API with one of their tokens.
    via = models.CharField(max_length=160, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["content_type", "object_id"])]

    def __str__(self) -> str:
        who = self.actor_name or "system"
        return f"{self.created_at:%Y-%m-%d %H:%M} {who} {self.action} {self.object_repr}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("Audit entries are append-only.")
        super().save(*args, **kwargs)

    @property
    def changed_fields(self) -> list[str]:
        before, after = self.before or {}, self.after or {}
        keys = sorted(set(before) | set(after))
        return [k for k in keys if before.get(k) != after.get(k)]


class WorkClaim(models.Model):
    """A worker's claim on one long job while it runs (``controlpanel.lostwork``): which row
    (``kind`` is its model's label, ``object_id`` its key), which worker, and the heartbeat
    it stamps every few seconds. A claim whose heartbeat stopped belongs to a lost worker:
    the lost-work sweep ends its job truthfully, and a cancel ends it at once. Deleted when
    the job's task returns, whatever happened."""

    kind = models.CharField(max_length=64)
    object_id = models.BigIntegerField()
    owner = models.CharField(max_length=200, help_text="The worker (host, process, thread).")
    claimed_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "object_id"], name="workclaim_one_per_job")
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.object_id} on {self.owner}"
