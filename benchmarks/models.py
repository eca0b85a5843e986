"""Load profiles (what load to apply), benchmark runs (one application of it) with their
timelines and per-request records, and the prices that turn a run into money."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.db.models import Max
from django.urls import reverse
from django.utils import timezone

from benchmarks.choices import Pricing, ProfileSource, RunSource
from benchmarks.loadgen.profile import describe
from benchmarks.metrics import HISTORY
from controlpanel.choices import OperationStatus
from controlpanel.models import BackgroundOperation


def default_currency() -> str:
    return settings.PANEL_CURRENCY


class LoadProfile(models.Model):
    """One immutable, numbered version of a named load: stages, arrivals, token lengths,
    shared-prefix share, warm-up and the SLOs that define goodput (``spec``, the document
    ``benchmarks.loadgen.profile`` validates and turns into a load generator spec).

    Comparing two configs is only fair under the same load, so a run points at the exact
    version it used; editing a profile creates the next version (``create_next``) and every
    older run keeps naming what it really ran.
    """

    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    description = models.TextField(blank=True)
    spec = models.JSONField(default=dict)
    source = models.CharField(
        max_length=16, choices=ProfileSource.choices, default=ProfileSource.MANUAL
    )
    note = models.CharField(max_length=200, blank=True, help_text="What changed in this version.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Manager(models.Manager):
        def create_next(self, name: str, spec: dict, **fields) -> LoadProfile:
            """Create ``name``'s next version (version 1 for a new name). Serialised by the
            unique constraint: a concurrent writer of the same name gets an IntegrityError."""
            with transaction.atomic():
                last = self.filter(name=name).aggregate(v=Max("version"))["v"] or 0
                return self.create(name=name, version=last + 1, spec=spec, **fields)

        def latest(self):
            """The newest version of every name."""
            newest = self.filter(name=models.OuterRef("name")).order_by("-version").values("pk")[:1]
            return self.filter(pk=models.Subquery(newest))

    objects = Manager()

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="loadprofile_unique_version")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("Load profiles are immutable: create the next version instead.")
        super().save(*args, **kwargs)

    def get_absolute_url(self) -> str:
        return reverse("benchmarks:profile", args=[self.pk])

    @property
    def summary(self) -> str:
        return describe(self.spec)

    @property
    def source_choice(self) -> ProfileSource:
        return ProfileSource(self.source)

    @property
    def is_latest(self) -> bool:
        return not LoadProfile.objects.filter(name=self.name, version__gt=self.version).exists()


# A run on a host with mixed GPUs records their distinct names, sorted, joined by this
# (``BenchmarkRun.gpu_model``): the history's GPU filter and the cost page split on it.
GPU_SEPARATOR = ", "

# The history sorts by each of these; each has an index (see BenchmarkRun.Meta).
SORTED_COLUMNS = tuple(metric.key for metric in HISTORY)


def spec_with_override(spec: dict, override: dict | None) -> dict:
    """A profile document at another load (``{"mode", "value"}``) and, when given, another
    seed: a sweep's searches send fresh prompts at each load, since the same prompts again
    would be served from the prefix cache the previous load filled and look faster than any
    new traffic is (measured: +44 % max rate on a simulated H100)."""
    if not override:
        return spec
    # The sweep package loads the simulator's cost model: only a run at another load needs it.
    from benchmarks.sweep.load import apply_load

    out = apply_load(spec, override["mode"], override["value"])
    if override.get("seed") is not None:
        out["seed"] = int(override["seed"])
    return out


# The most load generator shards a run may be split over (``BenchmarkRun.shards``).
MAX_SHARDS = 16


# A run's log and JSON documents: several KB each, decoded per row. Lists that show a run's
# name, status and a number or two leave them in the database (``.defer(*RUN_DOCUMENTS)``): SQLite
# sorts the history with every selected column carried along.
RUN_DOCUMENTS = (
    "log",
    "summary",
    "stages",
    "server",
    "distributions",
    "notes",
    "environment",
    "load_override",
)


class BenchmarkRun(BackgroundOperation):
    """One load test of one deployment under one profile version, with its results.

    Everything needed to reproduce or judge it is recorded on the row: the exact engine config
    version, the engine/CUDA/driver versions and GPUs the host reported (``environment``), the
    profile version and the load generator's version. Headline numbers are columns so the
    history can filter and sort 10,000+ runs in SQL; the full summary, per-stage summaries,
    server-side breakdown and latency distributions are JSON; the per-second timeline is
    ``RunPoint`` rows and the per-request records one compressed ``RunRequestLog`` blob, so a
    100,000-request run costs the run page nothing until someone exports it.
    """

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
    load_profile = models.ForeignKey(
        LoadProfile,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="runs",
        help_text="Empty for an imported result that did not say what load it applied.",
    )
    label = models.CharField(max_length=100, blank=True)
    load_override = models.JSONField(
        default=dict,
        blank=True,
        help_text='The profile run at another load: {"mode": "rate"|"concurrency", "value": x} '
        "(a sweep's search); empty: the profile as saved.",
    )
    source = models.CharField(max_length=16, choices=RunSource.choices, default=RunSource.PANEL)
    # Snapshots taken when the run starts: the deployment may be edited later, and imported
    # runs carry what their file says.
    engine = models.CharField(max_length=16, blank=True, db_index=True)
    engine_version = models.CharField(max_length=40, blank=True)
    model_name = models.CharField(max_length=200, blank=True, db_index=True)
    gpu_model = models.CharField(max_length=100, blank=True, db_index=True)
    gpu_count = models.PositiveSmallIntegerField(null=True, blank=True)
    loadgen_version = models.CharField(max_length=40, blank=True)
    environment = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the host reported at the start: driver, CUDA, engine, GPUs, spec.",
    )
    # Progress while it runs.
    planned_requests = models.PositiveIntegerField(null=True, blank=True)
    planned_duration_s = models.FloatField(null=True, blank=True)
    progress = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    cancel_requested = models.BooleanField(default=False)
    error_rate_limit = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="The share of failed requests above which the run stops and fails (its "
        "profile's max_error_rate, else the panel's default), fixed when it started. Empty "
        "for an imported run.",
    )
    # Headline results (measured requests only: warm-up excluded).
    duration_s = models.FloatField(null=True, blank=True)
    completed = models.PositiveIntegerField(null=True, blank=True)
    failed = models.PositiveIntegerField(null=True, blank=True)
    error_rate = models.FloatField(null=True, blank=True)
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    ttft_p95_ms = models.FloatField(null=True, blank=True)
    ttft_p99_ms = models.FloatField(null=True, blank=True)
    itl_p50_ms = models.FloatField(null=True, blank=True)
    itl_p95_ms = models.FloatField(null=True, blank=True)
    itl_p99_ms = models.FloatField(null=True, blank=True)
    tpot_p50_ms = models.FloatField(null=True, blank=True)
    e2el_p99_ms = models.FloatField(null=True, blank=True)
    request_throughput = models.FloatField(null=True, blank=True, help_text="Successful req/s.")
    output_tokens_per_s = models.FloatField(null=True, blank=True)
    input_tokens_total = models.PositiveBigIntegerField(null=True, blank=True)
    output_tokens_total = models.PositiveBigIntegerField(null=True, blank=True)
    goodput_rps = models.FloatField(
        null=True, blank=True, help_text="Requests/s meeting every SLO of the profile."
    )
    goodput_share = models.FloatField(null=True, blank=True)
    hourly_price = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text=(
            "Per hour when the run finished: the share of the host's price paying for the "
            "GPUs the run used (host price × GPUs used ÷ host GPUs)."
        ),
    )
    currency = models.CharField(max_length=3, blank=True)
    cost_per_million_output = models.FloatField(
        null=True,
        blank=True,
        help_text="At the measured throughput, fully utilised: hourly price / tokens per hour.",
    )
    summary = models.JSONField(
        default=dict,
        blank=True,
        help_text="The load generator's whole summary (vllm bench serve names).",
    )
    stages = models.JSONField(default=dict, blank=True, help_text="Summary per stage.")
    server = models.JSONField(
        default=dict,
        blank=True,
        help_text="The engine's /metrics: queue/prefill/decode, prefix cache, KV, preemptions.",
    )
    distributions = models.JSONField(
        default=dict, blank=True, help_text="Quantiles of TTFT/ITL/TPOT/E2EL for CDF charts."
    )
    notes = models.JSONField(default=list, blank=True)
    # Small (a dozen numbers) and read by every consumer of runs as evidence, so it is not one
    # of the deferred RUN_DOCUMENTS: judging a page of runs costs no query per run.
    client_health = models.JSONField(
        default=dict,
        blank=True,
        help_text="The load generator's own health over the run (event-loop lag, CPU share, "
        "late sends, tokens per chunk, client errors) beside the engine's own TTFT/ITL of the "
        "same window; benchmarks.evidence judges it. Empty: not measured (older or imported).",
    )
    stopped_early = models.CharField(max_length=300, blank=True)
    shards = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_SHARDS)],
        help_text="Load generator processes (Celery workers of the loadgen queue) sending the "
        "run's one schedule between them; 1: the run's own worker sends it all.",
    )

    class Meta(BackgroundOperation.Meta):
        indexes = [
            models.Index(fields=["deployment", "-created_at"], name="run_deployment_recent"),
            models.Index(fields=["load_profile", "-created_at"], name="run_profile_recent"),
            # The history sorts by every key number; with 10,000+ runs an index per column
            # turns a sort of the whole table into an index walk.
            *(models.Index(fields=[column], name=f"run_{column}") for column in SORTED_COLUMNS),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(progress__gte=0.0) & models.Q(progress__lte=1.0),
                name="run_progress_fraction",
            ),
            # Two load tests on one engine at once would measure each other.
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(status__in=["queued", "running"]),
                name="run_one_active_per_deployment",
            ),
        ]

    def __str__(self) -> str:
        return self.label or f"run #{self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("benchmarks:detail", args=[self.pk])

    @property
    def profile_spec(self) -> dict:
        """The profile document this run drove: its profile as saved, at the overridden
        load when a sweep's search chose another (``load_override``)."""
        spec = self.load_profile.spec if self.load_profile is not None else {}
        return spec_with_override(spec, self.load_override)

    @property
    def load_text(self) -> str:
        """The overridden load in words ("12.5 req/s", "32 users"); empty when none."""
        override = self.load_override or {}
        if not override:
            return ""
        if override.get("mode") == "concurrency":
            return f"{int(override['value'])} concurrent users"
        return f"{float(override['value']):.3g} req/s"

    @property
    def numbered_name(self) -> str:
        """How a run is named among others (compare, charts, the cost page): "#12 tp2"."""
        return f"#{self.pk} {self.label}".strip() if self.label else f"#{self.pk}"

    @property
    def source_choice(self) -> RunSource:
        return RunSource(self.source)

    @property
    def cancellable(self) -> bool:
        return self.status in (OperationStatus.QUEUED, OperationStatus.RUNNING)

    @property
    def has_results(self) -> bool:
        return self.completed is not None


