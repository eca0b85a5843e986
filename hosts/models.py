"""The fleet: GPU servers, their GPUs, the engines deployed on them and their settings."""

from __future__ import annotations

import re
from decimal import Decimal

from django.conf import settings as conf
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models, transaction
from django.db.models import Max
from django.urls import reverse
from django.utils import timezone

from controlpanel.choices import OperationStatus
from controlpanel.crypto import EncryptedTextField
from hosts.addresses import is_loopback
from hosts.choices import (
    DeploymentStatus,
    EngineKind,
    HostStatus,
    LaunchStyle,
    Runner,
    TransportKind,
)
from hosts.credentials import SECRET_FIELDS, CredentialBinding
from hosts.engines.launch import LaunchConfig, Placement
from hosts.engines.metrics import endpoints

# Re-exported: telemetry rows live in their own module, named from here as before.
from hosts.models_telemetry import GpuSample, GpuSampleHour, GpuSampleMinute  # noqa: F401

# Re-exported: the migrations name the validators by this module.
from hosts.validators import (  # noqa: F401
    LABEL_KEY,
    validate_address,
    validate_fingerprint,
    validate_labels,
    validate_ssh_username,
)

PORT_VALIDATORS = [MinValueValidator(1), MaxValueValidator(65535)]
# Becomes part of remote paths, unit and container names (hosts.transport.base.ENGINE_NAME).
ENGINE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ACTIVE_STATUSES = [OperationStatus.QUEUED, OperationStatus.RUNNING]


def clock_events(reasons) -> list[str]:
    """The clock-event (throttle) reasons worth showing: an idle GPU clocking down is not one."""
    return [r for r in reasons or [] if r.lower() != "idle"]


def protection_label_keys() -> list[str]:
    """The label keys that set how much review a host's changes need (CHANGE_PRODUCTION_LABEL):
    changing them on a host changes its protection, which only an Admin may do."""
    key = conf.CHANGE_PRODUCTION_LABEL.partition("=")[0].strip()
    return [key] if key else []


class Host(CredentialBinding, models.Model):
    """A GPU server the panel manages, reached through the host agent or over SSH.

    Each stored credential is bound to the destination it was entered for
    (``credential_bindings``): pointing the host elsewhere (address, port, transport, TLS, CA)
    leaves the old credentials bound to the old destination, and the transport refuses to send
    them anywhere else until they are entered again (``credential_problem``).
    """

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
    # --- credentials (encrypted at rest; never shown again once saved) -------------------
    agent_token = EncryptedTextField(blank=True, help_text="Bearer token of the host agent.")
    agent_tls = models.BooleanField(default=False, help_text="The agent serves HTTPS.")
    agent_ca_cert = models.TextField(
        blank=True, help_text="PEM certificate(s) to verify the agent's TLS certificate."
    )
    ssh_username = models.CharField(max_length=32, blank=True, validators=[validate_ssh_username])
    ssh_private_key = EncryptedTextField(
        blank=True,
        help_text="OpenSSH/PEM private key, or file:/path/to/key on the worker machines.",
    )
    ssh_key_passphrase = EncryptedTextField(blank=True)
    ssh_python = models.CharField(
        max_length=200,
        blank=True,
        default="python3",
        validators=[
            RegexValidator(
                r"^(/[A-Za-z0-9._+-]+)+$|^python3?(\.[0-9]+)?$",
                "A python name (python3) or an absolute path.",
            )
        ],
        help_text="Python on the host for SGLang and the simulator (an absolute path for a "
        "virtualenv).",
    )
    ssh_host_key_fingerprint = models.CharField(
        max_length=60,
        blank=True,
        validators=[validate_fingerprint],
        help_text="The accepted host key (SHA256:…); any other key is refused.",
    )
    ssh_offered_fingerprint = models.CharField(
        max_length=60,
        blank=True,
        help_text="The key the host presented at first contact (or when it changed).",
    )
    ssh_offered_key_type = models.CharField(max_length=40, blank=True)
    credential_bindings = models.JSONField(
        default=dict,
        blank=True,
        editable=False,
        help_text="For each stored secret, the destination it was entered for; it is never "
        "sent to any other (set on save, see Host.save).",
    )
    # --- what the panel last learned ------------------------------------------------------
    status = models.CharField(max_length=20, choices=HostStatus.choices, default=HostStatus.UNKNOWN)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_poll_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    telemetry_source = models.CharField(max_length=20, blank=True)
    telemetry_note = models.CharField(max_length=300, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    driver_version = models.CharField(max_length=40, blank=True)
    cuda_version = models.CharField(max_length=40, blank=True)
    libraries = models.JSONField(
        default=dict,
        blank=True,
        help_text="Versions of the Python packages engines run on (vllm, torch, …) as the "
        "host reported them: {name: version}.",
    )
    cpu_count = models.PositiveIntegerField(null=True, blank=True)
    cpu_model = models.CharField(max_length=200, blank=True)
    memory_total_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    numa_nodes = models.JSONField(default=list, blank=True, help_text="[{node, cpus}]")
    host_readings = models.JSONField(
        default=dict, blank=True, help_text="Last CPU/load/memory reading of the host."
    )
    inventory_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            ("accept_host_key", "Can accept a host's SSH key"),
            # "change_" so the Admin role (every change_ permission) holds it and an Operator
            # (an explicit list) does not.
            (
                "change_host_protection",
                "Can change a host's protection (the labels that set its approvals)",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("hosts:detail", args=[self.pk])

    @property
    def is_production(self) -> bool:
        """Whether the host carries CHANGE_PRODUCTION_LABEL (key=value): what is started or
        changed on it then needs CHANGE_PRODUCTION_APPROVALS approvals. The one rule: changes,
        sweeps and a new deployment's first start all read it, as the labels are now."""
        key, _, value = conf.CHANGE_PRODUCTION_LABEL.partition("=")
        return bool(key) and (self.labels or {}).get(key) == value

    @property
    def status_choice(self) -> HostStatus:
        return HostStatus(self.status)

    @property
    def has_credentials(self) -> bool:
        """Whether the transport's credential is stored (set, if unreadable). A host read by
        ``without_secrets`` answers from its flags, without reading or decrypting a secret."""
        flags = self.__dict__
        if self.transport == TransportKind.AGENT:
            stored = flags.get("agent_token_stored")
            return bool(self.agent_token) if stored is None else stored
        stored = flags.get("ssh_private_key_stored")
        return bool(self.ssh_username) and (
            bool(self.ssh_private_key) if stored is None else stored
        )

    def clean(self):
        super().clean()
        if (
            self.transport == TransportKind.AGENT
            and not self.agent_tls
            and self.address
            and not is_loopback(self.address)
            and not conf.AGENT_ALLOW_CLEARTEXT
        ):
            # The bearer token and every engine setting would cross the network readable.
            raise ValidationError(
                {
                    "agent_tls": "An agent on another machine is reached over TLS (start it "
                    "with --tls-cert/--tls-key and paste its certificate as the CA "
                    "certificate). Plain HTTP is only for agents on this machine "
                    "(127.0.0.1), unless AGENT_ALLOW_CLEARTEXT is set."
                }
            )

    @property
    def protection(self) -> dict[str, str | None]:
        """The labels that set how much review this host's changes need."""
        return {key: (self.labels or {}).get(key) for key in protection_label_keys()}

    @property
    def label_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.labels.items()))

    def latest_check(self):
        return self.checks.order_by("-created_at", "-pk").first()


