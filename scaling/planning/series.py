"""The series the panel exports per deployment on its ``/metrics`` (one definition: the
exporter, the KEDA and alert exports and the Grafana dashboard all read names from here)."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "llmpanel_deployment_"
LABELS = ("deployment", "model", "host")


@dataclass(frozen=True)
class Series:
    """One exported gauge: its key (the name without the prefix), help text and any labels
    beyond ``LABELS`` (``window`` for the percentile series: "1m" or "5m")."""

    key: str
    help: str
    extra_labels: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return PREFIX + self.key


SERIES: tuple[Series, ...] = (
    Series("requests_waiting", "Requests queued in the engine, not yet scheduled."),
    Series("requests_running", "Requests in the engine's running batch."),
    Series(
        "pending_prompt_tokens",
        "Prompt tokens of the waiting requests (estimated: waiting x mean prompt length of "
        "the last 5 minutes' requests; neither engine exports it).",
    ),
    Series("kv_cache_usage_ratio", "Share of the engine's KV-cache pool in use, 0-1."),
    Series("preemptions_per_second", "Requests preempted per second over the last minute."),
    Series("input_tokens_per_second", "Prompt tokens served per second over the last minute."),
    Series("output_tokens_per_second", "Tokens generated per second over the last minute."),
    Series(
        "arrival_requests_per_second",
        "Requests arriving per second over the last minute (finished + growth in the engine).",
    ),
    Series("ttft_p50_seconds", "Median time to first token over the window.", ("window",)),
    Series("ttft_p95_seconds", "p95 time to first token over the window.", ("window",)),
    Series("itl_p50_seconds", "Median inter-token latency over the window.", ("window",)),
    Series("itl_p95_seconds", "p95 inter-token latency over the window.", ("window",)),
    Series(
        "capacity_rps_at_slo",
        "Requests/s one replica of the running config carried within the SLO (benchmark).",
    ),
    Series("slo_ttft_p95_seconds", "The p95 TTFT the deployment's scaling policy keeps."),
    Series("replicas", "Running replicas of the deployment's model (its replica group)."),
    Series("desired_replicas", "Replicas the panel recommends for the group's load now."),
    Series(
        "signals_age_seconds",
        "Seconds since the engine's /metrics were last read by the panel.",
    ),
)

BY_KEY: dict[str, Series] = {s.key: s for s in SERIES}


def name(key: str) -> str:
    """The exported name of ``key`` (KeyError for a series that does not exist)."""
    return BY_KEY[key].name
