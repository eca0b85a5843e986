"""A run split over several load generators: the coordinator's side.

With ``BenchmarkRun.shards`` > 1 the run's own task (``runs.execute_run``) becomes the
coordinator. It makes one ``RunShard`` row a shard and queues a shard task each on the
``loadgen`` queue (``shard_worker`` is their side); the shards check in ready once the engine
answers, the coordinator writes one start time on the reference clock (the database's, the
one service every worker already reaches), merges their per-second ticks into the run's live
points as they come (through the same ``PointSink`` a one-process run uses: GPU readings,
progress, the run's channel group), and at the end merges their records with
``distributed.merge_reports`` (the statistics one process computes over the same records).
Everything travels through the database in small rows (``RunShardChunk``), never as one
giant Celery message. A shard that nobody takes, that goes silent or fails, fails the run
with its reason; the coordinator never waits past its deadline.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from benchmarks.loadgen.distributed import ShardFailed, TickMerger, merge_reports
from benchmarks.loadgen.profile import normalize
from benchmarks.loadgen.runner import Result
from benchmarks.loadgen.spec import LoadSpec
from benchmarks.loadgen.stats import engine_state, summarize
from benchmarks.models import MAX_SHARDS, BenchmarkRun, RunShard, RunShardChunk
from benchmarks.services.points import PointSink
from controlpanel import timelimits
from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue

SHARD_TASK = "benchmarks.tasks.run_shard"
LOADGEN_QUEUE = "loadgen"
# A shard no worker of the loadgen queue has taken by then fails the run (none is running,
# or all are busy): waiting on would hold the engine for nothing.
PICKUP_TIMEOUT_S = 60.0
# A shard that has checked in stamps its row about once a second; this long without a new
# stamp, its worker is gone.
SILENCE_S = 30.0
# A shard taken but not ready this long after its pickup timeout plus the engine's readiness
# timeout is stuck (its warm-up, say): the run fails rather than hold the engine.
CHECK_IN_MARGIN_S = 120.0
# Between the last shard's check-in and the shared start: enough for every shard to read it.
START_LEAD_S = 2.0
# After the run's time limit (the shards are told to stop), how long their results may take.
RESULT_GRACE_S = 30.0
POLL_S = 0.25
RECORDS_PER_CHUNK = 1000
DONE = (RunShard.Status.DONE, RunShard.Status.FAILED)
CHECKED_IN = (RunShard.Status.READY, RunShard.Status.RUNNING, RunShard.Status.DONE)


def pack(value) -> bytes:
    """JSON (NaN kept: unset record times are NaN), compressed."""
    return zlib.compress(json.dumps(value).encode(), 1)


def unpack(data) -> object:
    return json.loads(zlib.decompress(bytes(data)))


def reference_clock() -> float:
    """Seconds on the clock every shard is corrected to: PostgreSQL's, which every worker
    reaches. SQLite lives on one machine, where this machine's clock is everyone's."""
    if connection.vendor != "postgresql":
        return time.time()
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
        return float(cursor.fetchone()[0])


def refusal(profile_doc: dict, shards: int) -> str | None:
    """Why a run of ``profile_doc`` cannot be split over ``shards`` load generators, or None."""
    if not 1 <= shards <= MAX_SHARDS:
        return f"A run is split over 1 to {MAX_SHARDS} load generators, not {shards}."
    if shards == 1:
        return None
    if settings.EMBEDDED:
        # The embedded worker is threads of the web process: shards there would share one
        # interpreter and one CPU's worth of event loops, measuring each other rather than
        # the engine, and could take every worker thread the coordinator waits with.
        return (
            "A run split over several load generators needs Celery workers on the loadgen "
            "queue (production mode, REDIS_URL set); this panel runs embedded in one "
            "process: run it with 1 load generator."
        )
    if profile_doc.get("replay"):
        return "A replayed trace runs in one load generator: set load generators to 1."
    stages = normalize(profile_doc)["stages"]
    closed = [s.get("name", "?") for s in stages if not s.get("request_rate")]
    if closed:
        return (
            f"Stage(s) {', '.join(closed)} run a fixed number of users (a closed loop), which "
            "one schedule cannot be split over load generators: only request-rate stages can."
        )
    return None


def shard_health(run: BenchmarkRun) -> list[dict]:
    """Each shard's health, for the run page and the export (empty for a one-process run)."""
    return [shard.health for shard in RunShard.objects.filter(run=run).order_by("number")]


