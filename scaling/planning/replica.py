"""One replica's behaviour against load, calibrated by the simulator in virtual time (pure).

The what-if (``whatif``) runs a day at one-minute steps through many replicas under several
policies; running the simulator itself for every minute of every policy would take minutes.
Instead one replica is measured once per plan at a grid of open-loop request rates, from a
light load up to its saturation throughput (found first with a closed loop holding the batch
cap full), and the minute model reads this curve: p95 TTFT, the mean number of requests
waiting (Little's law from the measured queueing time and the rate), the share of wall time
the engine was stepping (what NVML reports as GPU utilisation) and KV-cache use.

A few rates above saturation are measured too, for the page: they are finite runs whose queue
had not reached its steady state, so the minute model does not read them; above saturation it
carries a backlog from minute to minute instead (``whatif``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from hosts.simulator.predict import Workload, predict

# Shares of the saturation throughput measured: dense near saturation, where p95 TTFT and the
# queue turn sharply upwards, and three points above it for the page only.
FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.65, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
ABOVE = (1.1, 1.25, 1.5)
REQUESTS = 1000
SATURATION_ROUNDS = 4  # a closed loop sends this many requests per batch slot


@dataclass(frozen=True)
class CurvePoint:
    """One rate measured on one replica (wall time of the deployment)."""

    rate: float  # offered requests/s
    throughput: float  # completed requests/s over the run
    ttft_p95_ms: float
    waiting: float  # mean requests queued (Little's law: rate × mean queueing time)
    busy: float  # share of wall time the engine was stepping (GPU utilisation)
    kv_usage: float  # mean KV-cache use, 0–1
    used: bool = True  # False above saturation: shown, not read by the minute model


@dataclass(frozen=True)
class ReplicaCurve:
    """A replica's measured curve and the facts the minute model needs alongside it."""

    points: tuple[CurvePoint, ...]
    max_rps: float  # sustainable throughput: a closed loop with the batch cap always full
    mean_prompt_tokens: float
    mean_output_tokens: float
    gpus: int = 1
    basis: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ReplicaCurve:
        data = dict(data)
        data["points"] = tuple(CurvePoint(**p) for p in data.get("points") or ())
        return cls(**data)

    @property
    def used(self) -> list[CurvePoint]:
        return [p for p in self.points if p.used]

    def at(self, rate: float) -> CurvePoint:
        """The curve at ``rate`` per replica: linear between measured rates, from an idle
        engine at 0, held at the saturation point above it (the backlog covers the rest)."""
        points = self.used
        rate = max(0.0, min(rate, points[-1].rate))
        rates = [p.rate for p in points]
        i = bisect.bisect_left(rates, rate)
        if i < len(points) and rates[i] == rate:
            return points[i]
        hi = points[i]
        lo = points[i - 1] if i else CurvePoint(0.0, 0.0, points[0].ttft_p95_ms, 0.0, 0.0, 0.0)
        w = (rate - lo.rate) / (hi.rate - lo.rate) if hi.rate > lo.rate else 1.0

        def mix(a: float, b: float) -> float:
            return a + (b - a) * w

        def grow(a: float, b: float) -> float:
            # Latency and queue rise geometrically towards saturation: a straight line
            # between two measured rates would overstate everything below the upper one.
            return a * (b / a) ** w if a > 0 and b > 0 else mix(a, b)

        return CurvePoint(
            rate,
            mix(lo.throughput, hi.throughput),
            grow(lo.ttft_p95_ms, hi.ttft_p95_ms),
            grow(lo.waiting, hi.waiting),
            mix(lo.busy, hi.busy),
            mix(lo.kv_usage, hi.kv_usage),
        )

    def waiting_at_slo(self, slo_ms: float) -> float | None:
        """Requests waiting per replica where p95 TTFT crosses ``slo_ms`` on the curve (the
        scaler's threshold); None when even the lightest rate misses it. When the SLO holds
        up to saturation, the queue at saturation (a deeper one is a growing backlog)."""
        return self._at_slo(slo_ms, "waiting")

    def rps_at_slo(self, slo_ms: float) -> float | None:
        """The highest rate per replica whose p95 TTFT meets ``slo_ms`` (interpolated)."""
        return self._at_slo(slo_ms, "rate")

    def _at_slo(self, slo_ms: float, attr: str) -> float | None:
        """``attr`` of the curve where p95 TTFT crosses ``slo_ms``, linear between the
        measured points; at the last point when it never does; None when the first misses."""
        points = self.used
        if points[0].ttft_p95_ms > slo_ms:
            return None
        for lo, hi in zip(points, points[1:], strict=False):
            if hi.ttft_p95_ms > slo_ms:
                w = (slo_ms - lo.ttft_p95_ms) / (hi.ttft_p95_ms - lo.ttft_p95_ms)
                a, b = getattr(lo, attr), getattr(hi, attr)
                return a + (b - a) * w
        return getattr(points[-1], attr)