def without_secrets(hosts: models.QuerySet) -> models.QuerySet:
    """``hosts`` with their encrypted columns left unread (read, and decrypted, only where
    used: the poll builds a host's transport once, not every second) and whether each is
    stored, for ``Host.has_credentials``. The telemetry poll reads its hosts every second:
    decrypting three secrets per host was 4 % of the worker's time at 500 hosts."""
    return hosts.defer(*SECRET_FIELDS).annotate(
        **{
            f"{name}_stored": models.ExpressionWrapper(
                ~models.Q(**{name: ""}), output_field=models.BooleanField()
            )
            for name in ("agent_token", "ssh_private_key")
        }
    )


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
    cpu_affinity = models.CharField(
        max_length=200, blank=True, help_text="CPUs close to the GPU, e.g. 0-15,32-47."
    )
    # The newest reading, kept on the row so lists need no query over the samples.
    last_sample = models.JSONField(default=dict, blank=True)
    last_sample_at = models.DateTimeField(null=True, blank=True)

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

    @property
    def memory_used_gib(self) -> float | None:
        used = self.last_sample.get("memory_used_bytes")
        return None if used is None else used / 2**30

    @property
    def throttle_reasons(self) -> list[str]:
        return clock_events(self.last_sample.get("throttle_reasons"))