class RunPoint(models.Model):
    """One second of a run as the load generator saw it (rolling TTFT percentiles, tokens/s,
    requests in flight, the engine's queue and KV use) plus the deployment's GPU readings of
    that second: the live charts' data and their backfill after a dropped socket."""

    run = models.ForeignKey(BenchmarkRun, on_delete=models.CASCADE, related_name="points")
    t = models.FloatField(help_text="Seconds since the run's clock started.")
    data = models.JSONField()

    class Meta:
        ordering = ["run", "t"]
        constraints = [models.UniqueConstraint(fields=["run", "t"], name="runpoint_unique_t")]

    def __str__(self) -> str:
        return f"{self.run} @ {self.t:.0f} s"


class RunRequestLog(models.Model):
    """Every measured request of a run, columnar and compressed (``benchmarks.records``):
    about 25 bytes a request, read only by exports and never by a page."""

    run = models.OneToOneField(
        BenchmarkRun, on_delete=models.CASCADE, primary_key=True, related_name="request_log"
    )
    count = models.PositiveIntegerField()
    data = models.BinaryField()

    def __str__(self) -> str:
        return f"{self.count} requests of {self.run}"


class RunShard(models.Model):
    """One shard of a sharded run (``BenchmarkRun.shards`` > 1): a load generator on a worker
    of the ``loadgen`` queue sending request numbers ``i % shards == number`` of the run's one
    schedule (``benchmarks.services.shards``). The row is where the coordinator and the shard
    meet (the shard checks in ready, the coordinator writes the shared start time and, to
    stop it early, a reason) and, once the run is over, the shard's health as the run page
    shows it: who ran it, what it sent, its clock's offset to the reference and how late its
    sends were against the schedule."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        STARTING = "starting", "Starting"
        READY = "ready", "Ready"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    run = models.ForeignKey(BenchmarkRun, on_delete=models.CASCADE, related_name="run_shards")
    number = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    hostname = models.CharField(max_length=200, blank=True, help_text="The Celery worker.")
    pid = models.PositiveIntegerField(null=True, blank=True)
    start_at = models.FloatField(
        null=True, blank=True, help_text="The shared start, seconds on the reference clock."
    )
    stop_reason = models.CharField(
        max_length=300, blank=True, help_text="Set by the coordinator: stop sending, why."
    )
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    sent = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    offset_ms = models.FloatField(null=True, blank=True)
    offset_uncertainty_ms = models.FloatField(null=True, blank=True)
    late_p99_ms = models.FloatField(
        null=True, blank=True, help_text="How late its sends were against the schedule, p99."
    )
    behind = models.BooleanField(
        default=False, help_text="Its sends fell behind the schedule: it measured itself."
    )
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="runshard_unique_number")
        ]

    def __str__(self) -> str:
        return f"shard {self.number} of {self.run}"

    @property
    def health(self) -> dict:
        """What the run page's table and the export say of the shard."""
        return {
            "shard": self.number,
            "status": self.status,
            "hostname": self.hostname,
            "pid": self.pid,
            "sent": self.sent,
            "done": self.done,
            "failed": self.failed,
            "offset_ms": self.offset_ms,
            "offset_uncertainty_ms": self.offset_uncertainty_ms,
            "late_p99_ms": self.late_p99_ms,
            "behind": self.behind,
            "error": self.error,
        }


