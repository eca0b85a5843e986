"""A shard of a sharded run: the side of a worker on the ``loadgen`` queue (``shards`` is the
coordinator's). The shard builds the run's spec with the seed the coordinator recorded,
measures its clock against the reference, waits for the engine, checks in ready, starts at
the coordinator's start time, sends its share of the one schedule
(``distributed.ShardRun``), and writes its ticks, records and report back in small rows."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from django.db import connection, transaction
from django.utils import timezone

from benchmarks.loadgen.distributed import BEHIND_MS, ShardRun, measure_offset, shard_report
from benchmarks.loadgen.runner import arun_with
from benchmarks.loadgen.transport import new_event_loop_factory
from benchmarks.models import RunShard, RunShardChunk
from benchmarks.services.runs import error_stop, run_spec
from benchmarks.services.shards import (
    POLL_S,
    RECORDS_PER_CHUNK,
    pack,
    reference_clock,
)
from controlpanel.choices import OperationStatus

log = logging.getLogger(__name__)
Status = RunShard.Status
Kind = RunShardChunk.Kind


class ShardLink:
    """The shard's thread to the database, so its event loop never waits on it: stores each
    tick for the coordinator, stamps a heartbeat, reads the start time the coordinator
    writes, and stops the load on a cancel, a run closed under it or the coordinator's
    stop reason."""

    def __init__(self, shard: RunShard):
        self.shard_pk = shard.pk
        self.queue: queue.Queue = queue.Queue()
        self.start_at: float | None = None
        self.load: ShardRun | None = None
        self.ticks = 0
        self._stopped = False
        self._last_beat = 0.0
        self.thread: threading.Thread | None = None

    def put(self, tick: dict) -> None:
        self.queue.put(("tick", tick))

    def ready(self) -> None:
        self.queue.put(("ready", None))

    def start(self, load: ShardRun) -> None:
        self.load = load
        self.thread = threading.Thread(target=self._work, name=f"shard-{self.shard_pk}")
        self.thread.daemon = True
        self.thread.start()

    def stop(self) -> None:
        self.queue.put(None)
        if self.thread is not None:
            self.thread.join(timeout=60)

    def _work(self) -> None:
        try:
            while True:
                try:
                    item = self.queue.get(timeout=POLL_S)
                except queue.Empty:
                    item = False
                if item is None:
                    return
                try:
                    if item:
                        self._handle(*item)
                    self._watch()
                except Exception:  # noqa: BLE001 - a lost tick must not stop the shard
                    log.exception("shard %s: could not talk to the database", self.shard_pk)
                    connection.close()  # the next query opens a fresh one
        finally:
            connection.close()

    def _handle(self, kind: str, value) -> None:
        if kind == "tick":
            RunShardChunk.objects.create(
                shard_id=self.shard_pk, kind=Kind.TICK, seq=self.ticks, data=pack(value)
            )
            self.ticks += 1
        else:
            RunShard.objects.filter(pk=self.shard_pk).update(
                status=Status.READY, heartbeat_at=timezone.now()
            )

    def _watch(self) -> None:
        # One connection for the thread's life (closed at its end, or after an error): with
        # CONN_MAX_AGE 0, close_old_connections would reconnect four times a second.
        rows = RunShard.objects.filter(pk=self.shard_pk)
        if time.monotonic() - self._last_beat >= 1.0:
            self._last_beat = time.monotonic()
            rows.update(heartbeat_at=timezone.now())
        row = rows.values_list(
            "start_at", "stop_reason", "run__cancel_requested", "run__status"
        ).first()
        start_at, reason, cancel, status = row or (None, "the run was deleted", False, "")
        if start_at is not None and self.start_at is None:
            rows.filter(status=Status.READY).update(status=Status.RUNNING)
            self.start_at = start_at
        if self._stopped or self.load is None:
            return
        if status != OperationStatus.RUNNING:
            self._stopped = True
            self.load.cancel(reason="the run was closed while it ran")
        elif cancel:
            self._stopped = True
            self.load.cancel()
        elif reason:
            self._stopped = True
            self.load.cancel(reason=reason)


class PanelShardRun(ShardRun):
    """``ShardRun`` started by the coordinator: warms the engine up (shard 0), checks in
    ready, waits for the start time the coordinator writes (``ShardLink``), then starts."""

    def __init__(self, spec, shard, shards, offset, link: ShardLink, warmup: int, stop_rule):
        super().__init__(
            spec, shard, shards, math.nan, offset, on_progress=link.put, error_stop=stop_rule
        )
        self.link, self.warmup, self.warmed = link, warmup, 0

    async def _before_epoch(self) -> None:
        self.warmed = await self.warm_up(self.warmup)
        self.link.ready()
        while self.link.start_at is None and not self.stopping:
            await asyncio.sleep(0.05)
        # Stopped before the start: nothing is sent, the empty result is reported.
        self.start_at = self.link.start_at or self.clock() + self.offset.offset_s
        await super()._before_epoch()


def execute_shard(shard: RunShard, hostname: str = "") -> RunShard:
    """Run one shard to its end and store what it measured on its row (a failure too)."""
    run = shard.run
    if shard.status != Status.QUEUED:
        return fail_shard(shard, "its worker stopped during the shard; its measurements were lost")
    if run.status != OperationStatus.RUNNING or shard.stop_reason:
        return fail_shard(shard, "the run had ended before a worker took this shard")
    shard.status, shard.hostname, shard.pid = Status.STARTING, hostname[:200], os.getpid()
    shard.started_at = shard.heartbeat_at = timezone.now()
    shard.save(update_fields=["status", "hostname", "pid", "started_at", "heartbeat_at"])
    link = ShardLink(shard)
    try:
        with tempfile.TemporaryDirectory(prefix="shard-") as scratch:
            spec = run_spec(run, Path(scratch))
            # The seed the coordinator recorded: every shard must compute the one schedule.
            seed = (run.environment.get("spec") or {}).get("seed", spec.seed)
            warmup = spec.warmup_requests if shard.number == 0 else 0
            spec = replace(
                spec, seed=int(seed), scrape_metrics=spec.scrape_metrics and shard.number == 0
            )
            offset = measure_offset(reference_clock)
            load = PanelShardRun(
                spec, shard.number, run.shards, offset, link, warmup, error_stop(run)
            )
            link.start(load)
            try:
                with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
                    result = runner.run(arun_with(load))
            finally:
                link.stop()
    except Exception as exc:  # noqa: BLE001 - any failure is this shard's reason
        return fail_shard(shard, f"{type(exc).__name__}: {exc}")
    report = shard_report(load, result, hostname, origin=load.start_at)
    report["warmup_requests"] = load.warmed
    store_report(shard, report)
    return shard


def store_report(shard: RunShard, report: dict) -> None:
    """The shard's records in chunks, its report, and its health on its row, at once: the
    coordinator reads the chunks once it sees the row done."""
    records = report.pop("records")
    chunks = [
        RunShardChunk(
            shard=shard,
            kind=Kind.RECORDS,
            seq=n,
            data=pack(records[start : start + RECORDS_PER_CHUNK]),
        )
        for n, start in enumerate(range(0, len(records), RECORDS_PER_CHUNK))
    ]
    late = report.get("late_p99_ms")
    with transaction.atomic():
        RunShardChunk.objects.bulk_create(chunks, batch_size=8)
        RunShardChunk.objects.create(shard=shard, kind=Kind.REPORT, seq=0, data=pack(report))
        shard.status = Status.DONE
        shard.sent, shard.done, shard.failed = report["sent"], report["done"], report["failed"]
        shard.offset_ms = report["offset_s"] * 1000
        shard.offset_uncertainty_ms = report["offset_uncertainty_s"] * 1000
        shard.late_p99_ms = late
        shard.behind = (late or 0) > BEHIND_MS
        shard.finished_at = timezone.now()
        shard.save()


def fail_shard(shard: RunShard, error: str) -> RunShard:
    """Close the shard as failed with ``error``; the coordinator fails the run with it."""
    shard.refresh_from_db()
    if shard.status not in (Status.DONE, Status.FAILED):
        shard.status, shard.error, shard.finished_at = Status.FAILED, error[:2000], timezone.now()
        shard.save(update_fields=["status", "error", "finished_at"])
    return shard
