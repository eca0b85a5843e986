"""What the advisor found on a deployment, kept: one row per problem while it lasts.

A finding is opened the first time a rule sees the problem, touched (``last_seen_at``, the
fresh evidence) each time it sees it again, and closed (``cleared_at``) the first evaluation
that no longer sees it. A later reappearance opens a new row, so the history of a problem is
the list of its rows. Dismissing is a person's judgement ("we know, the GPU is shared on
purpose"), audited, and holds while the problem lasts: a dismissed finding is still updated
but not shown among the active ones.
"""

from __future__ import annotations

from django.conf import settings as conf
from django.db import models
from django.db.models import Q
from django.utils import timezone

from changes.advisor.findings import CRITICAL, INFO, SEVERITY_ORDER, WARNING


class Severity(models.TextChoices):
    CRITICAL = CRITICAL, "Critical"
    WARNING = WARNING, "Warning"
    INFO = INFO, "Info"


class FindingQuerySet(models.QuerySet):
    def active(self):
        """Open and not dismissed: what the pages and the API list by default."""
        return self.filter(cleared_at__isnull=True, dismissed_at__isnull=True)

    def open(self):
        """Still seen by the rules (dismissed or not)."""
        return self.filter(cleared_at__isnull=True)

    def worst_first(self):
        """Critical first, then warning, then info; newest problems first within each."""
        rank = models.Case(
            *(models.When(severity=s, then=models.Value(n)) for s, n in SEVERITY_ORDER.items()),
            default=models.Value(9),
            output_field=models.IntegerField(),
        )
        return self.alias(severity_rank=rank).order_by("severity_rank", "-first_seen_at", "pk")


class Finding(models.Model):
    """One problem one advisor rule saw on one deployment, with the numbers that showed it
    (``seen`` in words, ``evidence`` as data) and the change that would address it
    (``suggestion``: ``{"settings": {flag: value}, "action": text}`` or null).

    At most one open finding per (deployment, rule): the rules are re-evaluated every minute
    and each evaluation updates that row instead of adding one."""

    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="findings"
    )
    rule = models.CharField(max_length=60, help_text="The rule's stable id, e.g. queue-bound.")
    severity = models.CharField(max_length=10, choices=Severity.choices)
    title = models.CharField(max_length=200)
    seen = models.TextField(help_text="What was seen: the numbers, with the window they cover.")
    why = models.TextField(help_text="Why it matters.")
    evidence = models.JSONField(default=dict, blank=True)
    suggestion = models.JSONField(null=True, blank=True)
    source = models.CharField(
        max_length=100, blank=True, help_text="Where the numbers came from: live, run N …"
    )
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    cleared_at = models.DateTimeField(
        null=True, blank=True, help_text="When the rules stopped seeing it; empty while open."
    )
    dismissed_at = models.DateTimeField(null=True, blank=True)
    dismissed_by = models.ForeignKey(
        conf.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    dismiss_reason = models.CharField(max_length=500, blank=True)

    objects = FindingQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen_at", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "rule"],
                condition=Q(cleared_at__isnull=True),
                name="finding_one_open_per_rule",
            )
        ]
        indexes = [models.Index(fields=["cleared_at", "severity"])]

    def __str__(self) -> str:
        return f"{self.rule} on deployment {self.deployment_id}"

    @property
    def is_open(self) -> bool:
        return self.cleared_at is None

    @property
    def is_dismissed(self) -> bool:
        return self.dismissed_at is not None

    @property
    def state(self) -> str:
        """``active``, ``dismissed`` (still seen) or ``cleared``."""
        if self.cleared_at is not None:
            return "cleared"
        return "dismissed" if self.dismissed_at is not None else "active"