# --- the coordinator ---------------------------------------------------------------------------
def measure_sharded(run: BenchmarkRun, spec: LoadSpec, limit: int, error_stop=None) -> Result:
    """Queue the run's shards, start them together, stream their merged seconds, and return
    the merged result (raises ``ShardFailed``, a ``LoadGenError``, with the reason when a
    shard fails or never reports; the shards are told to stop first)."""
    RunShard.objects.filter(run=run).delete()  # nothing survives a previous attempt
    rows = RunShard.objects.bulk_create([RunShard(run=run, number=n) for n in range(run.shards)])
    options = timelimits.benchmark(limit).options()
    for row in rows:
        enqueue(SHARD_TASK, row.pk, **options)
    run.append_log(f"{run.shards} load generator shards queued on the {LOADGEN_QUEUE} queue")
    coordinator = Coordinator(run, spec, limit)
    try:
        return coordinator.coordinate()
    except BaseException as exc:
        stop_shards(run, f"the run failed: {exc}" if isinstance(exc, ShardFailed) else "stopped")
        raise
    finally:
        discard_chunks(run)


def discard_chunks(run: BenchmarkRun) -> None:
    """What the shards sent through the database: merged into the run's rows, or of no use."""
    RunShardChunk.objects.filter(shard__run=run).delete()


def stop_shards(run: BenchmarkRun, reason: str) -> None:
    """Tell every shard still going to stop sending (it keeps what it measured)."""
    RunShard.objects.filter(run=run, stop_reason="").update(stop_reason=reason[:300])


@dataclass
class _Stopper:
    """What ``PointSink`` cancels: a cancel by a user needs nothing (each shard watches the
    run itself); a reason (the time limit, a run closed under it) is passed to the shards."""

    run: BenchmarkRun

    def cancel(self, reason: str | None = None) -> None:
        if reason:
            stop_shards(self.run, reason)


