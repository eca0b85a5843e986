"""A load spread over shards that may run on other machines, merged exactly.

Unlike ``shard.py`` (processes of one machine dividing the rate, merged on ``perf_counter``),
here every shard computes the WHOLE arrival schedule of each open-loop stage from the spec's
seed and sends only request numbers ``i % shards == shard``: the union of the shards is the
one schedule a single process would send, with no duplicates, whatever the number of shards.
All shards start at one absolute wall-clock time; a shard's clock is corrected by its offset
to a common reference (Redis TIME, PostgreSQL now(): whatever the caller's ``reference``
reads), estimated NTP-style from the round trip with the smallest delay. Records come back in
corrected wall-clock seconds so the coordinator merges them on one time base and computes the
percentiles over the union with the very ``summarize`` a single process uses.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, fields, replace

from benchmarks.loadgen.arrivals import open_loop_offsets, open_loop_stream
from benchmarks.loadgen.client import CLOCK
from benchmarks.loadgen.runner import ErrorStop, LoadGenError, LoadRun
from benchmarks.loadgen.shard import TICK_SUMS, merge_points
from benchmarks.loadgen.spec import LoadSpec, Stage
from benchmarks.loadgen.stats import RequestRecord, percentile, summarize

# A stage with no request count has no known length: its request numbers get a block this big,
# so the next stage's numbers never collide (every shard computes the same blocks).
UNBOUNDED_STAGE_BLOCK = 10_000_000


class ShardFailed(LoadGenError):
    """A shard failed or stalled: the run fails with its reason rather than merging less."""


@dataclass(frozen=True)
class ClockOffset:
    """How far a shard's clock is behind the reference (add ``offset_s`` to local time) and
    how sure we are: half the round trip of the best sample bounds the error."""

    offset_s: float
    uncertainty_s: float
    samples: int


def estimate_offset(samples: list[tuple[float, float, float]]) -> ClockOffset:
    """``samples``: (local before, reference, local after) in seconds. The sample with the
    shortest round trip is the least queued one; the reference was read somewhere inside it,
    so assuming the middle is wrong by at most half of it."""
    if not samples:
        raise ValueError("no clock samples")
    before, reference, after = min(samples, key=lambda s: s[2] - s[0])
    return ClockOffset(
        offset_s=reference - (before + after) / 2,
        uncertainty_s=(after - before) / 2,
        samples=len(samples),
    )


def measure_offset(reference, rounds: int = 16) -> ClockOffset:
    """Call ``reference()`` (returns the reference clock's seconds) ``rounds`` times."""
    samples = []
    for _ in range(rounds):
        before = time.time()
        ref = reference()
        samples.append((before, ref, time.time()))
    return estimate_offset(samples)


def stage_plan(spec: LoadSpec, stage_number: int) -> tuple[int, list[float] | None]:
    """(first request number, offsets or None when unbounded) of one open-loop stage."""
    base = 0
    for stage in spec.stages[:stage_number]:
        base += stage.num_requests if stage.num_requests is not None else UNBOUNDED_STAGE_BLOCK
    stage = spec.stages[stage_number]
    if stage.request_rate is None:
        raise LoadGenError(
            f"stage {stage.name!r}: distributed shards run open-loop (request rate) stages only"
        )
    if stage.num_requests is None:
        return base, None
    rng = random.Random(f"arrivals:{spec.seed}:{stage.name}")
    return base, open_loop_offsets(stage.num_requests, stage.request_rate, stage.burstiness, rng)


def shard_indices(spec: LoadSpec, shard: int, shards: int) -> list[tuple[int, float]]:
    """(request number, offset in its stage) a shard sends, for bounded stages (tests, UI)."""
    out = []
    for number in range(len(spec.stages)):
        base, offsets = stage_plan(spec, number)
        if offsets is None:
            raise LoadGenError("an unbounded stage has no finite plan")
        out.extend((base + i, o) for i, o in enumerate(offsets) if i % shards == shard)
    return out


class ShardRun(LoadRun):
    """One shard of a distributed run: starts at ``start_at`` (reference wall clock), sends
    its share of every stage's whole schedule, stamps records in reference wall-clock time."""

    def __init__(
        self,
        spec: LoadSpec,
        shard: int,
        shards: int,
        start_at: float,
        offset: ClockOffset,
        on_progress=None,
        clock=time.time,
        error_stop: ErrorStop | None = None,
    ):
        # Warm-up requests are not part of the shared schedule (each shard would start its
        # stages at a different time after them): one shard warms the engine up before the
        # start (``warm_up``).
        super().__init__(
            replace(spec, warmup_requests=0, workers=1, record_requests=True),
            on_progress=on_progress,
            shard=(shard, shards),
            error_stop=error_stop,
        )
        self.start_at = start_at
        self.offset = offset
        self.clock = clock  # this machine's wall clock (tests give a skewed one)
        self.epoch_wall = math.nan
        self._stage_number = 0

    async def _before_epoch(self) -> None:
        delay = self.start_at - (self.clock() + self.offset.offset_s)
        if delay > 0:
            await asyncio.sleep(delay)
        # The moment the run's monotonic clock starts, in reference seconds.
        self.epoch_wall = self.clock() + self.offset.offset_s

    async def warm_up(self, requests: int) -> int:
        """Send ``requests`` warm-up requests (4 at a time) before the shared start, outside
        the schedule and the records; returns how many were sent. Call from
        ``_before_epoch``, once the engine is ready."""
        if requests <= 0 or self.stopping:
            return 0
        self.epoch = CLOCK()
        first = len(self.records)
        semaphore = asyncio.Semaphore(4)
        prompts = [self.prompts.make(-1 - i) for i in range(requests)]
        await asyncio.gather(
            *(
                self._do(self._record("warmup", p, CLOCK() - self.epoch, True), p, semaphore)
                for p in prompts
            )
        )
        del self.records[first:]
        self._finished_chunks = 0  # the first second's tokens/s counts the schedule's only
        return len(prompts)

    async def _stage(self, stage: Stage) -> None:
        number = self._stage_number
        self._stage_number += 1
        self.stage_name = stage.name
        base, offsets = stage_plan(self.spec, number)
        start = CLOCK() - self.epoch
        deadline = start + stage.duration_s if stage.duration_s else math.inf
        if offsets is None:
            rng = random.Random(f"arrivals:{self.spec.seed}:{stage.name}")
            offsets = open_loop_stream(stage.request_rate, stage.burstiness, rng)
        worker, workers = self.shard

        def plan():
            for i, offset in enumerate(offsets):
                if i % workers == worker:
                    # _dispatch numbers the record from _next_index: the schedule's number.
                    self._next_index = base + i
                    yield start + offset, None

        semaphore = asyncio.Semaphore(stage.max_concurrency) if stage.max_concurrency else None
        await self._dispatch(stage.name, plan(), deadline, semaphore)


def shard_report(load: ShardRun, result, hostname: str = "", origin: float = 0.0) -> dict:
    """What a shard sends back: its records in reference wall-clock seconds since ``origin``
    (0: the epoch; the shared start keeps the numbers small, so float32 request logs and
    float64 differences keep their precision) and its health, with the parts of its result
    the merged result keeps (server metrics, notes, how it ended)."""
    records = [r for r in result.records or ()]
    shift = load.epoch_wall - origin
    for data in records:
        for key in ("scheduled", "sent", "end", "first_token"):
            if data.get(key) is not None:
                data[key] = data[key] + shift
        data["chunk_times"] = [t + shift for t in data["chunk_times"]]
    late = sorted(
        (d["sent"] - d["scheduled"]) * 1000
        for d in records
        if d["sent"] is not None and not math.isnan(d["sent"])
    )
    return {
        "shard": load.shard[0],
        "hostname": hostname,
        "epoch_wall": load.epoch_wall,
        "offset_s": load.offset.offset_s,
        "offset_uncertainty_s": load.offset.uncertainty_s,
        "records": records,
        "timeline": [dict(p, t_wall=load.epoch_wall + p["t"]) for p in result.timeline],
        "sent": len(records),
        "done": sum(1 for d in records if d["error_class"] is None),
        "failed": sum(1 for d in records if d["error_class"] is not None),
        "late_p99_ms": percentile(late, 99) if late else None,
        "error": None,
        "server": result.server,
        "notes": list(result.notes),
        "cancelled": result.cancelled,
        "stopped_early": result.stopped_early,
        "stopped_on_errors": result.stopped_on_errors,
        "timestamps": result.summary.get("timestamps"),
        "client_health": result.client_health,
    }


def to_records(data: list[dict]) -> list[RequestRecord]:
    names = {f.name for f in fields(RequestRecord)}
    return [RequestRecord(**{k: v for k, v in d.items() if k in names}) for d in data]


# Levels (cumulative counts, requests in flight) hold between a shard's ticks; rates are added
# only in the second they were measured in.
LEVELS = ("in_flight", "completed", "failed")


def merge_timelines(reports: list[dict]) -> list[dict]:
    """Per wall-clock second since the run's first start, the shards' points added up: a
    shard's tick lands in the second its wall-clock time falls in (shards start a fraction
    apart, so their ticks do not line up), and its levels carry over a second it missed."""
    start = min(r["epoch_wall"] for r in reports)
    per_shard = []
    for report in reports:
        by_second = {}
        for point in report["timeline"]:
            by_second[math.floor(point["t_wall"] - start + 1e-6)] = point
        per_shard.append(by_second)
    seconds = sorted({s for by_second in per_shard for s in by_second})
    merged = []
    last: list[dict] = [{} for _ in per_shard]
    for second in seconds:
        point = {"t": second + 1, **dict.fromkeys(TICK_SUMS, 0)}
        for number, by_second in enumerate(per_shard):
            tick = by_second.get(second)
            if tick is not None:
                last[number] = tick
            for key in TICK_SUMS:
                source = last[number] if key in LEVELS else (tick or {})
                point[key] += source.get(key) or 0
        merged.append(point)
    return merged


class TickMerger:
    """A run's live points from its shards' per-second ticks, as they arrive: tick ``n`` of
    every shard covers the same second (they start together), so tick ``n`` is merged
    (``shard.merge_points``) once every shard still running has sent it; a finished shard's
    counts carry on in the points after its last."""

    def __init__(self, shards: int):
        self.shards = shards
        self.pending: dict[int, dict[int, dict]] = {}
        self.finished: set[int] = set()
        self.last: dict[int, dict] = {}

    def add(self, shard: int, number: int, tick: dict) -> None:
        self.pending.setdefault(number, {})[shard] = tick

    def finish(self, shard: int) -> None:
        """Call once every tick of ``shard`` has been added."""
        self.finished.add(shard)

    def ready(self) -> list[dict]:
        """The merged points that no running shard can add to any more, in order."""
        running = set(range(self.shards)) - self.finished
        out = []
        while self.pending:
            number = min(self.pending)
            if not running <= set(self.pending[number]):
                break
            out.append(self._merge(self.pending.pop(number)))
        return out

    def flush(self) -> list[dict]:
        """Every tick still pending (the run is over), merged."""
        return [self._merge(self.pending.pop(n)) for n in sorted(self.pending)]

    def _merge(self, ticks: dict[int, dict]) -> dict:
        point = merge_points(list(ticks.values()))
        for shard, last in self.last.items():
            if shard not in ticks:
                for key in ("completed", "failed"):
                    point[key] += last.get(key) or 0
        self.last.update(ticks)
        return point


# A shard whose sends were this late at p99 measured its own delay, not the server's.
BEHIND_MS = 50.0


def merge_reports(reports: list[dict], expected: int, goodput=None) -> dict:
    """The run's result over the union of every shard's records. A missing or failed shard
    fails the merge with its reason: a result of fewer shards would look like a lighter load."""
    failed = [r for r in reports if r.get("error")]
    if failed:
        raise ShardFailed("; ".join(f"shard {r['shard']}: {r['error']}" for r in failed))
    missing = sorted(set(range(expected)) - {r["shard"] for r in reports})
    if missing:
        raise ShardFailed(f"shard(s) {missing} sent no result")
    records = sorted(
        (r for report in reports for r in to_records(report["records"])), key=lambda r: r.index
    )
    kept = [r for r in records if r.error_class != "cancelled"]
    stages = {
        name: summarize([r for r in kept if r.stage == name], goodput)
        for name in dict.fromkeys(r.stage for r in kept if not r.warmup)
    }
    summary = summarize(kept, goodput)
    summary["cancelled_requests"] = len(records) - len(kept)
    summary["shards"] = expected
    health = [
        {
            key: report.get(key)
            for key in (
                "shard",
                "hostname",
                "sent",
                "done",
                "failed",
                "offset_s",
                "offset_uncertainty_s",
                "late_p99_ms",
            )
        }
        | {"behind": (report.get("late_p99_ms") or 0) > BEHIND_MS}
        for report in sorted(reports, key=lambda r: r["shard"])
    ]
    return {
        "summary": summary,
        "stages": stages,
        "timeline": merge_timelines(reports),
        "shards": health,
        "records": kept,
        "client_health": merge_health([r.get("client_health") for r in reports]),
    }


def merge_health(healths: list[dict | None]) -> dict | None:
    """The run's load-generator health from its shards': the worst shard's lag, CPU share and
    lateness (one starved shard is enough to distort the run's numbers), the counts added up.
    None when no shard measured it (an older shard)."""
    healths = [h for h in healths if h]
    if not healths:
        return None

    def worst(part: str, key: str):
        values = [h[part][key] for h in healths if (h.get(part) or {}).get(key) is not None]
        return max(values) if values else None

    def total(part: str, key: str) -> int:
        return sum((h.get(part) or {}).get(key) or 0 for h in healths)

    out = {
        "loop_lag_ms": {
            "p50": worst("loop_lag_ms", "p50"),
            "p99": worst("loop_lag_ms", "p99"),
            "max": worst("loop_lag_ms", "max"),
            "samples": total("loop_lag_ms", "samples"),
        },
        "sends": {
            "scheduled": total("sends", "scheduled"),
            "late": total("sends", "late"),
            "late_ms": worst("sends", "late_ms"),
            "late_p99_ms": worst("sends", "late_p99_ms"),
            "late_max_ms": worst("sends", "late_max_ms"),
        },
        "shards": len(healths),
    }
    if any(h.get("cpu") for h in healths):
        out["cpu"] = {
            "loop_thread_share": worst("cpu", "loop_thread_share"),
            "process_share": worst("cpu", "process_share"),
            "wall_s": worst("cpu", "wall_s"),
        }
    return out


def run_shard(
    spec: LoadSpec,
    shard: int,
    shards: int,
    start_at: float,
    offset: ClockOffset,
    hostname="",
    clock=time.time,
) -> dict:
    """Runs one shard to the end on its own event loop; a failure is reported, not raised,
    so the coordinator can name the shard and its reason."""
    load = ShardRun(spec, shard, shards, start_at, offset, clock=clock)
    try:
        result = asyncio.run(load.execute())
    except Exception as exc:  # noqa: BLE001 - any failure is this shard's reason
        return {"shard": shard, "hostname": hostname, "error": f"{type(exc).__name__}: {exc}"}
    return shard_report(load, result, hostname)


__all__ = [
    "ClockOffset",
    "ShardFailed",
    "ShardRun",
    "TickMerger",
    "estimate_offset",
    "measure_offset",
    "merge_reports",
    "run_shard",
    "shard_indices",
]
