"""An engine's /metrics text → a snapshot the signals are computed from (pure).

The snapshot keeps what a rate or a percentile over a window needs: gauges as they are now,
cumulative counters, and each histogram's cumulative buckets. Values are summed over label
sets (several engines behind one API server, several ``model_name`` or ``finished_reason``
children); the names come from the one table of engine metric names,
``hosts.engines.metrics``, so vLLM and SGLang, and older releases' names, read alike.

``quantile`` is Prometheus's ``histogram_quantile`` over bucket deltas.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from hosts.engines.metrics import ENGINE_PREFIXES, lookup

GAUGES = ("running", "waiting", "kv_cache_usage")
COUNTERS = ("prompt_tokens", "generation_tokens", "preemptions", "requests_finished")
HISTOGRAMS = ("ttft", "itl", "prompt_len", "queue")
# Read when the engine exports it; its absence is not worth reporting.
OPTIONAL = frozenset(("queue",))
# A ratio per engine: the deployment's share is the mean over engines (pools of one
# deployment's engines are the same size), never their sum.
RATIOS = frozenset(("kv_cache_usage",))
_READ = frozenset((*GAUGES, *COUNTERS, *HISTOGRAMS))
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def _replica_rank(labels: dict) -> bool:
    """Whether a sample comes from an SGLang scheduler of tensor- or pipeline-parallel rank
    above 0: every rank observes the same requests (``queue_time_seconds`` once per rank),
    so only rank 0's count; data-parallel ranks serve different requests and are summed."""
    return labels.get("tp_rank", "0") != "0" or labels.get("pp_rank", "0") != "0"


def _find(name: str):
    """``(metric, rank)`` for a family we read, or None. A histogram exposed without a
    ``# TYPE`` line arrives as untyped families named ``…_bucket`` / ``…_count`` / ``…_sum``."""
    found = lookup(name)
    if found is None:
        for suffix in _HISTOGRAM_SUFFIXES:
            if name.endswith(suffix):
                base = lookup(name.removesuffix(suffix))
                if base is not None and base[1].kind == "histogram":
                    found = base
                break
    if found is None or found[1].key not in _READ:
        return None
    return found[1], found[2]


class _Histogram:
    """Buckets per label set, summed at the end over the bounds every label set has."""

    def __init__(self):
        self.buckets: dict[tuple, dict[float, float]] = {}
        self.count = 0.0
        self.sum = 0.0
        self.has_count = False

    def add(self, sample) -> None:
        name = sample.name
        if name.endswith("_bucket"):
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            self.buckets.setdefault(labels, {})[float(sample.labels["le"])] = sample.value
        elif name.endswith("_count"):
            self.count += sample.value
            self.has_count = True
        elif name.endswith("_sum"):
            self.sum += sample.value

    def as_dict(self) -> dict:
        per_set = list(self.buckets.values())
        common = set.intersection(*(set(b) for b in per_set)) if per_set else set()
        le = sorted(b for b in common if math.isfinite(b))
        counts = [sum(b[bound] for b in per_set) for bound in le]
        count = self.count
        if not self.has_count:
            count = sum(b.get(math.inf, 0.0) for b in per_set)
        return {"le": le, "counts": counts, "count": count, "sum": self.sum}


def parse_snapshot(text: str) -> dict:
    """``{"engine", "gauges", "counters", "histograms", "missing"}`` from an exposition.

    ``engine`` is "vllm" or "sglang" by the families' prefix (None: no engine metrics).
    A release that exports a quantity under its new and its deprecated name reports the
    same numbers twice: the newest name's are kept, never their sum. Raises ValueError on
    text that is not a Prometheus exposition."""
    engine = None
    # key → rank → accumulated values; the lowest rank (newest name) wins at the end.
    gauges: dict[str, dict[int, list[float]]] = {}
    counters: dict[str, dict[int, float]] = {}
    histograms: dict[str, dict[int, _Histogram]] = {}
    for family in text_string_to_metric_families(text):
        prefix = family.name.partition(":")[0]
        if prefix + ":" not in ENGINE_PREFIXES.values():
            continue
        engine = prefix
        found = _find(family.name)
        if found is None:
            continue
        metric, rank = found
        samples = [s for s in family.samples if not _replica_rank(s.labels)]
        if metric.kind == "gauge":
            gauges.setdefault(metric.key, {}).setdefault(rank, []).extend(s.value for s in samples)
        elif metric.kind == "counter":
            # Typed counters carry ``_total`` and ``_created`` samples; only the first counts.
            total = sum(s.value for s in samples if not s.name.endswith("_created"))
            by_rank = counters.setdefault(metric.key, {})
            by_rank[rank] = by_rank.get(rank, 0.0) + total
        else:
            hist = histograms.setdefault(metric.key, {}).setdefault(rank, _Histogram())
            for sample in samples:
                hist.add(sample)
    out_gauges = {}
    for key, by_rank in gauges.items():
        values = by_rank[min(by_rank)]
        if values:
            total = sum(values)
            out_gauges[key] = total / len(values) if key in RATIOS else total
    out_counters = {key: by_rank[min(by_rank)] for key, by_rank in counters.items()}
    out_histograms = {key: by_rank[min(by_rank)].as_dict() for key, by_rank in histograms.items()}
    found_keys = set(out_gauges) | set(out_counters) | set(out_histograms)
    missing = [k for k in (*GAUGES, *COUNTERS, *HISTOGRAMS) if k not in found_keys]
    return {
        "engine": engine,
        "gauges": out_gauges,
        "counters": out_counters,
        "histograms": out_histograms,
        "missing": [k for k in missing if k not in OPTIONAL],
    }


def quantile(q: float, le: list[float], counts_delta: list[float], count_delta: float):
    """The ``q`` quantile of the observations in a window, as Prometheus's
    ``histogram_quantile`` computes it: find the bucket holding rank ``q × count`` and
    interpolate linearly inside it (a first bucket starts at 0). A rank in the +Inf bucket
    gives the highest finite bound; no observations give None.

    ``le`` are the finite upper bounds ascending, ``counts_delta`` the cumulative count
    increase at each, ``count_delta`` the increase of all observations (the +Inf bucket)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside 0..1")
    if not count_delta or count_delta <= 0 or not le:
        return None
    rank = q * count_delta
    below, lower = 0.0, 0.0
    for bound, cumulative in zip(le, counts_delta, strict=True):
        # Rounding and scrapes taken mid-update can leave a bucket below the one before it;
        # Prometheus reads them as monotonic, and so do we.
        cumulative = max(cumulative, below)
        if cumulative >= rank and cumulative > 0:
            if bound <= 0:
                return bound
            if cumulative == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        below, lower = cumulative, bound
    return le[-1]
