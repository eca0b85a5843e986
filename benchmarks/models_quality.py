"""Quality probes: does the model still answer right after a change (quantisation, KV-cache
dtype, another model or engine)? Probe sets are versioned data (``ProbeSet``, items as the
pure ``benchmarks.quality`` package reads them); a ``ProbeRun`` asks one deployment every item
at temperature 0 and keeps each answer and its score (``ProbeResult``), like a benchmark run
keeps its requests. Two runs of the same set compare item by item
(``benchmarks.services.probes.compare_runs``).
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.db.models import Max
from django.urls import reverse
from django.utils import timezone

from controlpanel.models import BackgroundOperation


class ProbeSetSource(models.TextChoices):
    BUILTIN = "builtin", "Built-in"
    UPLOADED = "uploaded", "Uploaded"


class ProbeSet(models.Model):
    """One immutable, numbered version of a named probe set: its items (the JSONL lines as
    dicts) and what they cover. Editing a set means uploading its next version; every run
    names the version it asked."""

    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    description = models.TextField(blank=True)
    source = models.CharField(
        max_length=16, choices=ProbeSetSource.choices, default=ProbeSetSource.UPLOADED
    )
    items = models.JSONField(default=list)
    item_count = models.PositiveIntegerField(default=0)
    coverage = models.JSONField(
        default=dict, blank=True, help_text='{"category/language": count}, for the pages.'
    )
    sha256 = models.CharField(max_length=64, blank=True, help_text="Of the items as stored.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Manager(models.Manager):
        def create_next(self, name: str, items: list, **fields) -> ProbeSet:
            """Create ``name``'s next version (1 for a new name)."""
            with transaction.atomic():
                last = self.filter(name=name).aggregate(v=Max("version"))["v"] or 0
                return self.create(name=name, version=last + 1, items=items, **fields)

        def latest(self):
            newest = self.filter(name=models.OuterRef("name")).order_by("-version").values("pk")[:1]
            return self.filter(pk=models.Subquery(newest))

    objects = Manager()

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="probeset_unique_version")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def get_absolute_url(self) -> str:
        return reverse("benchmarks:probe_set", args=[self.pk])


class ProbeRun(BackgroundOperation):
    """One probe set asked of one deployment (with the config it ran), at temperature 0 and a
    fixed seed, ``concurrency`` questions at a time; JSON items with the engine's structured
    output when ``structured_output``. ``simulated``: the deployment was the simulator, whose
    answers come from a quality model, not a real model — every page says so."""

    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="probe_runs"
    )
    engine_config = models.ForeignKey(
        "hosts.EngineConfig", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    probe_set = models.ForeignKey(ProbeSet, on_delete=models.PROTECT, related_name="runs")
    label = models.CharField(max_length=100, blank=True)
    model_name = models.CharField(max_length=200, blank=True)
    engine = models.CharField(max_length=16, blank=True)
    engine_version = models.CharField(max_length=40, blank=True)
    simulated = models.BooleanField(default=False)
    structured_output = models.BooleanField(default=False)
    concurrency = models.PositiveSmallIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(256)]
    )
    seed = models.IntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    summary = models.JSONField(
        default=dict, blank=True, help_text="Accuracy overall and by category × language."
    )
    duration_s = models.FloatField(null=True, blank=True)

    class Meta(BackgroundOperation.Meta):
        constraints = [
            # One probe at a time per engine (occupancy is the rule; this its backstop).
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(status__in=["queued", "running"]),
                name="proberun_one_active_per_deployment",
            )
        ]

    def __str__(self) -> str:
        return f"probe #{self.pk} {self.probe_set} on {self.deployment}"

    def get_absolute_url(self) -> str:
        return reverse("benchmarks:probe_run", args=[self.pk])

    @property
    def accuracy(self) -> float | None:
        return (self.summary or {}).get("overall", {}).get("accuracy")


class ProbeResult(models.Model):
    """One item's answer in a probe run, and how its scorer judged it."""

    run = models.ForeignKey(ProbeRun, on_delete=models.CASCADE, related_name="results")
    item_id = models.CharField(max_length=100)
    category = models.CharField(max_length=32)
    language = models.CharField(max_length=16)
    answer = models.TextField(blank=True)
    correct = models.BooleanField(null=True)
    json_valid = models.BooleanField(null=True)
    schema_ok = models.BooleanField(null=True)
    prompt_tokens = models.PositiveIntegerField(null=True)
    completion_tokens = models.PositiveIntegerField(null=True)
    latency_ms = models.FloatField(null=True)
    error = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["run", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["run", "item_id"], name="proberesult_unique_item")
        ]
        indexes = [models.Index(fields=["run", "category", "language"])]

    def __str__(self) -> str:
        return f"{self.run} {self.item_id}"
