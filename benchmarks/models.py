"""Load profiles (what load to apply) and benchmark runs (one application of it)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from benchmarks.choices import Dataset, LoadMode
from controlpanel.models import BackgroundOperation


class LoadProfile(models.Model):
    """A reproducible load: arrival pattern, prompt/output lengths and request count.

    Comparing two configs is only fair under the same profile, so runs reference one and the
    profile is what the history groups by.
    """

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    mode = models.CharField(max_length=8, choices=LoadMode.choices, default=LoadMode.CLOSED)
    concurrency = models.PositiveIntegerField(
        default=16,
        validators=[MinValueValidator(1)],
        help_text="Closed loop: requests in flight. Open loop: the cap on them.",
    )
    request_rate = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="Open loop only: mean requests per second.",
    )
    burstiness = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.01)],
        help_text="Gamma shape of inter-arrival gaps; 1.0 is Poisson.",
    )
    num_requests = models.PositiveIntegerField(default=200, validators=[MinValueValidator(1)])
    warmup_requests = models.PositiveIntegerField(
        default=10, help_text="Sent first and left out of every statistic."
    )
    dataset = models.CharField(max_length=20, choices=Dataset.choices, default=Dataset.RANDOM)
    input_tokens = models.PositiveIntegerField(default=512, validators=[MinValueValidator(1)])
    output_tokens = models.PositiveIntegerField(default=128, validators=[MinValueValidator(1)])
    seed = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        if self.mode == LoadMode.OPEN and not self.request_rate:
            raise ValidationError({"request_rate": "An open-loop profile needs a request rate."})

    @property
    def summary(self) -> str:
        load = (
            f"{self.concurrency} concurrent"
            if self.mode == LoadMode.CLOSED
            else f"{self.request_rate:g} req/s"
        )
        return f"{load}, {self.input_tokens}→{self.output_tokens} tokens, {self.num_requests} req"


class BenchmarkRun(BackgroundOperation):
    """One load test of one deployment under one profile, with its results once finished."""

    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.PROTECT, related_name="benchmark_runs"
    )
    engine_config = models.ForeignKey(
        "hosts.EngineConfig",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="benchmark_runs",
        help_text="The settings the engine ran with.",
    )
    load_profile = models.ForeignKey(LoadProfile, on_delete=models.PROTECT, related_name="runs")
    label = models.CharField(max_length=100, blank=True)
    summary = models.JSONField(
        default=dict,
        blank=True,
        help_text="Headline results (TTFT/ITL percentiles, throughput, errors) once finished.",
    )

    class Meta(BackgroundOperation.Meta):
        pass

    def __str__(self) -> str:
        return self.label or f"run #{self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("benchmarks:detail", args=[self.pk])