class Deployment(models.Model):
    """An inference engine (vLLM or SGLang) serving one model on a host. On a production host
    its first start waits *in review* for approvals (``DeploymentApproval``), like a change."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="deployments")
    name = models.CharField(
        max_length=63,
        validators=[
            RegexValidator(
                ENGINE_NAME, "Lower-case letters, digits and '-' (a unit/container name)."
            )
        ],
    )
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
    launch_style = models.CharField(
        max_length=16, choices=LaunchStyle.choices, default=LaunchStyle.PROCESS
    )
    runner = models.CharField(
        max_length=16,
        choices=Runner.choices,
        default=Runner.ENGINE,
        help_text="The simulator stands in for the engine on machines without GPUs.",
    )
    simulator = models.JSONField(
        default=dict, blank=True, help_text="Simulator options: gpu, num_gpus, startup_seconds."
    )
    docker_image = models.CharField(
        max_length=200, blank=True, help_text="Empty: the engine's official image."
    )
    status_detail = models.CharField(max_length=500, blank=True)
    status_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        conf.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who created it (never one of its first start's approvers).",
    )
    required_approvals = models.PositiveSmallIntegerField(
        default=0,
        help_text="Approvals its first start needs (a production host's); 0: started at once.",
    )

    class Meta:
        ordering = ["host", "name"]
        permissions = [
            (
                "approve_deployment",
                "Can approve a new deployment's first start on a production host",
            )
        ]
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

    def active_operation(self) -> EngineOperation | None:
        return self.operations.filter(status__in=ACTIVE_STATUSES).first()

    @property
    def engine_url(self) -> str:
        """Where the panel's workers reach the engine's OpenAI-compatible API."""
        address = self.host.address
        if ":" in address and not address.startswith("["):
            address = f"[{address}]"
        return f"http://{address}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Where the engine's Prometheus metrics are: its OpenAI base URL plus the engine's
        /metrics path (what a benchmark's scraper reads, the advisor's live scrape and the
        scaling signals' poll alike)."""
        return self.engine_url + endpoints(self.engine).metrics

    def api_key(self) -> str | None:
        """The API key the engine was started with (``--api-key`` or ``VLLM_API_KEY``)."""
        config = self.active_config
        return None if config is None else config.api_key()

    def launch_config(
        self,
        settings: dict,
        env: dict | None = None,
        placement: dict | None = None,
        model: str | None = None,
    ) -> LaunchConfig:
        """A launch of this deployment with these settings (``hosts.engines.launch``): what
        a stored config version runs, or what a proposed change would (``model``: another
        model than the one it serves now)."""
        placement = placement or {}
        return LaunchConfig(
            engine=self.engine,
            model=model or self.model,
            settings=dict(settings),
            engine_version=self.engine_version or None,
            env=dict(env or {}),
            placement=Placement(placement.get("numa_node"), placement.get("cpus"))
            if placement
            else None,
            port=self.port,
            runner=self.runner,
            simulator=dict(self.simulator or {}),
        )


class EngineConfig(models.Model):
    """One immutable, numbered version of a deployment's engine settings.

    Settings map flag names (without dashes, e.g. ``max_num_seqs``) to values. A change never
    edits a version: it creates the next one (``EngineConfig.objects.create_next``), so every
    benchmark can name exactly the settings it measured and a rollback has somewhere to go.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="configs")
    version = models.PositiveIntegerField()
    settings = models.JSONField(default=dict, blank=True)
    env = models.JSONField(
        default=dict, blank=True, help_text="Environment variables (CUDA_VISIBLE_DEVICES, VLLM_*)."
    )
    placement = models.JSONField(
        default=dict, blank=True, help_text="CPU placement: {numa_node, cpus}."
    )
    model = models.CharField(
        max_length=200,
        blank=True,
        help_text="The model this version serves (a change may switch it, e.g. to an AWQ "
        "variant); empty: the deployment's model.",
    )
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
            self,
            deployment: Deployment,
            settings: dict,
            *,
            env: dict | None = None,
            placement: dict | None = None,
            created_by=None,
            note: str = "",
            model: str | None = None,
        ) -> EngineConfig:
            """Create the deployment's next version (serialised on the deployment row). Its
            model is pinned: ``model``, or the one the deployment serves now, so that going
            back to it later restores the model too."""
            with transaction.atomic():
                row = Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
                last = self.filter(deployment=deployment).aggregate(v=Max("version"))["v"] or 0
                return self.create(
                    deployment=deployment,
                    version=last + 1,
                    settings=settings,
                    env=env or {},
                    placement=placement or {},
                    created_by=created_by,
                    note=note,
                    model=model or (row.model if row else deployment.model),
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

    def api_key(self) -> str | None:
        """The API key an engine started with this config requires (``--api-key`` or
        ``VLLM_API_KEY``), or None."""
        return self.settings.get("api_key") or (self.env or {}).get("VLLM_API_KEY") or None

    def diff(self, other: EngineConfig | None) -> dict[str, tuple]:
        """``{flag: (other's value, this value)}`` for every flag that differs; environment
        variables appear as ``env.NAME`` and placement as ``placement.numa_node``/``.cpus``."""
        return flat_diff(other.flat() if other else {}, self.flat())

    def flat(self) -> dict:
        return flat_config(self.settings, self.env, self.placement, self.model)

    def launch_config(self):
        """The whole launch config of this version on its deployment (hosts.engines.launch)."""
        return self.deployment.launch_config(
            self.settings, self.env, self.placement, self.model or None
        )


def flat_config(
    settings: dict, env: dict | None, placement: dict | None, model: str | None = None
) -> dict:
    """Settings, environment, placement and the model (when pinned) as one mapping
    (``env.NAME``, ``placement.cpus``, ``model``), the shape every config diff is shown in."""
    flat = dict(settings or {})
    if model:
        flat["model"] = model
    flat.update({f"env.{k}": v for k, v in (env or {}).items()})
    flat.update({f"placement.{k}": v for k, v in (placement or {}).items() if v is not None})
    return flat


def flat_diff(old: dict, new: dict) -> dict[str, tuple]:
    """``{key: (old value, new value)}`` for every key whose value differs, sorted."""
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


# Background operations on hosts and deployments: checks, applies and restarts.
from hosts.models_operations import EngineOperation, HostCheck  # noqa: E402, F401

# The review of a new deployment's first start on a production host.
from hosts.models_review import DeploymentApproval  # noqa: E402, F401
