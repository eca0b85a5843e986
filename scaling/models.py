"""Scaling: the engines' live signals as the panel scraped them, each deployment's scaling
policy, and capacity-planning what-ifs."""

from __future__ import annotations

from django.conf import settings as conf
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from controlpanel.models import BackgroundOperation


class EngineSample(models.Model):
    """One scrape of a deployment's engine ``/metrics`` by the panel's signal poller.

    ``snapshot`` is what the exposition said (``scaling.planning.expo``: gauges, cumulative
    counters and histogram buckets, summed over label sets); ``signals`` what the panel
    computed from it and the samples before it (``scaling.planning.signals``), so a page
    or a scrape of ``/metrics`` reads the newest row instead of recomputing. Kept for
    ``SCALING_SAMPLE_RETENTION_MINUTES``."""

    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="engine_samples"
    )
    time = models.DateTimeField(default=timezone.now)
    snapshot = models.JSONField(default=dict)
    signals = models.JSONField(default=dict)

    class Meta:
        ordering = ["-time"]
        indexes = [models.Index(fields=["deployment", "-time"], name="enginesample_dep_time")]

    def __str__(self) -> str:
        return f"{self.deployment_id} @ {self.time:%H:%M:%S}"


class ScalingPolicy(models.Model):
    """How a deployment's model is to scale: its SLO, the load profile whose benchmark
    history measures a replica's capacity, replica bounds and the scaler's timing.

    A deployment without a row scales by the defaults (``SCALING_*`` settings); saving the
    form creates it. Replicas are counted over the deployment's replica group: the running
    deployments serving the same model with the same engine."""

    deployment = models.OneToOneField(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="scaling_policy"
    )
    slo_ttft_p95_ms = models.FloatField(
        default=500.0,
        validators=[MinValueValidator(1.0), MaxValueValidator(600_000.0)],
        help_text="p95 time to first token a replica must keep, ms.",
    )
    slo_itl_p95_ms = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.1), MaxValueValidator(60_000.0)],
        help_text="Optional p95 inter-token latency, ms.",
    )
    max_error_rate = models.FloatField(
        default=0.01,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Share of failed requests above which a load level is not served (0–1).",
    )
    load_profile = models.ForeignKey(
        "benchmarks.LoadProfile",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Capacity is measured by runs of this profile version; empty: the profile "
        "of the newest finished run on the running config.",
    )
    min_replicas = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(0), MaxValueValidator(1000)]
    )
    max_replicas = models.PositiveSmallIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(1000)]
    )
    target = models.FloatField(
        default=0.8,
        validators=[MinValueValidator(0.1), MaxValueValidator(1.0)],
        help_text="Share of a replica's measured capacity to plan for (headroom for bursts).",
    )
    stabilisation_s = models.PositiveIntegerField(
        default=300,
        validators=[MaxValueValidator(86_400)],
        help_text="A scale-down waits this long of lower demand.",
    )
    cooldown_s = models.PositiveIntegerField(
        default=300,
        validators=[MaxValueValidator(86_400)],
        help_text="KEDA's cooldownPeriod: how long after the last active trigger before "
        "scaling to the minimum.",
    )
    polling_interval_s = models.PositiveIntegerField(
        default=15, validators=[MinValueValidator(1), MaxValueValidator(3600)]
    )
    updated_by = models.ForeignKey(
        conf.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"scaling policy of deployment {self.deployment_id}"


class WhatIfPlan(BackgroundOperation):
    """A capacity-planning what-if: a day of traffic for one deployment's model run through
    a replica model calibrated by the simulator, under several scaling policies, with the
    measured start-up delay of new replicas. ``traffic`` is the day's shape as entered
    (hourly rates, or a traffic sample's fitted rates); ``params`` the SLO, bounds, prices
    and policies; ``result`` per policy: replicas and p95 TTFT per minute, minutes out of
    SLO, GPU-hours and cost per day and per 1M tokens."""

    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="what_if_plans"
    )
    traffic = models.JSONField(default=dict)
    params = models.JSONField(default=dict)
    result = models.JSONField(default=dict, blank=True)
    progress = models.FloatField(default=0.0)

    class Meta(BackgroundOperation.Meta):
        pass

    def __str__(self) -> str:
        return f"what-if #{self.pk} for deployment {self.deployment_id}"

    def get_absolute_url(self) -> str:
        return reverse("scaling:whatif", args=[self.pk])
