"""The fleet: GPU servers, their GPUs, the engines deployed on them and their settings."""

from __future__ import annotations

import re
from decimal import Decimal

from django.conf import settings as conf
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.db.models import Max
from django.urls import reverse
from django.utils import timezone

from controlpanel.models import BackgroundOperation
from hosts.choices import DeploymentStatus, EngineKind, TransportKind

LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$")
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*$")
PORT_VALIDATORS = [MinValueValidator(1), MaxValueValidator(65535)]


def validate_address(value: str) -> None:
    """A DNS name, an IPv4 address or an IPv6 address; nothing that could smuggle a command."""
    import ipaddress

    try:
        ipaddress.ip_address(value.strip("[]"))
        return
    except ValueError:
        pass
    if not HOSTNAME.match(value):
        raise ValidationError(f"{value!r} is not a host name or IP address.")


def validate_labels(value) -> None:
    if not isinstance(value, dict):
        raise ValidationError("Labels must be a mapping of key to value.")
    for key, item in value.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise ValidationError(
                f"Label key {key!r} must be lower-case letters, digits, '.', '_', '-' or '/'."
            )
        if not isinstance(item, str) or len(item) > 63:
            raise ValidationError(f"Label {key!r} must have a text value of at most 63 chars.")


class Host(models.Model):
    """A GPU server the panel manages, reached through the host agent or over SSH."""

    name = models.CharField(max_length=100, unique=True)
    address = models.CharField(
        max_length=255, validators=[validate_address], help_text="DNS name or IP address."
    )
    transport = models.CharField(
        max_length=8, choices=TransportKind.choices, default=TransportKind.AGENT
    )
    port = models.PositiveIntegerField(
        validators=PORT_VALIDATORS,
        help_text="Agent port (8421 by default) or SSH port (22).",
    )
    labels = models.JSONField(default=dict, blank=True, validators=[validate_labels])
    hourly_price = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text="What the server costs per hour, in the panel's currency.",
    )
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("hosts:detail", args=[self.pk])

    @property
    def label_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.labels.items()))

    def latest_check(self):
        return self.checks.order_by("-created_at", "-pk").first()


class Gpu(models.Model):
    """One GPU of a host, as NVML reports it."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True, help_text="e.g. GPU-5fd4…")
    name = models.CharField(max_length=100, help_text="e.g. NVIDIA H100 80GB HBM3")
    memory_bytes = models.PositiveBigIntegerField()
    numa_node = models.SmallIntegerField(
        null=True, blank=True, help_text="NUMA node the GPU hangs off; empty if unknown."
    )

    class Meta:
        ordering = ["host", "index"]
        constraints = [
            models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_index_per_host")
        ]

    def __str__(self) -> str:
        return f"{self.host.name} GPU{self.index} ({self.name})"

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30


class Deployment(models.Model):
    """An inference engine (vLLM or SGLang) serving one model on a host."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="deployments")
    name = models.CharField(max_length=100)
    engine = models.CharField(max_length=16, choices=EngineKind.choices)
    engine_version = models.CharField(max_length=40, help_text="e.g. 0.11.0")
    model = models.CharField(max_length=200, help_text="e.g. meta-llama/Llama-3.1-8B-Instruct")
    port = models.PositiveIntegerField(validators=PORT_VALIDATORS)
    gpus = models.ManyToManyField(Gpu, blank=True, related_name="deployments")
    status = models.CharField(
        max_length=16, choices=DeploymentStatus.choices, default=DeploymentStatus.UNKNOWN
    )
    active_config = models.ForeignKey(
        "EngineConfig",
        null=True,
        blank=True,
        on_delete=models.RESTRICT,
        related_name="+",
        help_text="The settings the engine runs with now (the last good config).",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["host", "name"]
        constraints = [
            models.UniqueConstraint(fields=["host", "port"], name="deployment_unique_port"),
            models.UniqueConstraint(fields=["host", "name"], name="deployment_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.host.name}/{self.name}"

    @property
    def status_choice(self) -> DeploymentStatus:
        return DeploymentStatus(self.status)

    def clean(self):
        if self.active_config_id and self.active_config.deployment_id != self.pk:
            raise ValidationError({"active_config": "That config belongs to another deployment."})


class EngineConfig(models.Model):
    """One immutable, numbered version of a deployment's engine settings.

    Settings map flag names (without dashes, e.g. ``max_num_seqs``) to values. A change never
    edits a version: it creates the next one (``EngineConfig.objects.create_next``), so every
    benchmark can name exactly the settings it measured and a rollback has somewhere to go.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="configs")
    version = models.PositiveIntegerField()
    settings = models.JSONField(default=dict, blank=True)
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        conf.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Manager(models.Manager):
        def create_next(
            self, deployment: Deployment, settings: dict, *, created_by=None, note: str = ""
        ) -> EngineConfig:
            """Create the deployment's next version (serialised on the deployment row)."""
            with transaction.atomic():
                Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
                last = self.filter(deployment=deployment).aggregate(v=Max("version"))["v"] or 0
                return self.create(
                    deployment=deployment,
                    version=last + 1,
                    settings=settings,
                    created_by=created_by,
                    note=note,
                )

    objects = Manager()

    class Meta:
        ordering = ["deployment", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "version"], name="engineconfig_unique_version"
            )
        ]

    def __str__(self) -> str:
        return f"{self.deployment} v{self.version}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("Engine configs are immutable: create the next version instead.")
        if not isinstance(self.settings, dict):
            raise ValueError("Engine settings must be a mapping of flag name to value.")
        super().save(*args, **kwargs)

    def previous(self) -> EngineConfig | None:
        return (
            EngineConfig.objects.filter(deployment_id=self.deployment_id, version__lt=self.version)
            .order_by("-version")
            .first()
        )

    def diff(self, other: EngineConfig | None) -> dict[str, tuple]:
        """``{flag: (other's value, this value)}`` for every flag that differs."""
        old = other.settings if other else {}
        keys = sorted(set(old) | set(self.settings))
        return {
            k: (old.get(k), self.settings.get(k))
            for k in keys
            if old.get(k) != self.settings.get(k)
        }


class HostCheck(BackgroundOperation):
    """A reachability check of a host's transport port, run by a Celery worker.

    Operators start one from the host page; the scheduler runs one per host periodically.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="checks")
    reachable = models.BooleanField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    detail = models.CharField(max_length=300, blank=True)

    class Meta(BackgroundOperation.Meta):
        pass

    def __str__(self) -> str:
        return f"check of {self.host.name} #{self.pk}"

    def as_event(self) -> dict:
        return {
            "id": self.pk,
            "host": self.host_id,
            "status": self.status,
            "reachable": self.reachable,
            "latency_ms": self.latency_ms,
            "detail": self.detail,
            "error": self.error,
        }
