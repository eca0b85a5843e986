"""Capacity planning what-if (pure): a day of traffic at one-minute steps through replicas of
one config under four scaling policies, with the start-up delay of new replicas.

The replica model is ``replica.ReplicaCurve``, measured by the simulator. Each minute:

- arrivals (the minute's rate × 60) join the backlog carried from the minute before; the
  replicas ready in that minute (a replica becoming ready part-way counts for the part)
  serve at most their saturation throughput; what they cannot serve is the next backlog;
- each replica sees the per-replica rate it served; the curve at that rate gives p95 TTFT,
  the requests waiting, GPU utilisation and KV use; a backlog adds its drain time
  (backlog ÷ (replicas × saturation throughput)) to p95 TTFT and its requests to the queue;
- a request that would wait longer than ``timeout_s`` (the load generator's default
  request timeout, 600 s) is given up by its client: it leaves the backlog as timed out,
  counted against the policy, so a scaler that never catches up shows as failed requests
  and a p95 near the timeout, not as a queue of days;
- pending prompt tokens are the requests waiting × the mean prompt length;
- at every polling interval the policy reads those signals and sets the replicas it wants;
  new replicas cost GPU time from the request on and serve ``start_delay_s`` later; a
  scale-down takes booting replicas first and waits ``stabilisation_s`` of lower demand.

The policies:

- ``fixed``: N replicas all day.
- ``utilisation``: the HPA rule on GPU utilisation, ``ceil(ready × util / target)``, with the
  HPA's 10 % tolerance; booting replicas report nothing (Kubernetes counts unready pods as
  idle when scaling up), so it grows by at most ``1 / target`` per start-up delay. Utilisation
  is the share of time the engine steps, which is near 100 % from light loads on: it cannot
  tell 1.1× from 3× overload, and it stays high at moderate loads.
- ``utilisation_high``: the same rule at a high target (95 % by default), where teams move
  it to stop the first from holding its maximum. Utilisation cannot read above 100 %, so at
  a target above 1 / 1.1 ≈ 91 % the ratio never leaves the HPA's tolerance upwards: it can
  scale down (quiet hours) but never up again. Shown beside the first, the two make the
  dilemma visible: a low target pays for idle replicas, a high one misses the SLO.
- ``queue``: KEDA's AverageValue on requests waiting alone, ``ceil(total waiting /
  threshold)``, the threshold being the queue depth at which p95 TTFT crosses the SLO on the
  replica curve (planned at ``target``: ``scaling.planning.policy.thresholds``, the rule the
  panel's KEDA export uses). This is what teams wire by hand; a queue only forms once a
  replica's batch is full, so below saturation it reads ~0 and lets the group shrink.
- ``tokens``: the panel's KEDA export: pending prompt tokens (that queue × the mean prompt),
  with the same queue trigger, the p95 TTFT guardrail (metricType Value:
  ``ceil(replicas × p95 / SLO)``) and the arrival-rate trigger (rate ÷ the rate a replica
  carries within the SLO at ``target``); the HPA takes the largest ask.

The day is run twice and the second run is reported, so midnight starts from the replicas,
backlog and scale-down history the policy holds at the end of a day rather than from a guess.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from scaling.planning.policy import thresholds
from scaling.planning.replica import ReplicaCurve
from scaling.planning.types import SLO, Capacity, PolicyConfig, Thresholds

MINUTES = 24 * 60
POLICIES = ("fixed", "utilisation", "utilisation_high", "queue", "tokens")
LABELS = {
    "fixed": "Fixed N",
    "utilisation": "GPU utilisation (HPA)",
    "utilisation_high": "GPU utilisation (HPA), high target",
    "queue": "Queue depth (KEDA)",
    "tokens": "Panel's KEDA export (queue, pending tokens, arrivals, p95 TTFT)",
}
HPA_TOLERANCE = 0.1  # Kubernetes' default: no change while the ratio is within ±10 %
MAX_RATE = 10_000.0  # requests/s, the form's bound too


UTILISATION = ("utilisation", "utilisation_high")


def utilisation_target(policy: str, params: DayParams) -> float:
    """The HPA target of one of the two utilisation policies."""
    return (
        params.target_utilisation_high
        if policy == "utilisation_high"
        else params.target_utilisation
    )


def policy_label(policy: str, params: DayParams) -> str:
    """The policy's name as the page shows it (the utilisation ones with their target)."""
    if policy in UTILISATION:
        return f"GPU utilisation (HPA, target {utilisation_target(policy, params):.0%})"
    return LABELS[policy]