class RunShardChunk(models.Model):
    """What a shard sends its coordinator through the database, a piece at a time: each
    second's tick (merged into the run's live points), its records in chunks (never one giant
    message) and its report. zlib-compressed JSON; deleted once the run's results are stored."""

    class Kind(models.TextChoices):
        TICK = "tick", "Tick"
        RECORDS = "records", "Records"
        REPORT = "report", "Report"

    shard = models.ForeignKey(RunShard, on_delete=models.CASCADE, related_name="chunks")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    seq = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        ordering = ["shard", "kind", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["shard", "kind", "seq"], name="runshardchunk_unique")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.seq} of {self.shard}"


class ImportJob(BackgroundOperation):
    """One uploaded result file being read into a run in the background.

    An upload of up to ``MAX_UPLOAD_BYTES`` is saved owner-only under ``VAR_DIR/imports``
    (``path``) and read by a Celery task as a stream, so neither the web process nor the
    worker ever holds the whole file. The task records how far it got (``bytes_read`` of
    ``bytes_total``, ``phase``) for the import page to show, then links the ``run`` it made
    or says in ``error`` why there is none. The file is deleted when the job ends, either way.
    """

    deployment = models.ForeignKey(
        "hosts.Deployment", on_delete=models.CASCADE, related_name="import_jobs"
    )
    engine_config = models.ForeignKey(
        "hosts.EngineConfig", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    label = models.CharField(max_length=100, blank=True)
    benchmark = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Which benchmark of a GuideLLM file (1 = the first; empty: the first).",
    )
    filename = models.CharField(max_length=255, help_text="The uploaded file's name.")
    path = models.CharField(
        max_length=500, blank=True, help_text="The saved upload; empty once deleted."
    )
    bytes_total = models.BigIntegerField(default=0)
    bytes_read = models.BigIntegerField(default=0)
    progress = models.FloatField(default=0.0)
    phase = models.CharField(max_length=60, blank=True, help_text="What the task is doing.")
    run = models.OneToOneField(
        BenchmarkRun,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="import_job",
    )

    def __str__(self) -> str:
        return f"import #{self.pk} of {self.filename}"

    def get_absolute_url(self) -> str:
        return reverse("benchmarks:import_job", args=[self.pk])


class Price(models.Model):
    """What an hour of an instance type costs under one pricing (on-demand, reserved, spot),
    and which hosts are that instance type. A host without a price here is priced at its own
    ``hourly_price`` (taken as on-demand)."""

    name = models.CharField(max_length=100, help_text="Instance type, e.g. p5.48xlarge.")
    pricing = models.CharField(max_length=16, choices=Pricing.choices, default=Pricing.ON_DEMAND)
    hourly_price = models.DecimalField(
        max_digits=10, decimal_places=4, validators=[MinValueValidator(0)]
    )
    currency = models.CharField(max_length=3, default=default_currency)
    gpu_model = models.CharField(max_length=100, blank=True)
    gpu_count = models.PositiveSmallIntegerField(null=True, blank=True)
    hosts = models.ManyToManyField("hosts.Host", blank=True, related_name="prices")
    note = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "pricing"]
        constraints = [
            models.UniqueConstraint(fields=["name", "pricing"], name="price_unique_pricing")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_pricing_display()})"


# Quality probes live in their own module; imported here so Django registers them.
from benchmarks.models_quality import ProbeResult, ProbeRun, ProbeSet  # noqa: E402, F401
