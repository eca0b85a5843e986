"""The numbers a benchmark run reports, defined once (pure: no Django).

Each ``Metric`` is one result column of ``BenchmarkRun``: its name, unit, which direction is
better, how it is shown, and the load generator's summary key it is read from (the names of
``vllm bench serve``). Every list of metrics in the panel derives from ``METRICS``: the
result columns a document fills (``RECORDED``), the history's sortable columns and their
indexes (``HISTORY``), the compare table (``COMPARED``), the verification verdict of a
change (``changes.advice``) and the importers' percentile keys (``LATENCIES``).
"""

from __future__ import annotations

from dataclasses import dataclass

LOWER = "lower"
HIGHER = "higher"
# Unit of a money metric: the run's own currency, only known per run.
CURRENCY = "currency"


@dataclass(frozen=True)
class Latency:
    """A per-request latency whose percentiles a run reports (in ms)."""

    key: str  # as in the summary keys: "ttft" in "p95_ttft_ms"
    label: str  # before a percentile: "TTFT p95"
    title: str  # alone, in chart titles

    @property
    def distribution(self) -> str:
        """Its key in ``BenchmarkRun.distributions`` (the CDF charts' quantiles)."""
        return f"{self.key}_ms"

    def summary_key(self, percentile: int) -> str:
        """The load generator's name of one percentile (p50 is the median)."""
        prefix = "median" if percentile == 50 else f"p{percentile}"
        return f"{prefix}_{self.key}_ms"


TTFT = Latency("ttft", "TTFT", "TTFT")
TPOT = Latency("tpot", "TPOT", "Time per output token")
ITL = Latency("itl", "ITL", "Inter-token latency")
E2EL = Latency("e2el", "End-to-end", "End-to-end latency")
# In the order runs' distributions list them.
LATENCIES = (TTFT, ITL, TPOT, E2EL)


@dataclass(frozen=True)
class Metric:
    """One headline number of a run: the ``BenchmarkRun`` column ``key``.

    ``better`` is LOWER, HIGHER or None (no verdict on a change); ``percent`` shows a
    fraction as a percentage (and a change of it in points), else ``digits`` decimals.
    ``short`` names it in the history's sort menu, ``heading`` above its history column
    (both default to ``label``).
    """

    key: str
    label: str
    unit: str = ""
    better: str | None = None
    digits: int = 0
    percent: bool = False
    summary_key: str | None = None  # where a result document has it; None: computed here
    integer: bool = False
    compared: bool = True  # a row of the compare table
    short: str = ""
    heading: str = ""
    flag_nonzero: bool = False  # any value above zero is shown as an error
    latency: Latency | None = None
    percentile: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "short", self.short or self.label)
        object.__setattr__(self, "heading", self.heading or self.short)

    def text(self, value) -> str:
        """``value`` as the compare page shows it ("—" when unknown)."""
        if value is None:
            return "—"
        if self.percent:
            return f"{value * 100:.1f} %"
        return f"{value:,.{self.digits}f}"


def _percentile(latency: Latency, percentile: int, digits: int, **options) -> Metric:
    return Metric(
        key=f"{latency.key}_p{percentile}_ms",
        label=f"{latency.label} p{percentile}",
        unit="ms",
        better=LOWER,
        digits=digits,
        summary_key=latency.summary_key(percentile),
        latency=latency,
        percentile=percentile,
        **options,
    )


# In the compare table's order: latencies, throughput, success, cost, counts.
METRICS: tuple[Metric, ...] = (
    _percentile(TTFT, 50, 0),
    _percentile(TTFT, 95, 0, heading="p95"),
    _percentile(TTFT, 99, 0, heading="p99"),
    _percentile(ITL, 50, 1),
    _percentile(ITL, 95, 1, heading="p95"),
    _percentile(ITL, 99, 1, heading="p99"),
    _percentile(TPOT, 50, 1),
    _percentile(E2EL, 99, 0),
    Metric(
        "output_tokens_per_s",
        "Output tokens/s",
        "tok/s",
        HIGHER,
        summary_key="output_throughput",
        short="Output tok/s",
    ),
    Metric(
        "request_throughput",
        "Successful requests/s",
        "req/s",
        HIGHER,
        2,
        summary_key="request_throughput",
    ),
    Metric("goodput_rps", "Goodput", "req/s", HIGHER, 2, summary_key="request_goodput"),
    Metric(
        "goodput_share",
        "Requests meeting the SLO",
        better=HIGHER,
        percent=True,
        summary_key="goodput_share",
        short="Goodput",
    ),
    Metric(
        "error_rate",
        "Error rate",
        better=LOWER,
        percent=True,
        summary_key="error_rate",
        short="Errors",
        flag_nonzero=True,
    ),
    Metric(
        "cost_per_million_output",
        "Cost per 1M output tokens",
        CURRENCY,
        LOWER,
        3,
        short="Per 1M output",
    ),
    Metric("completed", "Succeeded", summary_key="completed", integer=True),
    Metric("failed", "Failed", better=LOWER, summary_key="failed", integer=True),
    Metric("duration_s", "Duration", "s", digits=1, summary_key="duration"),
    Metric(
        "input_tokens_total",
        "Input tokens",
        summary_key="total_input_tokens",
        integer=True,
        compared=False,
    ),
    Metric(
        "output_tokens_total",
        "Output tokens",
        summary_key="total_output_tokens",
        integer=True,
        compared=False,
    ),
)
BY_KEY: dict[str, Metric] = {metric.key: metric for metric in METRICS}


def pick(*keys: str) -> tuple[Metric, ...]:
    """The metrics named ``keys``, in that order (a KeyError names an unknown one)."""
    return tuple(BY_KEY[key] for key in keys)


# What a result document fills in: column ← summary key.
RECORDED = tuple(metric for metric in METRICS if metric.summary_key)
COMPARED = tuple(metric for metric in METRICS if metric.compared)
# The history's number columns, left to right (also its sorts and the table's indexes).
HISTORY = pick(
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p95_ms",
    "itl_p99_ms",
    "output_tokens_per_s",
    "error_rate",
    "goodput_share",
    "cost_per_million_output",
)


def numbers(run, metrics: tuple[Metric, ...] = METRICS) -> dict:
    """``{key: value}`` of ``metrics`` read off a run (any object with the columns as
    attributes); empty for no run."""
    if run is None:
        return {}
    return {metric.key: getattr(run, metric.key) for metric in metrics}