def never_scales_up(target: float) -> bool:
    """Whether the HPA at this utilisation target can never scale up: even 100 % is within
    its tolerance of the target."""
    return 1.0 / target - 1.0 <= HPA_TOLERANCE


class PlanError(ValueError):
    """A day or parameters the what-if cannot run (said in words for the form and the row)."""


@dataclass(frozen=True)
class DayParams:
    """What the four policies are run with. ``fixed_replicas`` None: enough replicas for the
    day's peak at the rate per replica that meets the SLO. ``price_per_gpu_hour`` None: no
    price known, GPU-hours only."""

    slo_ttft_p95_ms: float = 500.0
    min_replicas: int = 1
    max_replicas: int = 8
    fixed_replicas: int | None = None
    start_delay_s: float = 120.0
    target_utilisation: float = 0.7
    target_utilisation_high: float = 0.95
    stabilisation_s: float = 300.0
    polling_interval_s: float = 15.0
    timeout_s: float = 600.0
    target: float = 0.8  # share of a replica's measured limits the scaler thresholds plan for
    price_per_gpu_hour: float | None = None
    currency: str = "USD"

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class PolicyDay:
    """One policy's day, per minute and in total."""

    policy: str
    label: str
    ready: list[float] = field(default_factory=list)  # replicas serving (fractions: part-way)
    booting: list[float] = field(default_factory=list)  # the rest: held, not serving yet
    ttft_p95_ms: list[float | None] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    utilisation: list[float] = field(default_factory=list)
    backlog: list[float] = field(default_factory=list)
    out_of_slo: list[int] = field(default_factory=list)  # 1: the minute's p95 broke the SLO
    arrived: float = 0.0
    served: float = 0.0
    timed_out: float = 0.0
    served_in_slo: float = 0.0
    initial_backlog: float = 0.0
    replica_minutes: float = 0.0
    thresholds: dict = field(default_factory=dict)
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def minute_rates(hourly: Sequence[float]) -> list[float]:
    """Requests/s for every minute of the day: each hour's rate at the middle of its hour,
    linear in between, and around midnight to the next day's first hour (a daily cycle)."""
    if len(hourly) != 24:
        raise PlanError("a day needs 24 hourly rates")
    out = []
    for minute in range(MINUTES):
        h = (minute + 0.5) / 60 - 0.5
        lo = math.floor(h)
        w = h - lo
        out.append(hourly[lo % 24] * (1 - w) + hourly[(lo + 1) % 24] * w)
    return out


def check_day(hourly: Sequence[float]) -> list[float]:
    """The 24 rates as floats, or a ``PlanError`` saying what is wrong with them."""
    if len(hourly) != 24:
        raise PlanError(f"a day needs 24 hourly rates, got {len(hourly)}")
    rates = []
    for hour, value in enumerate(hourly):
        rate = float(value)
        if not math.isfinite(rate) or rate < 0:
            raise PlanError(f"hour {hour}: a rate is 0 or more requests/s, got {value!r}")
        if rate > MAX_RATE:
            raise PlanError(f"hour {hour}: at most {MAX_RATE:,.0f} requests/s, got {rate:g}")
        rates.append(rate)
    if not any(rates):
        raise PlanError("every hour is 0 requests/s: there is nothing to plan for")
    return rates


def scaler_thresholds(curve: ReplicaCurve, params: DayParams) -> Thresholds:
    """The per-replica thresholds a scaler of this replica would use: the panel's own rule
    (``policy.thresholds``, what the KEDA export writes) applied to the curve's capacity."""
    slo = params.slo_ttft_p95_ms
    waiting = curve.waiting_at_slo(slo)
    capacity = Capacity(
        status="measured" if waiting is not None else "none_meets",
        slo=SLO(ttft_p95_ms=slo),
        rps=curve.rps_at_slo(slo),
        queue_at_breach=waiting,
        pending_tokens_at_breach=None if waiting is None else waiting * curve.mean_prompt_tokens,
        explanation="the simulator's replica curve",
    )
    return thresholds(capacity, PolicyConfig(target=params.target))