def _point(result: dict, rate: float, time_scale: float, used: bool) -> CurvePoint:
    wall_rate = rate / time_scale
    queue_s = (result["queue_ms"]["mean"] or 0.0) / 1000 * time_scale
    return CurvePoint(
        rate=wall_rate,
        throughput=result["request_throughput"] / time_scale,
        ttft_p95_ms=(result["ttft_ms"]["p95"] or 0.0) * time_scale,
        waiting=wall_rate * queue_s,
        busy=float(result.get("busy_fraction", 0.0)),
        kv_usage=float(result["kv_cache_usage_mean"]),
        used=used,
    )


def calibrate(
    engine: str,
    model: str,
    settings: dict,
    gpu: str,
    workload: Workload,
    num_gpus: int = 1,
    *,
    time_scale: float = 1.0,
    requests: int = REQUESTS,
    on_point: Callable[[int, int], None] | None = None,
) -> ReplicaCurve:
    """Measure one replica in the simulator's virtual time. ``workload`` gives the request
    sizes, prefixes and seed (its arrival is replaced); ``time_scale`` < 1 is a simulated
    deployment running that many times faster than a real GPU (its numbers are scaled back
    to its wall time, as the sweep prediction does). Raises the simulator's ``StartupError``
    for a config the engine would refuse."""
    total = len(FRACTIONS) + len(ABOVE) + 1
    # The batch cap comes from a tiny run (the engine's own defaults fill it in when unset).
    probe = predict(engine, model, settings, gpu, replace(workload, num_requests=1), num_gpus)
    slots = max(1, int(probe["max_num_seqs"]))
    saturated = predict(
        engine,
        model,
        settings,
        gpu,
        replace(
            workload,
            request_rate=None,
            concurrency=slots,
            num_requests=max(requests, slots * SATURATION_ROUNDS),
            warmup_requests=0,
        ),
        num_gpus,
    )
    sim_max = saturated["request_throughput"]
    if on_point:
        on_point(1, total)
    points = []
    for n, fraction in enumerate(FRACTIONS + ABOVE, start=2):
        rate = sim_max * fraction
        result = predict(
            engine,
            model,
            settings,
            gpu,
            replace(
                workload,
                request_rate=rate,
                concurrency=None,
                num_requests=requests,
                warmup_requests=0,
            ),
            num_gpus,
        )
        points.append(_point(result, rate, time_scale, fraction <= 1.0))
        if on_point:
            on_point(n, total)
    basis = (
        f"replica curve from the simulator at {len(FRACTIONS)} rates "
        f"({FRACTIONS[0]:.0%}–100 % of a saturation throughput of "
        f"{sim_max / time_scale:.2f} req/s, {requests} requests each) for {engine} "
        f"{model} on {num_gpus}× {probe['gpu']}"
    )
    return ReplicaCurve(
        points=tuple(points),
        max_rps=sim_max / time_scale,
        mean_prompt_tokens=float(workload.input_tokens),
        mean_output_tokens=float(workload.output_tokens),
        gpus=num_gpus,
        basis=basis,
        extra={"max_num_seqs": slots, "time_scale": time_scale},
    )
