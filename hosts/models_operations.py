"""The background operations on hosts and deployments (``BackgroundOperation`` rows a Celery
task works on): a host's connection check, and an apply or restart of a deployment's engine."""

from __future__ import annotations

from django.db import models

from controlpanel.models import BackgroundOperation
from hosts.choices import CheckOutcome, OperationKind, OperationOutcome
from hosts.models import Deployment, EngineConfig, Host


class HostCheck(BackgroundOperation):
    """A reachability check of a host's transport port, run by a Celery worker.

    Operators start one from the host page; the scheduler runs one per host periodically.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="checks")
    reachable = models.BooleanField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    detail = models.CharField(max_length=300, blank=True)
    outcome = models.CharField(max_length=16, choices=CheckOutcome.choices, blank=True)

    class Meta(BackgroundOperation.Meta):
        pass

    def __str__(self) -> str:
        return f"check of {self.host.name} #{self.pk}"

    @property
    def outcome_choice(self) -> CheckOutcome | None:
        return CheckOutcome(self.outcome) if self.outcome else None

    def as_event(self) -> dict:
        return {
            "id": self.pk,
            "host": self.host_id,
            "status": self.status,
            "reachable": self.reachable,
            "latency_ms": self.latency_ms,
            "detail": self.detail,
            "outcome": self.outcome,
            "error": self.error,
        }


class EngineOperation(BackgroundOperation):
    """Applying a config to a deployment's engine, or restarting it, run by a Celery worker.

    One at a time per deployment: the database refuses a second queued or running row (the
    partial unique constraint), and the service takes a row lock on the deployment before it
    looks. A failed apply leaves the deployment on its last good config; ``outcome`` and
    ``engine_log`` say what the engine did (its own error lines).
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="operations")
    kind = models.CharField(max_length=16, choices=OperationKind.choices)
    config = models.ForeignKey(
        EngineConfig,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="operations",
        help_text="The config being applied (restart: the one that was running).",
    )
    previous_config = models.ForeignKey(
        EngineConfig,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The last good config, to roll back to.",
    )
    outcome = models.CharField(max_length=16, choices=OperationOutcome.choices, blank=True)
    engine_log = models.TextField(blank=True, help_text="The engine's own last output lines.")
    note = models.CharField(
        max_length=200,
        blank=True,
        help_text="Why it ran, when more than a plain apply: a rollback says so, and why.",
    )
    host_unreachable = models.BooleanField(
        default=False,
        help_text="It failed because the host did not answer (nothing reached the engine).",
    )

    class Meta(BackgroundOperation.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(status__in=["queued", "running"]),
                name="engineoperation_one_active_per_deployment",
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} on {self.deployment} #{self.pk}"

    @property
    def outcome_choice(self) -> OperationOutcome | None:
        return OperationOutcome(self.outcome) if self.outcome else None

    def as_event(self) -> dict:
        return {
            "id": self.pk,
            "deployment": self.deployment_id,
            "kind": self.kind,
            "status": self.status,
            "outcome": self.outcome,
            "error": self.error,
        }