class _Replicas:
    """The replicas a policy holds: each one's ready time (seconds from the day's start)."""

    def __init__(self, count: int, now: float = 0.0):
        self.ready_at = [now] * count

    def serving(self, t0: float, t1: float) -> float:
        return sum(min(1.0, max(0.0, (t1 - max(r, t0)) / (t1 - t0))) for r in self.ready_at)

    def ready(self, t: float) -> int:
        return sum(1 for r in self.ready_at if r <= t)

    def set(self, desired: int, now: float, delay: float) -> None:
        if desired > len(self.ready_at):
            self.ready_at += [now + delay] * (desired - len(self.ready_at))
        elif desired < len(self.ready_at):
            # Booting replicas go first (they serve nothing yet), then the newest.
            self.ready_at = sorted(self.ready_at)[:desired]

    def shift(self, seconds: float) -> None:
        self.ready_at = [r - seconds for r in self.ready_at]


def _desired(policy: str, signals: dict, replicas: _Replicas, params, limits, now) -> int | None:
    """What ``policy`` asks for after one minute with ``signals``; None: no change."""
    current = len(replicas.ready_at)
    if policy in UTILISATION:
        ready = replicas.ready(now)
        if ready == 0:
            return None  # no pod reports a utilisation: the HPA holds
        target = utilisation_target(policy, params)
        ratio = ready * signals["utilisation"] / target / current
        if abs(ratio - 1) <= HPA_TOLERANCE:
            return None
        return math.ceil(ready * signals["utilisation"] / target)
    if limits.requests_waiting is None:
        return None  # no queue depth meets the SLO: nothing to scale by
    wants = [math.ceil(signals["waiting"] / limits.requests_waiting - 1e-9)]
    if policy == "tokens":
        # Every trigger of the panel's KEDA export; the HPA takes the largest ask.
        wants.append(math.ceil(signals["pending_tokens"] / limits.pending_prompt_tokens - 1e-9))
        if limits.requests_per_s:
            wants.append(math.ceil(signals["arrival_rps"] / limits.requests_per_s - 1e-9))
        if signals["ttft"] is not None:
            # metricType Value: replicas × p95 / SLO.
            wants.append(math.ceil(current * signals["ttft"] / params.slo_ttft_p95_ms - 1e-9))
    return max(wants)


def run_policy(
    policy: str,
    rates: Sequence[float],
    curve: ReplicaCurve,
    params: DayParams,
    fixed_replicas: int = 1,
) -> PolicyDay:
    """One policy through the day (``rates``: requests/s per minute)."""
    day = PolicyDay(policy=policy, label=policy_label(policy, params))
    limits = scaler_thresholds(curve, params)
    if policy in ("queue", "tokens"):
        day.thresholds = limits.as_dict()
    lowest = params.min_replicas
    if policy in UTILISATION and lowest < 1:
        lowest = 1  # the HPA does not scale from zero: nothing reports a utilisation there
        day.note = "the HPA cannot scale from zero: its minimum is 1"
    start = fixed_replicas if policy == "fixed" else max(lowest, 1)
    replicas = _Replicas(start)
    every = max(1, round(params.polling_interval_s / 60))
    window = max(1, math.ceil(params.stabilisation_s / 60 / every))
    mu = curve.max_rps
    backlog = 0.0
    history: deque[int] = deque(maxlen=window)
    for run in (0, 1):
        recording = run == 1
        if recording:
            replicas.shift(MINUTES * 60)
            day.initial_backlog = backlog
        for minute, rate in enumerate(rates):
            t0, t1 = minute * 60.0, minute * 60.0 + 60.0
            serving = replicas.serving(t0, t1)
            arrived = rate * 60
            demand = backlog + arrived
            served = min(demand, serving * mu * 60)
            before, backlog = backlog, demand - served
            # Clients give up after timeout_s: at most what the replicas could drain (or,
            # with none serving, what arrived) within that long is still waiting.
            keep = (serving * mu if serving > 0 else rate) * params.timeout_s
            gave_up = max(0.0, backlog - keep)
            backlog -= gave_up
            per_replica = served / 60 / serving if serving > 0 else 0.0
            point = curve.at(per_replica)
            if demand <= 0:
                ttft = None
            elif serving > 0:
                # A served request waited at most the timeout; the rest gave up.
                wait_s = min(max(before, backlog) / (serving * mu), params.timeout_s)
                ttft = point.ttft_p95_ms + wait_s * 1000
            else:
                ttft = None  # nothing serves: every request waits for a replica
            in_slo = demand <= 0 or (ttft is not None and ttft <= params.slo_ttft_p95_ms)
            waiting = serving * point.waiting + backlog
            signals = {
                "utilisation": point.busy if serving > 0 else 0.0,
                "waiting": waiting,
                "pending_tokens": waiting * curve.mean_prompt_tokens,
                "ttft": ttft,
                "arrival_rps": rate,
            }
            if recording:
                total = len(replicas.ready_at)
                day.ready.append(round(serving, 3))
                # Ready + booting = every replica held (and paid for) in the minute.
                day.booting.append(round(total - serving, 3))
                day.ttft_p95_ms.append(None if ttft is None else round(ttft, 1))
                day.waiting.append(round(waiting, 2))
                day.utilisation.append(round(signals["utilisation"], 3))
                day.backlog.append(round(backlog, 1))
                day.out_of_slo.append(0 if in_slo else 1)
                day.arrived += arrived
                day.served += served
                day.timed_out += gave_up
                day.served_in_slo += served if in_slo else 0.0
                day.replica_minutes += total
            if policy == "fixed" or (minute + 1) % every:
                continue
            want = _desired(policy, signals, replicas, params, limits, t1)
            current = len(replicas.ready_at)
            want = current if want is None else want
            want = min(params.max_replicas, max(lowest, want))
            history.append(want)
            # Scale up at once; scale down only to the most asked for over the window.
            target = want if want >= current else min(current, max(history))
            replicas.set(target, t1, params.start_delay_s)
    return day


