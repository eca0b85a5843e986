"""The value types the planning modules pass to each other and to the panel (pure).

Every type turns into a JSON-safe dict (``as_dict``) and back (``from_dict``): signals are
stored on each engine sample, capacity and decisions are served by the API and the pages.
Times are epoch seconds; latencies in the ``*_ms`` fields are milliseconds, in ``Window``
seconds (as the engines' histograms and the exported series are).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

# The two windows every percentile signal is computed over, as the exported label says them.
WINDOWS = {"1m": 60.0, "5m": 300.0}


class _Dict:
    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names})


@dataclass(frozen=True)
class Window(_Dict):
    """Percentiles of one histogram over a trailing window, from bucket-count deltas (what
    ``histogram_quantile(q, rate(x_bucket[w]))`` computes). ``seconds`` is the span actually
    covered (shorter than asked while the panel has polled for less); ``requests`` the
    observations in it. p50/p95 are None when nothing was observed."""

    seconds: float = 0.0
    requests: float = 0.0
    p50: float | None = None
    p95: float | None = None


@dataclass(frozen=True)
class Signals(_Dict):
    """What one engine is going through now, computed by the panel from its /metrics.

    Gauges are the newest snapshot's; rates are over the last minute (counter deltas);
    percentiles per window in ``ttft`` / ``itl`` keyed by ``WINDOWS``. ``pending_basis``
    says how ``pending_prompt_tokens`` was obtained: neither engine exports the prompt
    tokens still waiting, so it is estimated (waiting requests × mean prompt length of the
    requests finished in the last 5 minutes) and says so."""

    at: float = 0.0
    engine: str = ""
    requests_waiting: float | None = None
    requests_running: float | None = None
    pending_prompt_tokens: float | None = None
    pending_basis: str = ""
    kv_cache_usage_ratio: float | None = None
    preemptions_per_s: float | None = None
    input_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    finished_rps: float | None = None
    # Requests arriving per second: finished plus the growth of waiting + running over the
    # minute (finished alone hides demand an overloaded engine cannot serve yet).
    arrival_rps: float | None = None
    ttft: dict[str, Window] = field(default_factory=dict)
    itl: dict[str, Window] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = asdict(self)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Signals:
        data = dict(data or {})
        for key in ("ttft", "itl"):
            data[key] = {w: Window.from_dict(v) for w, v in (data.get(key) or {}).items()}
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class SLO(_Dict):
    """The service level one replica must keep: p95 TTFT (always), p95 ITL (optional), and
    the share of failed requests above which a load level does not count as served."""

    ttft_p95_ms: float = 500.0
    itl_p95_ms: float | None = None
    max_error_rate: float = 0.01


@dataclass(frozen=True)
class LoadPoint(_Dict):
    """One measured load level on one replica: a stage of a benchmark run, or a sweep trial's
    measured limit. ``mode`` is "rate" (open loop, ``offered`` requests/s) or "concurrency"
    (closed loop, ``offered`` clients). Engine-side gauges come from the run's /metrics
    scrape during that stage; None when the run had none."""

    source: str = "run"  # "run" or "sweep"
    run_id: int | None = None
    run_name: str = ""
    stage: str = ""
    sweep_id: int | None = None
    mode: str = "rate"
    offered: float = 0.0
    achieved_rps: float | None = None
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    error_rate: float = 0.0
    waiting_mean: float | None = None
    waiting_max: float | None = None
    running_mean: float | None = None
    kv_usage_max: float | None = None
    output_tokens_per_s: float | None = None
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True)
class Capacity(_Dict):
    """The most load one replica of a config carried within the SLO, with its evidence.

    ``status``: "measured" (a point met the SLO and a higher one broke it: the limit lies
    between them), "above_tested" (every point met it: at least ``rps``), "none_meets" (even
    the lightest point broke it), "no_evidence" (no finished run of this config and profile).
    ``queue_at_breach`` / ``kv_at_breach`` / ``pending_tokens_at_breach``: the engine's
    waiting requests, KV use and pending prompt tokens where p95 TTFT crossed the SLO
    (interpolated between the last good and the first breaking point)."""

    status: str = "no_evidence"
    slo: SLO = field(default_factory=SLO)
    rps: float | None = None
    concurrency: float | None = None
    best: LoadPoint | None = None
    breach: LoadPoint | None = None
    queue_at_breach: float | None = None
    kv_at_breach: float | None = None
    pending_tokens_at_breach: float | None = None
    explanation: str = ""

    @classmethod
    def from_dict(cls, data: dict) -> Capacity:
        data = dict(data or {})
        data["slo"] = SLO.from_dict(data.get("slo") or {})
        for key in ("best", "breach"):
            if data.get(key) is not None:
                data[key] = LoadPoint.from_dict(data[key])
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class PolicyConfig(_Dict):
    """How a deployment's model is to scale. ``target`` is the share of the measured capacity
    each replica is planned to carry (headroom for bursts); a scale-down waits
    ``stabilisation_s`` of lower demand; ``engine_start_s`` is the measured time a new
    replica takes to serve (from the deployment's engine starts), which the warm minimum and
    the forecast cover."""

    min_replicas: int = 1
    max_replicas: int = 8
    target: float = 0.8
    stabilisation_s: float = 300.0
    cooldown_s: float = 300.0
    polling_interval_s: float = 15.0
    engine_start_s: float | None = None


@dataclass(frozen=True)
class Thresholds(_Dict):
    """Per-replica values a scaler compares the summed series with (KEDA's AverageValue:
    desired = ceil(sum / threshold)), each derived from ``Capacity`` and named with it.
    ``activation_*``: below it the scaler may go to its minimum."""

    requests_waiting: float | None = None
    activation_requests_waiting: float | None = None
    pending_prompt_tokens: float | None = None
    requests_per_s: float | None = None
    kv_cache_usage_ratio: float | None = None
    ttft_p95_seconds: float | None = None
    itl_p95_seconds: float | None = None
    evidence: str = ""


@dataclass(frozen=True)
class Decision(_Dict):
    """Desired replicas now for a deployment's replica group, and why. ``status``: "ok",
    "under" (more replicas needed than run), "over" (fewer would do), "unknown" (no signals or
    no capacity to judge by: ``desired`` then stays at ``current``)."""

    current: int = 1
    desired: int = 1
    raw_desired: int = 1  # before hysteresis and bounds
    status: str = "unknown"
    demand_rps: float | None = None
    forecast_rps: float | None = None  # demand expected once a replica started now serves
    warm_minimum: int = 1
    reason: str = ""
    thresholds: Thresholds = field(default_factory=Thresholds)

    @classmethod
    def from_dict(cls, data: dict) -> Decision:
        data = dict(data or {})
        data["thresholds"] = Thresholds.from_dict(data.get("thresholds") or {})
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class ExportTarget(_Dict):
    """What the export files are written for: one deployment's replica group, the
    Kubernetes object to scale, the Prometheus that scrapes the panel, and the thresholds
    (with the run they came from)."""

    deployment: str = ""
    deployment_id: int = 0
    host: str = ""
    model: str = ""
    engine: str = ""
    scale_target: str = ""  # the Kubernetes Deployment/StatefulSet; default: deployment name
    scale_target_kind: str = "Deployment"
    namespace: str = "default"
    prometheus_url: str = "http://prometheus.monitoring.svc:9090"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    thresholds: Thresholds = field(default_factory=Thresholds)
    slo: SLO = field(default_factory=SLO)

    @classmethod
    def from_dict(cls, data: dict) -> ExportTarget:
        data = dict(data or {})
        for key, kind in (("policy", PolicyConfig), ("thresholds", Thresholds), ("slo", SLO)):
            if isinstance(data.get(key), dict):
                data[key] = kind.from_dict(data[key])
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
