"""Sharing one load across client processes, then merging what they measured.

One Python process tops out at some tens of thousands of SSE chunks a second; past that its own
delay would be measured as server latency. Each worker runs a share of every stage (concurrency,
rate, request count and warm-up divided; a superposition of Poisson streams is a Poisson stream
of the summed rate) on its own event loop, and the parent merges the per-request records on one
time base (``perf_counter`` is the system-wide monotonic clock on Linux) and the per-second
timelines point by point. Only worker 0 scrapes the server's /metrics.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import queue as queue_module
from dataclasses import fields, replace
from datetime import UTC, datetime

from benchmarks.loadgen.runner import (
    LoadGenError,
    LoadRun,
    Result,
    arun_with,
)
from benchmarks.loadgen.spec import LoadSpec, Stage
from benchmarks.loadgen.stats import RequestRecord, engine_state, summarize
from benchmarks.loadgen.transport import new_event_loop_factory

TICK_SUMS = (
    "in_flight",
    "completed",
    "failed",
    "requests_per_s",
    "errors_per_s",
    "output_tokens_per_s",
)


def _share(total: int | None, worker: int, workers: int) -> int | None:
    if total is None:
        return None
    return total // workers + (1 if worker < total % workers else 0)


def split(spec: LoadSpec) -> list[LoadSpec]:
    """One sub-spec per worker; their union is the asked load."""
    k = spec.workers
    subs = []
    for w in range(k):
        stages = []
        for stage in spec.stages:
            stages.append(
                replace(
                    stage,
                    concurrency=max(1, _share(stage.concurrency, w, k))
                    if stage.concurrency
                    else None,
                    request_rate=(
                        stage.request_rate / k
                        if stage.request_rate is not None and not math.isinf(stage.request_rate)
                        else stage.request_rate
                    ),
                    max_concurrency=(
                        max(1, _share(stage.max_concurrency, w, k))
                        if stage.max_concurrency
                        else None
                    ),
                    num_requests=max(1, _share(stage.num_requests, w, k))
                    if stage.num_requests is not None
                    else None,
                )
            )
        subs.append(
            replace(
                spec,
                stages=tuple(stages),
                workers=1,
                record_requests=True,
                scrape_metrics=spec.scrape_metrics and w == 0,
                warmup_requests=spec.warmup_requests,
            )
        )
    return subs


def _worker(spec: LoadSpec, shard: tuple[int, int], out, cancel) -> None:
    worker = shard[0]

    async def main():
        load = LoadRun(spec, on_progress=lambda p: out.put(("tick", worker, p)), shard=shard)

        async def watch():
            while not cancel.is_set():
                await asyncio.sleep(0.1)
            load.cancel()

        watcher = asyncio.create_task(watch())
        try:
            return load, await arun_with(load)
        finally:
            watcher.cancel()

    try:
        with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
            load, result = runner.run(main())
    except LoadGenError as exc:
        out.put(("error", worker, str(exc)))
        return
    out.put(
        (
            "done",
            worker,
            {
                "epoch": load.epoch,
                "records": result.records,
                "server": result.server,
                "notes": result.notes,
                "timestamps": result.summary["timestamps"],
                "cancelled": result.cancelled,
                "stopped_early": result.stopped_early,
                "stopped_on_errors": result.stopped_on_errors,
            },
        )
    )


def merge_points(points: list[dict]) -> dict:
    merged = {key: sum(p[key] or 0 for p in points) for key in TICK_SUMS}
    merged["t"] = max(p["t"] for p in points)
    merged["stage"] = points[0]["stage"]
    for key in ("ttft_p50_ms", "ttft_p95_ms"):
        values = [p[key] for p in points if p[key] is not None]
        # Percentiles do not add up: the median of the workers' medians, the worst p95.
        merged[key] = (
            (sorted(values)[len(values) // 2] if key == "ttft_p50_ms" else max(values))
            if values
            else None
        )
    for key in ("server_waiting", "server_running", "kv_cache_usage"):
        merged[key] = next((p[key] for p in points if p.get(key) is not None), None)
    merged["ttfts"] = sorted(sample for p in points for sample in p.get("ttfts", ()))
    return merged


class ShardedRun:
    """Runs ``spec`` on ``spec.workers`` processes; ``cancel()`` stops them all."""

    def __init__(self, spec: LoadSpec, on_progress=None):
        spec.validate()
        self.spec = spec
        self.on_progress = on_progress
        self.context = multiprocessing.get_context("spawn")
        self.cancel_event = self.context.Event()

    def cancel(self) -> None:
        self.cancel_event.set()

    def execute(self):
        k = self.spec.workers
        out = self.context.Queue()
        processes = [
            self.context.Process(
                target=_worker, args=(sub, (w, k), out, self.cancel_event), daemon=True
            )
            for w, sub in enumerate(split(self.spec))
        ]
        for process in processes:
            process.start()
        pending: dict[int, dict[int, dict]] = {}
        counts = [0] * k
        done: dict[int, dict] = {}
        timeline = []
        try:
            while len(done) < k:
                try:
                    kind, worker, payload = out.get(timeout=1.0)
                except queue_module.Empty:
                    dead = [
                        w for w, p in enumerate(processes) if not p.is_alive() and w not in done
                    ]
                    if dead:
                        raise LoadGenError(f"load generator worker(s) {dead} died") from None
                    continue
                if kind == "error":
                    self.cancel_event.set()
                    raise LoadGenError(payload)
                if kind == "done":
                    done[worker] = payload
                    continue
                tick = counts[worker]
                counts[worker] += 1
                pending.setdefault(tick, {})[worker] = payload
                if len(pending[tick]) == k - len(done) or len(pending[tick]) == k:
                    point = merge_points(list(pending.pop(tick).values()))
                    timeline.append({k: v for k, v in point.items() if k != "ttfts"})
                    if self.on_progress is not None:
                        self.on_progress(point)
        finally:
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
        base = min(p["epoch"] for p in done.values())
        names = {f.name for f in fields(RequestRecord)}
        records = []
        for payload in done.values():
            shift = payload["epoch"] - base
            for data in payload["records"]:
                record = RequestRecord(**{k: v for k, v in data.items() if k in names})
                for attr in ("scheduled", "sent", "end"):
                    setattr(record, attr, getattr(record, attr) + shift)
                if record.first_token is not None:
                    record.first_token += shift
                record.chunk_times = [t + shift for t in record.chunk_times]
                records.append(record)
        records.sort(key=lambda r: r.index)
        kept = [r for r in records if r.error_class != "cancelled"]
        stages = {
            name: summarize([r for r in kept if r.stage == name], self.spec.goodput)
            for name in dict.fromkeys(r.stage for r in kept if not r.warmup)
        }
        summary = summarize(kept, self.spec.goodput)
        summary["cancelled_requests"] = len(records) - len(kept)
        summary["warmup_requests"] = sum(1 for r in records if r.warmup)
        summary["workers"] = k
        sources = {p["timestamps"] for p in done.values()}
        summary["timestamps"] = "kernel" if sources == {"kernel"} else "read"
        first = done[min(done)]
        return Result(
            spec=self.spec.to_dict(),
            summary=summary,
            stages=stages,
            timeline=timeline,
            server=first["server"],
            started_at=_now(),
            cancelled=any(p["cancelled"] for p in done.values()),
            stopped_early=next(
                (p["stopped_early"] for p in done.values() if p["stopped_early"]), None
            ),
            # Each worker judges the engine on its own share: one that stopped says why.
            stopped_on_errors=next(
                (p["stopped_on_errors"] for p in done.values() if p["stopped_on_errors"]), None
            ),
            failures=engine_state(
                (r for r in kept if not r.warmup),
                self.spec.base_url.rstrip("/") + self.spec.endpoint,
            ),
            records=[r.to_dict() for r in records] if self.spec.record_requests else None,
            notes=first["notes"],
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


__all__ = ["ShardedRun", "Stage", "split"]
