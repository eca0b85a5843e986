"""Scaler thresholds and desired replicas from a replica's measured capacity (pure).

A scaler (KEDA's AverageValue) divides the group's summed series by a per-replica threshold:
the thresholds here are the measured limits of one replica, planned at ``target`` of them.
``decide`` is the panel's own recommendation from the live signals: demand over what a
replica carries, looking ahead by the engine's start time (a replica asked for now serves only
then), with guardrails for what the rate misses (a queue building, latency already out of the
SLO), a warm minimum, and a scale-down that waits for the stabilisation window.
"""

from __future__ import annotations

import math
from dataclasses import replace

from scaling.planning.types import Capacity, Decision, PolicyConfig, Signals, Thresholds

# Below this share of the waiting threshold a scaler may treat the group as idle (KEDA's
# activation): a few queued requests are noise, a quarter of the limit is load.
ACTIVATION_SHARE = 0.25
# A one-minute burst extrapolated over a long engine start could ask for many times the load;
# the look-ahead adds at most the demand itself.
MAX_GROWTH = 1.0


def thresholds(capacity: Capacity, config: PolicyConfig) -> Thresholds:
    """Per-replica thresholds for a scaler, each from ``capacity`` at ``config.target``."""
    slo = capacity.slo
    target = config.target
    waiting = pending = None
    if capacity.queue_at_breach is not None:
        waiting = max(1.0, capacity.queue_at_breach * target)
    if capacity.pending_tokens_at_breach is not None:
        pending = max(1.0, capacity.pending_tokens_at_breach * target)
    return Thresholds(
        requests_waiting=_r(waiting),
        activation_requests_waiting=_r(waiting * ACTIVATION_SHARE) if waiting else None,
        pending_prompt_tokens=_r(pending),
        requests_per_s=_r(capacity.rps * target) if capacity.rps else None,
        kv_cache_usage_ratio=_r(capacity.kv_at_breach, 3),
        ttft_p95_seconds=slo.ttft_p95_ms / 1000.0,
        itl_p95_seconds=slo.itl_p95_ms / 1000.0 if slo.itl_p95_ms is not None else None,
        evidence=_evidence(capacity, target),
    )


def hold_seconds(config: PolicyConfig) -> float:
    """How long lower demand must last before a replica goes: the stabilisation window, or
    the engine's start time when that is longer (a replica let go is not back for that
    long, so one needed again within it should have been kept warm)."""
    return max(config.stabilisation_s, config.engine_start_s or 0.0)


def raw_desired(
    signals: list[Signals], capacity: Capacity, current: int, config: PolicyConfig
) -> int | None:
    """Replicas the signals ask for before hysteresis, warm minimum and bounds; None when
    there is nothing to judge by (used for the stabilisation window's history too)."""
    judged = _judge(signals, capacity, current, config)
    return judged[0] if judged else None