class Coordinator:
    """Waits for the shards' check-in, starts them together, follows them to the end."""

    def __init__(self, run: BenchmarkRun, spec: LoadSpec, limit: int):
        self.run, self.spec, self.limit = run, spec, limit
        self.queued_at = time.monotonic()
        self.stamps: dict[int, tuple[object, float]] = {}  # number: (heartbeat, seen at)
        self.next_tick = dict.fromkeys(range(run.shards), 0)
        self.merger = TickMerger(run.shards)

    def coordinate(self) -> Result:
        if not self._wait_for_check_in():
            return self._cancelled_before_start()
        start_at = reference_clock() + START_LEAD_S
        RunShard.objects.filter(run=self.run).update(start_at=start_at)
        self.run.append_log(f"all {self.run.shards} shards ready; starting them together")
        sink = PointSink(self.run)
        sink.start(_Stopper(self.run), deadline=time.monotonic() + self.limit)
        try:
            self._follow(sink, time.monotonic() + self.limit + RESULT_GRACE_S)
        finally:
            sink.stop()
        return self._result(start_at)

    # --- phases ----------------------------------------------------------------------------
    def _wait_for_check_in(self) -> bool:
        """True once every shard is ready; False when the run was cancelled meanwhile."""
        while True:
            limit = PICKUP_TIMEOUT_S + settings.BENCHMARK_READY_TIMEOUT + CHECK_IN_MARGIN_S
            shards = self._shards()
            if all(s.status in CHECKED_IN for s in shards):
                return True
            if self._cancelled():
                return False
            if time.monotonic() - self.queued_at > limit:
                late = [s.number for s in shards if s.status not in CHECKED_IN]
                raise ShardFailed(
                    f"shard(s) {late} were not ready within {limit:.0f} s (engine readiness "
                    "and warm-up)"
                )
            time.sleep(POLL_S)

    def _follow(self, sink: PointSink, deadline: float) -> None:
        while True:
            shards = self._shards()  # before the ticks: a shard seen done has sent them all
            done = {s.number for s in shards if s.status in DONE}
            self._read_ticks()
            for number in done:
                self.merger.finish(number)
            for point in self.merger.ready():
                sink.put(point)
            if len(done) == len(shards):
                for point in self.merger.flush():
                    sink.put(point)
                return
            if time.monotonic() > deadline:
                missing = sorted(set(self.next_tick) - done)
                raise ShardFailed(
                    f"shard(s) {missing} sent no result by the run's time limit "
                    f"({self.limit} s) and {RESULT_GRACE_S:.0f} s more"
                )
            time.sleep(POLL_S)

    def _cancelled_before_start(self) -> Result:
        stop_shards(self.run, "the run was cancelled before the load started")
        summary = summarize([], self.spec.goodput) | {"cancelled_requests": 0}
        merged = {"summary": summary, "stages": {}, "timeline": [], "records": []}
        return self._build(merged, [], cancelled=True)

    # --- reading the shards ----------------------------------------------------------------
    def _shards(self) -> list[RunShard]:
        """The shards' rows, after failing the run on a failed, untaken or silent one."""
        shards = list(RunShard.objects.filter(run=self.run).order_by("number"))
        now = time.monotonic()
        for shard in shards:
            where = f"shard {shard.number}" + (
                f" on {shard.hostname} (pid {shard.pid})" if shard.hostname else ""
            )
            if shard.status == RunShard.Status.FAILED:
                raise ShardFailed(f"{where}: {shard.error or 'failed'}")
            if shard.status == RunShard.Status.QUEUED:
                if now - self.queued_at > PICKUP_TIMEOUT_S:
                    self._fail_shard(
                        shard,
                        f"no worker of the {LOADGEN_QUEUE} queue took it within "
                        f"{PICKUP_TIMEOUT_S:.0f} s (is a worker consuming that queue running?)",
                    )
                    raise ShardFailed(f"{where}: {shard.error}")
                continue
            if shard.status == RunShard.Status.DONE:
                continue
            seen = self.stamps.get(shard.number)
            if seen is None or seen[0] != shard.heartbeat_at:
                self.stamps[shard.number] = (shard.heartbeat_at, now)
            elif now - seen[1] > SILENCE_S:
                self._fail_shard(
                    shard, f"no word from it for {SILENCE_S:.0f} s: its worker is gone"
                )
                raise ShardFailed(f"{where}: {shard.error}")
        return shards

    def _fail_shard(self, shard: RunShard, error: str) -> None:
        shard.status, shard.error, shard.finished_at = RunShard.Status.FAILED, error, timezone.now()
        shard.save(update_fields=["status", "error", "finished_at"])

    def _cancelled(self) -> bool:
        row = BenchmarkRun.objects.filter(pk=self.run.pk).values("cancel_requested", "status")
        state = row[0] if row else {"cancel_requested": True, "status": ""}
        return state["cancel_requested"] or state["status"] != OperationStatus.RUNNING

    def _read_ticks(self) -> None:
        # Per shard from the next number it owes: each shard writes its ticks one after the
        # other, while primary keys of two shards' rows may commit out of order.
        wanted = Q()
        for number, seq in self.next_tick.items():
            wanted |= Q(shard__number=number, seq__gte=seq)
        chunks = RunShardChunk.objects.filter(
            wanted, shard__run=self.run, kind=RunShardChunk.Kind.TICK
        ).values_list("shard__number", "seq", "data")
        for number, seq, data in sorted(chunks, key=lambda c: (c[0], c[1])):
            if seq == self.next_tick[number]:
                self.merger.add(number, seq, unpack(data))
                self.next_tick[number] = seq + 1

    # --- the result ------------------------------------------------------------------------
    def _result(self, start_at: float) -> Result:
        reports = [self._report(shard) for shard in RunShard.objects.filter(run=self.run)]
        merged = merge_reports(reports, self.run.shards, self.spec.goodput)
        return self._build(merged, reports, cancelled=any(r.get("cancelled") for r in reports))

    def _report(self, shard: RunShard) -> dict:
        chunks = RunShardChunk.objects.filter(
            shard=shard, kind__in=[RunShardChunk.Kind.RECORDS, RunShardChunk.Kind.REPORT]
        ).order_by("kind", "seq")
        report, records = None, []
        for chunk in chunks.iterator():
            if chunk.kind == RunShardChunk.Kind.REPORT:
                report = unpack(chunk.data)
            else:
                records.extend(unpack(chunk.data))
        if report is None:
            return {"shard": shard.number, "error": shard.error or "it sent no report"}
        return {**report, "records": records}

    def _build(self, merged: dict, reports: list[dict], cancelled: bool) -> Result:
        spec = self.spec
        first = next((r for r in reports if r["shard"] == 0), {})
        summary = merged["summary"]
        summary["warmup_requests"] = sum(r.get("warmup_requests") or 0 for r in reports)
        sources = {r.get("timestamps") for r in reports}
        summary["timestamps"] = "kernel" if sources == {"kernel"} else "read"
        measured = [r for r in merged["records"] if not r.warmup]
        return Result(
            spec=spec.to_dict(),
            summary=summary,
            stages=merged["stages"],
            timeline=merged["timeline"],
            server=first.get("server") or {"available": False},
            started_at=(self.run.started_at or timezone.now()).isoformat(timespec="seconds"),
            cancelled=cancelled,
            stopped_early=next(
                (r["stopped_early"] for r in reports if r.get("stopped_early")), None
            ),
            # Each shard judges the engine on its share: one that stopped says why.
            stopped_on_errors=next(
                (r["stopped_on_errors"] for r in reports if r.get("stopped_on_errors")), None
            ),
            failures=engine_state(measured, spec.base_url.rstrip("/") + spec.endpoint),
            records=[r.to_dict() for r in merged["records"]],
            notes=list(first.get("notes") or []),
            client_health=merged.get("client_health"),
        )
