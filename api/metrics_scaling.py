"""The ``llmpanel_deployment_*`` families of ``/metrics``: each deployment's live signals,
its replica's capacity at the SLO and the desired replicas of its group, read from
``scaling.services.state.fleet_states()`` (a bounded number of queries).

Names, help and labels come from ``scaling.planning.series``. A value the panel does not have
(no signals yet, signals gone stale, no benchmark to measure capacity by) is left out, never
written as 0 or NaN: a 0 would read as "idle" to a scaler and an alert."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from scaling.planning.series import LABELS, SERIES
from scaling.planning.types import WINDOWS
from scaling.services.state import ScalingState, fleet_states

# Series read straight off the signals (per deployment, no window).
SIGNAL_FIELDS = {
    "requests_waiting": "requests_waiting",
    "requests_running": "requests_running",
    "pending_prompt_tokens": "pending_prompt_tokens",
    "kv_cache_usage_ratio": "kv_cache_usage_ratio",
    "preemptions_per_second": "preemptions_per_s",
    "input_tokens_per_second": "input_tokens_per_s",
    "output_tokens_per_second": "output_tokens_per_s",
    "arrival_requests_per_second": "arrival_rps",
}


def scaling_families(states: list[ScalingState] | None = None) -> list[GaugeMetricFamily]:
    """One family per series of the registry, with a sample for every deployment that has
    the value."""
    states = fleet_states() if states is None else states
    families = {
        s.key: GaugeMetricFamily(s.name, s.help, labels=[*LABELS, *s.extra_labels]) for s in SERIES
    }
    for state in states:
        for key, labels, value in _values(state):
            if key in families and value is not None:
                families[key].add_metric(
                    [state.deployment, state.model, state.host, *labels], value
                )
    return list(families.values())


def _values(state: ScalingState):
    """``(series key, extra label values, value)`` of one deployment."""
    signals = state.signals
    if signals is None and state.capacity.rps is None and state.signals_age_s is None:
        return  # nothing known: the deployment is not exported at all
    if signals is not None:
        for key, attr in SIGNAL_FIELDS.items():
            yield key, (), getattr(signals, attr)
        for name, windows in (("ttft", signals.ttft), ("itl", signals.itl)):
            for window in WINDOWS:
                got = windows.get(window)
                if got is not None:
                    yield f"{name}_p50_seconds", (window,), got.p50
                    yield f"{name}_p95_seconds", (window,), got.p95
    yield "signals_age_seconds", (), state.signals_age_s
    yield "capacity_rps_at_slo", (), state.capacity.rps
    yield "slo_ttft_p95_seconds", (), state.slo.ttft_p95_ms / 1000.0
    yield "replicas", (), float(state.decision.current)
    if state.decision.status != "unknown":
        # "unknown" keeps the current count: not a recommendation a scaler should follow.
        yield "desired_replicas", (), float(state.decision.desired)
