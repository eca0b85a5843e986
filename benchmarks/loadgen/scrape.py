"""The engine's own view: scrape ``/metrics`` around and during a run.

Histogram deltas between the first and last scrape split TTFT into queueing and prompt
processing as the server saw them; gauges sampled every second show KV-cache use and queue
length over time. Both vLLM (``vllm:``) and SGLang (``sglang:``) names are understood, older
releases' names too: they come from one table, ``hosts.engines.metrics``. The prefix-cache hit
rate comes from vLLM's prefix_cache_hits / prefix_cache_queries or SGLang's cached_tokens /
prompt_tokens counters.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hosts.engines.metrics import lookup

# Our keys, by kind: what a snapshot, the timeline and the deltas report.
GAUGES = ("running", "waiting", "kv_cache_usage")
COUNTERS = (
    "prompt_tokens",
    "generation_tokens",
    "preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "cached_prompt_tokens",
)
HISTOGRAMS = ("ttft", "itl", "e2e", "queue", "prefill", "decode")
# Histograms whose buckets are kept too, for the window's quantiles: the engine's own TTFT and
# ITL, which ``benchmarks.evidence`` holds the client's numbers against.
QUANTILE_HISTOGRAMS = ("ttft", "itl")
QUANTILES = (50, 95)
_READ = frozenset((*GAUGES, *COUNTERS, *HISTOGRAMS))


def _family_values(metric, family) -> dict[str, float]:
    if metric.kind == "gauge":
        return {metric.key: sum(s.value for s in family.samples)}
    if metric.kind == "counter":
        return {metric.key: sum(s.value for s in family.samples if s.name.endswith("_total"))}
    out = {f"{metric.key}_sum": 0.0, f"{metric.key}_count": 0.0}
    buckets: dict[float, float] = {}
    for sample in family.samples:
        if sample.name.endswith("_sum"):
            out[f"{metric.key}_sum"] += sample.value
        elif sample.name.endswith("_count"):
            out[f"{metric.key}_count"] += sample.value
        elif sample.name.endswith("_bucket") and metric.key in QUANTILE_HISTOGRAMS:
            le = float(sample.labels.get("le", "nan"))
            if le == le:
                buckets[le] = buckets.get(le, 0.0) + sample.value
    if buckets:
        out[f"{metric.key}_buckets"] = tuple(sorted(buckets.items()))
    return out


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0-1) of a histogram from cumulative ``(le, count)`` buckets, as
    PromQL's ``histogram_quantile`` estimates it: linear within the bucket the rank falls in;
    in the ``+Inf`` bucket, the highest finite bound. None when nothing was observed."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank and count > below:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = (le if le != float("inf") else lower), count
    return lower


def _bucket_delta(before: dict, after: dict, key: str) -> list[tuple[float, float]]:
    """The window's cumulative buckets (after minus before); empty when the bounds differ
    (an engine restarted with other buckets between the snapshots)."""
    late = after.get(f"{key}_buckets") or ()
    early = dict(before.get(f"{key}_buckets") or ())
    if early and set(early) != {le for le, _ in late}:
        return []
    return [(le, count - early.get(le, 0.0)) for le, count in late]


def parse(text: str) -> dict:
    """A flat snapshot: gauges, counters, histogram sums/counts, summed over label sets."""
    values: dict[str, float] = {}
    rank_of: dict[str, int] = {}  # key → rank of the name its values came from
    engine = None
    for family in text_string_to_metric_families(text):
        prefix = family.name.partition(":")[0]
        if prefix not in ("vllm", "sglang"):
            continue
        engine = prefix
        found = lookup(family.name)
        if found is None or found[1].key not in _READ:
            continue
        _, metric, rank = found
        # A release that exports a metric under its new and its deprecated name reports the
        # same numbers twice: keep the newest name's, never their sum.
        if rank_of.get(metric.key, rank) < rank:
            continue
        rank_of[metric.key] = rank
        values.update(_family_values(metric, family))
    values["engine"] = engine
    return values


def deltas(before: dict, after: dict) -> dict:
    """What happened between two snapshots: means of histograms, counter increases."""
    out: dict[str, float | None] = {"engine": after.get("engine") or before.get("engine")}
    for ours in COUNTERS:
        if ours in after:
            out[ours] = after[ours] - before.get(ours, 0)
    for ours in HISTOGRAMS:
        count = after.get(f"{ours}_count", 0) - before.get(f"{ours}_count", 0)
        total = after.get(f"{ours}_sum", 0) - before.get(f"{ours}_sum", 0)
        if f"{ours}_count" in after:
            out[f"server_mean_{ours}_ms"] = total / count * 1000 if count else None
            out[f"server_{ours}_count"] = count
    for ours in QUANTILE_HISTOGRAMS:
        window = _bucket_delta(before, after, ours)
        for q in QUANTILES if window else ():
            value = bucket_quantile(q / 100, window)
            out[f"server_p{q}_{ours}_ms"] = value * 1000 if value is not None else None
    out.update(_hit_rate(before, after, out))
    return out


def _hit_rate(before: dict, after: dict, out: dict) -> dict:
    """The prefix-cache hit rate over the window, in prompt tokens.

    vLLM: prefix_cache_hits / prefix_cache_queries (tokens looked up at admission).
    SGLang: cached_tokens / prompt_tokens, both counted per finished request over whole
    prompts; SGLang writes cached_tokens only once some request had a hit, so an exposition
    without it, but with prompt tokens, means none hit (0), not "unknown"."""
    queries, hits = out.get("prefix_cache_queries"), out.get("prefix_cache_hits")
    if queries:
        return {"prefix_cache_hit_rate": hits / queries}
    if (after.get("engine") or before.get("engine")) == "sglang":
        prompt = out.get("prompt_tokens")
        if prompt:
            cached = after.get("cached_prompt_tokens", 0) - before.get("cached_prompt_tokens", 0)
            return {"prefix_cache_hit_rate": cached / prompt}
    return {}


class Scraper:
    """Takes snapshots of one engine's /metrics; missing metrics are reported, not fatal."""

    def __init__(self, client: httpx.AsyncClient, url: str):
        self.client = client
        self.url = url
        self.first: dict | None = None
        self.last: dict | None = None
        self.timeline: list[dict] = []
        self.error: str | None = None
        # The per-second scrape runs in its own task (runner.LoadRun._ticker) while the run
        # takes its own snapshots after the warm-up and at the end: one request at a time,
        # so the snapshots stay in order and a slow engine is not asked twice at once.
        self._one_at_a_time = asyncio.Lock()

    async def snapshot(self, at: float) -> dict | None:
        async with self._one_at_a_time:
            return await self._snapshot(at)

    async def _snapshot(self, at: float) -> dict | None:
        try:
            response = await self.client.get(self.url, timeout=5)
            response.raise_for_status()
            snap = parse(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return None
        if snap.get("engine") is None:
            self.error = "no vllm: or sglang: metrics at " + self.url
            return None
        snap["t"] = at
        if self.first is None:
            self.first = snap
        self.last = snap
        self.timeline.append({k: snap.get(k) for k in ("t", *GAUGES)})
        return snap

    def report(self) -> dict:
        if self.first is None or self.last is None:
            return {"available": False, "error": self.error}
        return {
            "available": True,
            **deltas(self.first, self.last),
            "timeline": self.timeline,
            "kv_cache_usage_max": max((p["kv_cache_usage"] or 0) for p in self.timeline)
            if any("kv_cache_usage" in p for p in self.timeline)
            else None,
            "scraped_at": time.time(),
        }
