"""The per-second points of a running benchmark: taken off the load generator's event loop,
joined with the deployment's GPU readings, stored, streamed to the run's page; and the
watch for a cancel request, a run closed under the worker, or the time limit."""

from __future__ import annotations

import logging
import queue
import threading
import time

from django.db import close_old_connections, connection
from django.utils import timezone

from benchmarks.loadgen.runner import LoadRun
from benchmarks.models import BenchmarkRun, RunPoint
from benchmarks.services.progress import Progress
from benchmarks.services.results import clean
from controlpanel.choices import OperationStatus
from controlpanel.realtime import group_name, publish
from hosts.models import Gpu
from hosts.services.telemetry import poll_host

log = logging.getLogger(__name__)
# GPU readings older than this are refreshed by the run itself (no beat polling the host).
STALE_READING_S = 3.0
# A reading older than this is left out of a point: shown as this second's, it would mislead.
SHOWN_READING_S = 10.0
# The run polls its host at most this often, however stale the readings stay.
POLL_INTERVAL_S = 2.0


class PointSink:
    """Takes the load generator's per-second points off its event loop (``put`` only queues,
    so measuring never waits on the database), and on its own thread adds the deployment's
    GPU readings, stores each point, moves the progress bar, streams it to the run's group,
    and watches for a cancel request or the time limit."""

    def __init__(self, run: BenchmarkRun):
        self.run = run
        self.queue: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None
        self.timed_out = False
        self._cancelled = False
        self.started = time.monotonic()
        self._last_poll = 0.0
        self.tracker = Progress(run.planned_requests, run.planned_duration_s)

    def put(self, point: dict) -> None:
        self.queue.put(point)

    def start(self, load: LoadRun, deadline: float) -> None:
        self.load, self.deadline = load, deadline
        self.thread = threading.Thread(target=self._work, name=f"run-{self.run.pk}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.queue.put(None)
        if self.thread is not None:
            self.thread.join(timeout=30)

    def _work(self) -> None:
        try:
            while True:
                try:
                    point = self.queue.get(timeout=1.0)
                except queue.Empty:
                    point = False
                if point is None:
                    return
                try:
                    if point:
                        self._store(point)
                    self._watch()
                except Exception:  # noqa: BLE001 - a lost point must not stop the run
                    log.exception("benchmark %s: could not record a point", self.run.pk)
        finally:
            connection.close()

    def _watch(self) -> None:
        close_old_connections()
        row = BenchmarkRun.objects.filter(pk=self.run.pk).values_list("cancel_requested", "status")
        cancel, status = row[0] if row else (False, OperationStatus.RUNNING)
        if status != OperationStatus.RUNNING and not self._cancelled:
            # Failed by the stale-run sweep (or deleted): measuring on is wasted load.
            self._cancelled = True
            self.load.cancel(reason="the run was closed while it ran")
        elif cancel and not self._cancelled:
            self._cancelled = True
            self.load.cancel()
        elif time.monotonic() > self.deadline and not self.timed_out:
            self.timed_out = True
            self.load.cancel(reason="stopped at the run's time limit")

    def _store(self, point: dict) -> None:
        run = self.run
        point = dict(point)
        point["gpus"] = self._gpus()
        point["progress"], point["eta_s"] = self._progress(point)
        point = clean(point)
        RunPoint.objects.update_or_create(run=run, t=float(point["t"]), defaults={"data": point})
        BenchmarkRun.objects.filter(pk=run.pk).update(progress=point["progress"])
        publish(group_name("run", run.pk), "run.point", point)

    def _progress(self, point: dict) -> tuple[float, float | None]:
        """(fraction done, seconds left): the plan's schedule and the observed rate at which
        requests finish (``progress.Progress``), not the run-long average."""
        return self.tracker.update(point)

    def _gpus(self) -> list[dict]:
        """This second's readings of the deployment's GPUs (the host's, when it names none),
        polling the host first when they are stale."""
        deployment = self.run.deployment
        gpu_ids = list(deployment.gpus.values_list("pk", flat=True)) or _host_gpu_ids(deployment)
        rows = list(Gpu.objects.filter(pk__in=gpu_ids).order_by("index"))
        if _stale(rows) and time.monotonic() - self._last_poll > POLL_INTERVAL_S:
            self._last_poll = time.monotonic()
            poll_host(deployment.host)
            gpu_ids = gpu_ids or _host_gpu_ids(deployment)  # the poll may have just learned them
            rows = list(Gpu.objects.filter(pk__in=gpu_ids).order_by("index"))
        now = timezone.now()
        return [
            _reading(g)
            for g in rows
            if g.last_sample_at is not None
            and (now - g.last_sample_at).total_seconds() <= SHOWN_READING_S
        ]


def _host_gpu_ids(deployment) -> list[int]:
    return list(Gpu.objects.filter(host_id=deployment.host_id).values_list("pk", flat=True))


def _stale(rows: list[Gpu]) -> bool:
    now = timezone.now()
    return not rows or any(
        g.last_sample_at is None or (now - g.last_sample_at).total_seconds() > STALE_READING_S
        for g in rows
    )


def _reading(gpu: Gpu) -> dict:
    sample = gpu.last_sample or {}
    used = sample.get("memory_used_bytes")
    return {
        "index": gpu.index,
        "utilization_pct": sample.get("utilization_gpu_pct"),
        "memory_used_gib": round(used / 2**30, 2) if used is not None else None,
        "power_w": sample.get("power_w"),
        "sm_clock_mhz": sample.get("sm_clock_mhz"),
    }