def decide(
    signals: list[Signals],
    capacity: Capacity,
    current: int,
    config: PolicyConfig,
    recent_raw: list[int],
) -> Decision:
    """Desired replicas for the group whose fresh ``signals`` are given (one per replica),
    ``current`` replicas running; ``recent_raw``: the raw desired values over the hold
    window (``hold_seconds``: a scale-down needs every one of them below ``current``)."""
    limits = thresholds(capacity, config)
    unknown = Decision(current=current, desired=current, raw_desired=current, thresholds=limits)
    if not capacity.rps:
        why = {
            "none_meets": "even the lightest benchmarked load broke the SLO",
            "no_evidence": "no finished benchmark of the running config and profile",
        }.get(capacity.status, "no capacity measured")
        return replace(
            unknown,
            reason=f"{current} replicas kept: {why}, so no per-replica capacity to plan with.",
        )
    judged = _judge(signals, capacity, current, config)
    if judged is None:
        why = "no fresh signals from the engines" if not signals else "no request rate in them"
        return replace(unknown, reason=f"{current} replicas kept: {why}.")
    raw, demand, forecast, guard = judged
    per_replica = capacity.rps * config.target
    warm = max(config.min_replicas, math.ceil(demand / per_replica - 1e-9))
    held = ""
    if raw >= current:
        desired = raw
    elif recent_raw and all(r < current for r in recent_raw):
        desired = max([raw, *recent_raw])
    else:
        desired = current
        held = f"; held at {current} until demand stays lower for {hold_seconds(config):.0f} s"
        if hold_seconds(config) > config.stabilisation_s:
            held += " (the engine's start time: a replica let go takes that long to return)"
    desired = max(desired, warm)
    desired = min(max(desired, config.min_replicas), config.max_replicas)
    status = "under" if desired > current else "over" if desired < current else "ok"
    start = config.engine_start_s
    reason = (
        f"{desired} replica{'s' * (desired != 1)}: {demand:.1f} req/s arriving"
        + (
            f", rising to {forecast:.1f} by the time a new replica is ready "
            f"(engine start {start:.0f} s)"
            if forecast > demand + 0.05 and start
            else ""
        )
        + f", one replica carries {capacity.rps:.1f} req/s at p95 ≤ "
        f"{capacity.slo.ttft_p95_ms:.0f} ms ({_source(capacity)}), planned at "
        f"{config.target:.0%}"
        + (f"; {guard}" if guard else "")
        + held
        + (f"; warm minimum {warm}" if warm > raw and warm > config.min_replicas else "")
        + (f"; capped at max {config.max_replicas}" if raw > config.max_replicas else "")
        + "."
    )
    return Decision(
        current=current,
        desired=desired,
        raw_desired=raw,
        status=status,
        demand_rps=round(demand, 3),
        forecast_rps=round(forecast, 3),
        warm_minimum=warm,
        reason=reason,
        thresholds=limits,
    )


def _judge(signals, capacity, current, config):
    """``(raw, demand, forecast, guardrail text)`` or None when nothing can be judged."""
    if not capacity.rps or not signals:
        return None
    rates = [s.arrival_rps if s.arrival_rps is not None else s.finished_rps for s in signals]
    if all(r is None for r in rates):
        return None
    demand = sum(r for r in rates if r is not None)
    forecast = demand + _growth(signals, demand, config.engine_start_s or 0.0)
    per_replica = capacity.rps * config.target
    raw = math.ceil(forecast / per_replica - 1e-9)
    guard = ""
    limit = thresholds(capacity, config).requests_waiting
    waiting = sum(s.requests_waiting or 0.0 for s in signals)
    running = sum(s.requests_running or 0.0 for s in signals)
    if limit is not None and waiting > limit * max(current, 1):
        guard = f"{waiting:.0f} waiting, above {limit:g} per replica"
    else:
        p95 = [w.p95 for s in signals if (w := s.ttft.get("1m")) and w.p95 is not None]
        slo_s = capacity.slo.ttft_p95_ms / 1000.0
        if p95 and max(p95) > slo_s and (demand > 0 or running > 0 or waiting > 0):
            guard = f"p95 TTFT {max(p95) * 1000:.0f} ms over the last minute, above the SLO"
    if guard:
        raw = max(raw, current + 1)
    return raw, demand, forecast, guard


def _growth(signals: list[Signals], demand: float, start_s: float) -> float:
    """Demand growth expected over ``start_s``: the trend from the 5-minute to the 1-minute
    request rate (the TTFT windows' observation counts, whose middles lie half their
    spans back), never negative, at most ``MAX_GROWTH`` × the demand."""
    slope = 0.0
    for s in signals:
        w1, w5 = s.ttft.get("1m"), s.ttft.get("5m")
        if not (w1 and w5 and w1.seconds > 0 and w5.seconds > w1.seconds):
            continue  # under a minute of history: no trend to read
        gap = (w5.seconds - w1.seconds) / 2.0
        slope += (w1.requests / w1.seconds - w5.requests / w5.seconds) / gap
    return min(max(0.0, slope * start_s), demand * MAX_GROWTH)


def _source(capacity: Capacity) -> str:
    best = capacity.best
    if best is None:
        return "benchmark"
    if best.source == "sweep":
        return best.run_name or f"sweep #{best.sweep_id}"
    return best.run_name or f"run #{best.run_id}"


def _evidence(capacity: Capacity, target: float) -> str:
    if capacity.best is None:
        return capacity.explanation
    return f"{capacity.explanation} Planned at {target:.0%} of it."


def _r(value: float | None, digits: int = 2) -> float | None:
    return round(value, digits) if value is not None else None