def fixed_count(curve: ReplicaCurve, rates: Sequence[float], params: DayParams) -> int:
    """Fixed N's default: the day's peak over the rate one replica carries within the SLO."""
    if params.fixed_replicas:
        return params.fixed_replicas
    per_replica = curve.rps_at_slo(params.slo_ttft_p95_ms) or curve.max_rps
    return max(1, math.ceil(max(rates) / per_replica - 1e-9))


def summarise(day: PolicyDay, curve: ReplicaCurve, params: DayParams) -> dict:
    """The table's numbers for one policy's day."""
    gpu_hours = day.replica_minutes / 60 * curve.gpus
    out_tokens = day.served * curve.mean_output_tokens
    cost = None if params.price_per_gpu_hour is None else gpu_hours * params.price_per_gpu_hour
    known = [t for t in day.ttft_p95_ms if t is not None]
    return {
        "minutes_out_of_slo": sum(day.out_of_slo),
        "worst_ttft_p95_ms": max(known) if known else None,
        "gpu_hours": round(gpu_hours, 2),
        "cost_per_day": None if cost is None else round(cost, 2),
        "output_tokens": round(out_tokens),
        "cost_per_million_tokens": (
            None if cost is None or out_tokens <= 0 else round(cost / out_tokens * 1e6, 4)
        ),
        "peak_replicas": round(max(r + b for r, b in zip(day.ready, day.booting, strict=True))),
        "mean_replicas": round(day.replica_minutes / MINUTES, 2),
        # Timed-out requests count as misses: the share is of every request that arrived.
        "served_in_slo_share": day.served_in_slo / day.arrived if day.arrived else None,
        "timed_out": round(day.timed_out),
        "final_backlog": round(day.backlog[-1], 1),
    }


def run_day(
    hourly: Sequence[float],
    curve: ReplicaCurve,
    params: DayParams,
    on_policy: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Every policy through the day described by 24 hourly rates: per minute and in total."""
    rates = minute_rates(check_day(hourly))
    if params.min_replicas > params.max_replicas:
        raise PlanError("the minimum replicas are more than the maximum")
    fixed = fixed_count(curve, rates, params)
    out = {"rates": [round(r, 3) for r in rates], "fixed_replicas": fixed, "policies": {}}
    for n, policy in enumerate(POLICIES, start=1):
        day = run_policy(policy, rates, curve, params, fixed_replicas=fixed)
        out["policies"][policy] = {**day.as_dict(), "summary": summarise(day, curve, params)}
        if on_policy:
            on_policy(policy, n, len(POLICIES))
    return out
