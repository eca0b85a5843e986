"""The engine's own view: scrape ``/metrics`` around and during a run.

Histogram deltas between the first and last scrape split TTFT into queueing and prompt
processing as the server saw them; gauges sampled every second show KV-cache use and queue
length over time. Both vLLM (``vllm:``) and SGLang (``sglang:``) names are understood.
"""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Our name → (vLLM name, SGLang name) without the prefix.
GAUGES = {
    "running": ("num_requests_running", "num_running_reqs"),
    "waiting": ("num_requests_waiting", "num_queue_reqs"),
    "kv_cache_usage": ("kv_cache_usage_perc", "token_usage"),
}
COUNTERS = {
    "prompt_tokens": ("prompt_tokens", "prompt_tokens"),
    "generation_tokens": ("generation_tokens", "generation_tokens"),
    "preemptions": ("num_preemptions", None),
    "prefix_cache_queries": ("prefix_cache_queries", None),
    "prefix_cache_hits": ("prefix_cache_hits", None),
}
HISTOGRAMS = {
    "ttft": ("time_to_first_token_seconds", "time_to_first_token_seconds"),
    "itl": ("inter_token_latency_seconds", "inter_token_latency_seconds"),
    "e2e": ("e2e_request_latency_seconds", "e2e_request_latency_seconds"),
    "queue": ("request_queue_time_seconds", "queue_time_seconds"),
    "prefill": ("request_prefill_time_seconds", None),
    "decode": ("request_decode_time_seconds", None),
}


def parse(text: str) -> dict:
    """A flat snapshot: gauges, counters, histogram sums/counts, summed over label sets."""
    values: dict[str, float] = {}
    engine = None
    for family in text_string_to_metric_families(text):
        name = family.name
        prefix, _, short = name.partition(":")
        if prefix not in ("vllm", "sglang"):
            continue
        engine = prefix
        column = 0 if prefix == "vllm" else 1
        short = short.removesuffix("_total")  # untyped expositions keep the suffix
        for ours, names in GAUGES.items():
            if names[column] == short:
                values[ours] = sum(s.value for s in family.samples)
        for ours, names in COUNTERS.items():
            if names[column] == short:
                values[ours] = sum(s.value for s in family.samples if s.name.endswith("_total"))
        for ours, names in HISTOGRAMS.items():
            if names[column] == short:
                for sample in family.samples:
                    if sample.name.endswith("_sum"):
                        values[f"{ours}_sum"] = values.get(f"{ours}_sum", 0) + sample.value
                    elif sample.name.endswith("_count"):
                        values[f"{ours}_count"] = values.get(f"{ours}_count", 0) + sample.value
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
    queries, hits = out.get("prefix_cache_queries"), out.get("prefix_cache_hits")
    if queries:
        out["prefix_cache_hit_rate"] = hits / queries
    return out


class Scraper:
    """Takes snapshots of one engine's /metrics; missing metrics are reported, not fatal."""

    def __init__(self, client: httpx.AsyncClient, url: str):
        self.client = client
        self.url = url
        self.first: dict | None = None
        self.last: dict | None = None
        self.timeline: list[dict] = []
        self.error: str | None = None

    async def snapshot(self, at: float) -> dict | None:
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
