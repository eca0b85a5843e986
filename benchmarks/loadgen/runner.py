"""Running a load test: readiness, warm-up, stages, progress, server metrics, cancel."""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import math
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from benchmarks.loadgen.arrivals import open_loop_offsets, open_loop_stream
from benchmarks.loadgen.client import CLOCK, make_client, request_body, send
from benchmarks.loadgen.dataset import Prompt, PromptFactory, load_trace
from benchmarks.loadgen.scrape import Scraper
from benchmarks.loadgen.spec import LoadSpec, Stage
from benchmarks.loadgen.stats import (
    ErrorWindow,
    RequestRecord,
    engine_state,
    percentile,
    summarize,
)
from benchmarks.loadgen.transport import FastTransport, new_event_loop_factory
from hosts.engines import readiness

ROLLING_WINDOW_S = 10.0
# How long before each tick the engine's /metrics is read (see LoadRun._ticker).
SCRAPE_LEAD_S = 0.25
# Per-request TTFTs handed to the live view each second, at most this many (evenly spread
# over the second's completions): enough for a scatter, bounded at any request rate.
TTFT_SAMPLES_PER_TICK = 100
# The load generator's own health (judged by ``benchmarks.evidence``): how often a probe task
# asks the event loop to wake it (its oversleep is the lag every stream's reads waited too), and
# how late an open-loop send may start before it counts as behind the schedule.
LAG_PROBE_S = 0.02
LATE_SEND_MS = 10.0


class LoadGenError(RuntimeError):
    """The run could not start (unreachable server, unknown model, bad spec)."""


@dataclass(frozen=True)
class ErrorStop:
    """When a run stops because the engine fails, not because its load is done: more than
    ``max_error_rate`` of the last ``window`` finished requests failed (judged once ``window``
    have finished), or the first ``no_success`` finished requests all failed (an engine dead
    from the start is named within a few requests, before a window fills). None turns a rule
    off. Sending on at a dead engine measures nothing and hides the one fact that matters.

    The spec's ``max_error_rate`` and ``min_requests_for_error_rate`` give the command line's
    rule; the panel passes its own (the profile's limit, else its default)."""

    max_error_rate: float | None = None
    window: int = 20
    no_success: int | None = None

    @classmethod
    def of(cls, spec: LoadSpec) -> ErrorStop:
        return cls(spec.max_error_rate, spec.min_requests_for_error_rate)


@dataclass
class Result:
    """One load test's outcome: summary, per-stage summaries, timeline, server view."""

    spec: dict
    summary: dict
    stages: dict[str, dict]
    timeline: list[dict]
    server: dict
    started_at: str
    cancelled: bool = False
    stopped_early: str | None = None
    # Set when the ErrorStop rule stopped the run: why, naming the engine's state.
    stopped_on_errors: str | None = None
    # What the failed requests say about the engine (engine_state), None when none failed.
    failures: str | None = None
    records: list[dict] | None = None
    notes: list[str] = field(default_factory=list)
    # The load generator's own health over the run (``LoadRun.health``).
    client_health: dict | None = None

    def to_dict(self) -> dict:
        first = self.spec["stages"][0] if self.spec.get("stages") else {}
        head = {
            # The `vllm bench serve` header, so existing tooling reads our files.
            "date": self.started_at,
            "backend": "openai-chat" if "chat" in self.spec["endpoint"] else "openai",
            "model_id": self.spec["model"],
            "endpoint": self.spec["endpoint"],
            "num_prompts": self.summary["completed"] + self.summary["failed"],
            "request_rate": first.get("request_rate") or "inf",
            "burstiness": first.get("burstiness", 1.0),
            "max_concurrency": first.get("max_concurrency") or first.get("concurrency"),
        }
        body = {
            **head,
            **self.summary,
            "stages": self.stages,
            "timeline": self.timeline,
            "server": self.server,
            "cancelled": self.cancelled,
            "stopped_early": self.stopped_early,
            "stopped_on_errors": self.stopped_on_errors,
            "failures": self.failures,
            "notes": self.notes,
            "client_health": self.client_health,
            "spec": self.spec,
        }
        if self.records is not None:
            body["records"] = self.records
        return body

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), default=_json_default, **kwargs)


def _json_default(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class LoadRun:
    """One execution of a LoadSpec. ``cancel()`` may be called from any task or thread;
    ``error_stop`` ends it early when the engine fails (``ErrorStop.of(spec)`` by default)."""

    def __init__(
        self,
        spec: LoadSpec,
        on_progress=None,
        shard: tuple[int, int] = (0, 1),
        error_stop: ErrorStop | None = None,
    ):
        spec.validate()
        self.spec = spec
        self.error_stop = error_stop or ErrorStop.of(spec)
        self.error_window = ErrorWindow(self.error_stop.window)
        self.stopped_on_errors: str | None = None
        # Worker ``shard[0]`` of ``shard[1]`` takes request indices shard[0], +shard[1], ...
        self.shard = shard
        self.on_progress = on_progress
        self.records: list[RequestRecord] = []
        self.in_flight: set[RequestRecord] = set()
        self.timeline: list[dict] = []
        self.stage_name = ""
        self.cancelled = False
        self.stopped_early: str | None = None
        self.notes: list[str] = []
        self._stop: asyncio.Event | None = None  # made on the run's own loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._next_index = shard[0]
        self._finished_chunks = 0
        self._last_tick = {"completed": 0, "failed": 0, "chunks": 0}
        # Kept up to date as requests finish, so that the per-second tick and the error-rate
        # check cost O(1) instead of scanning every record (which showed in the TTFT tail).
        self.completed = 0
        self.failed = 0
        self.recent_ttfts: deque[tuple[float, float]] = deque()  # (first token at, ttft)
        self._tick_ttfts: list[tuple[float, float]] = []  # finished since the last tick
        # The client's own health: event-loop oversleep per probe (s), how late each
        # open-loop send started against its schedule (s), CPU clocks at the epoch.
        self.loop_lags: list[float] = []
        self.send_lateness: list[float] = []
        self._cpu_start: tuple[float, float, float] | None = None

    # --- control --------------------------------------------------------------------------
    def cancel(self, reason: str | None = None) -> None:
        """Stop sending, abort requests in flight, keep what was measured. With a ``reason``
        the run counts as stopped early (e.g. a time limit) rather than cancelled."""
        loop = self._loop
        if loop is None:
            if reason:
                self.stopped_early = reason
            else:
                self.cancelled = True
            return
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_now, reason)

    def _cancel_now(self, reason: str | None = None) -> None:
        if reason:
            self.stopped_early = reason
        else:
            self.cancelled = True
        self._stop.set()
        for task in list(self._tasks):
            task.cancel()

    @property
    def stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    # --- the run --------------------------------------------------------------------------
    async def execute(self) -> Result:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self.cancelled or self.stopped_early:
            self._stop.set()
        spec = self.spec
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.transport = FastTransport()
        async with make_client(spec.request_timeout_s, spec.api_key, self.transport) as client:
            self.client = client
            await self._wait_ready(client)
            self.prompts = PromptFactory(
                spec.dataset, spec.seed, await self._tokens_per_word(client)
            )
            self.url = spec.base_url.rstrip("/") + spec.endpoint
            scraper = Scraper(client, spec.base_url.rstrip("/") + "/metrics")
            if spec.scrape_metrics:
                # Before the clock starts: however long a slow /metrics takes to answer, the
                # first points still come one a second from the start of the load.
                await scraper.snapshot(0.0)
            await self._before_epoch()
            self.epoch = CLOCK()
            self._cpu_start = _cpu_clocks()
            background = [
                asyncio.create_task(self._ticker(scraper)),
                asyncio.create_task(self._probe_lag()),
            ]
            try:
                if spec.warmup_requests and not self.stopping:
                    await self._warmup()
                    if spec.scrape_metrics:
                        # Server-side deltas start after the warm-up, like client-side ones.
                        scraper.first = await scraper.snapshot(CLOCK() - self.epoch)
                if spec.trace is not None:
                    await self._trace_stage()
                else:
                    for stage in spec.stages:
                        if self.stopping:
                            break
                        await self._stage(stage)
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
            if spec.scrape_metrics:
                await scraper.snapshot(CLOCK() - self.epoch)
            await self._emit(self._tick(scraper))  # the last, partial second
        return self._result(scraper, started_at)

    async def _before_epoch(self) -> None:
        """A hook for shards on other machines: they wait here for the shared start time."""

    async def _probe_lag(self) -> None:
        """Event-loop lag: how much later than asked a sleeping task wakes. Every stream's
        reads wait as long, so a lagging loop stamps late and coalesces chunks."""
        lags = self.loop_lags
        while True:
            asked = CLOCK()
            await asyncio.sleep(LAG_PROBE_S)
            lags.append(max(CLOCK() - asked - LAG_PROBE_S, 0.0))

    def health(self) -> dict:
        """The load generator's own health over the run: event-loop lag, its CPU use and how
        far its sends fell behind the schedule. ``benchmarks.evidence`` judges it."""
        lags = sorted(lag * 1000 for lag in self.loop_lags)
        late = sorted(x * 1000 for x in self.send_lateness)
        out = {
            "loop_lag_ms": {
                "p50": percentile(lags, 50) if lags else None,
                "p99": percentile(lags, 99) if lags else None,
                "max": lags[-1] if lags else None,
                "samples": len(lags),
            },
            "sends": {
                "scheduled": len(late),
                "late": sum(1 for x in late if x > LATE_SEND_MS),
                "late_ms": LATE_SEND_MS,
                "late_p99_ms": percentile(late, 99) if late else None,
                "late_max_ms": late[-1] if late else None,
            },
        }
        if self._cpu_start is not None:
            thread0, process0, wall0 = self._cpu_start
            thread1, process1, wall1 = _cpu_clocks()
            wall = max(wall1 - wall0, 1e-9)
            out["cpu"] = {
                # The loop's thread can use one core at most: near 100 % it is the bottleneck.
                "loop_thread_share": (thread1 - thread0) / wall,
                # The whole process (an embedded worker shares it with the web server).
                "process_share": (process1 - process0) / wall,
                "wall_s": wall,
            }
        return out

    async def _wait_ready(self, client: httpx.AsyncClient) -> None:
        """Wait until the server is ready (``hosts.engines.readiness``) and serves our model."""
        base = self.spec.base_url.rstrip("/")
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while True:
            state = await readiness.aprobe(client, base, timeout=5)
            if state.ready:
                if self.spec.model not in state.models:
                    raise LoadGenError(
                        f"model {self.spec.model!r} is not served at "
                        f"{base} (it serves {list(state.models)})"
                    )
                return
            if time.monotonic() > deadline or self.stopping:
                raise LoadGenError(
                    f"cannot reach a ready server at {base} within "
                    f"{self.spec.ready_timeout_s:g} s: {state.problem}"
                )
            await asyncio.sleep(0.25)

    async def _tokens_per_word(self, client: httpx.AsyncClient) -> float:
        if self.spec.dataset.prompt_format != "text" or self.spec.dataset.tokenizer:
            return 1.0
        sample = " ".join(["alpha bravo charlie delta echo"] * 40)
        try:
            response = await client.post(
                self.spec.base_url.rstrip("/") + "/tokenize",
                json={"model": self.spec.model, "prompt": sample, "add_special_tokens": False},
                timeout=10,
            )
            count = response.json()["count"]
            return max(count / 200, 0.1)
        except (httpx.HTTPError, KeyError, ValueError):
            self.notes.append(
                "the server has no /tokenize: text prompt lengths are approximate "
                "(1 token per word); input token counts come from usage"
            )
            return 1.0

    def _record(self, stage: str, prompt: Prompt, scheduled: float, warmup: bool = False):
        index = self._next_index
        self._next_index += self.shard[1]
        record = RequestRecord(
            index=index,
            stage=stage,
            warmup=warmup,
            input_len=prompt.input_len,
            max_tokens=prompt.output_len,
            scheduled=scheduled,
            prefix_id=prompt.prefix_id,
        )
        self.records.append(record)
        return record

    async def _do(
        self, record: RequestRecord, prompt: Prompt, semaphore: asyncio.Semaphore | None = None
    ) -> None:
        body = request_body(self.spec.endpoint, self.spec.model, prompt, self.spec.ignore_eos)
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            if semaphore is not None:
                async with semaphore:
                    await self._send(record, body)
            else:
                await self._send(record, body)
        except asyncio.CancelledError:
            record.error_class = record.error_class or "cancelled"
            record.error = record.error or "cancelled by the run"
            if record.end != record.end:
                record.end = CLOCK() - self.epoch
        finally:
            self._tasks.discard(task)
        if not record.warmup and record.error_class != "cancelled":
            if record.ok:
                self.completed += 1
                sample = (record.first_token, record.ttft * 1000)
                self.recent_ttfts.append(sample)
                self._tick_ttfts.append(sample)
            else:
                self.failed += 1
            self.error_window.add(record)
            self._check_errors()

    async def _send(self, record: RequestRecord, body: dict) -> None:
        self.in_flight.add(record)
        try:
            # The index as a request id lets a server's logs (or our test server) be joined
            # with the per-request records.
            await send(
                self.client,
                self.url,
                body,
                record,
                {"X-Request-Id": f"loadgen-{record.index}"},
                self.epoch,
            )
        finally:
            self.in_flight.discard(record)
            self._finished_chunks += len(record.chunk_times)

    def _check_errors(self) -> None:
        """Stop the run when ``error_stop`` says the engine is failing; the reason names the
        engine's state as the failures in the window show it."""
        rule, window = self.error_stop, self.error_window
        if self.stopping:
            return
        if rule.no_success is not None and self.completed == 0 and self.failed >= rule.no_success:
            reason = f"none of the first {self.failed} requests succeeded"
        elif rule.max_error_rate is not None and window.full and window.rate > rule.max_error_rate:
            reason = (
                f"error rate {window.rate:.0%} over the last {len(window.records)} requests, "
                f"above the limit of {rule.max_error_rate:.0%}"
            )
        else:
            return
        self.stopped_on_errors = f"{reason}; {engine_state(window.records, self.url)}"
        self._cancel_now(self.stopped_on_errors)

    async def _warmup(self) -> None:
        self.stage_name = "warmup"
        worker, workers = self.shard
        prompts = [
            self.prompts.make(-1 - i) for i in range(worker, self.spec.warmup_requests, workers)
        ]
        semaphore = asyncio.Semaphore(4)
        await asyncio.gather(
            *(
                self._do(self._record("warmup", p, CLOCK() - self.epoch, warmup=True), p, semaphore)
                for p in prompts
            )
        )

    async def _stage(self, stage: Stage) -> None:
        self.stage_name = stage.name
        start = CLOCK() - self.epoch
        deadline = start + stage.duration_s if stage.duration_s else math.inf
        limit = stage.num_requests if stage.num_requests is not None else math.inf
        if stage.request_rate is None:
            issued = 0

            async def worker():
                nonlocal issued
                while not self.stopping and issued < limit and CLOCK() - self.epoch < deadline:
                    issued += 1
                    prompt = self.prompts.make(self._next_index)
                    await self._do(self._record(stage.name, prompt, CLOCK() - self.epoch), prompt)

            await asyncio.gather(*(worker() for _ in range(stage.concurrency)))
            return
        rng = random.Random(f"arrivals:{self.spec.seed}:{stage.name}")
        offsets = (
            open_loop_offsets(int(limit), stage.request_rate, stage.burstiness, rng)
            if limit != math.inf
            else open_loop_stream(stage.request_rate, stage.burstiness, rng)
        )
        semaphore = asyncio.Semaphore(stage.max_concurrency) if stage.max_concurrency else None
        await self._dispatch(stage.name, ((start + o, None) for o in offsets), deadline, semaphore)

    async def _trace_stage(self) -> None:
        trace = self.spec.trace
        rows = load_trace(trace.path)
        worker, workers = self.shard
        self.stage_name = "trace"
        start = CLOCK() - self.epoch
        first = rows[0].timestamp
        plan = (
            (start + (row.timestamp - first) * trace.time_scale, row)
            for number, row in enumerate(rows)
            if number % workers == worker
        )
        await self._dispatch("trace", plan, math.inf, None)

    async def _dispatch(self, stage: str, plan, deadline: float, semaphore) -> None:
        """Start each request at its absolute scheduled time; never drift."""
        tasks = []
        lateness = self.send_lateness
        for scheduled, row in plan:
            if self.stopping or scheduled >= deadline:
                break
            delay = scheduled - (CLOCK() - self.epoch)
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
                    break  # stopped while waiting
                except TimeoutError:
                    pass
            if row is None:
                prompt = self.prompts.make(self._next_index)
            else:
                prompt = self.prompts.make(
                    self._next_index, row.input_tokens, row.output_tokens, row.prefix_id
                )
            record = self._record(stage, prompt, scheduled)
            # Behind the schedule: a loop this late starts the send late (coordinated omission
            # of the client's own making), whatever the engine does.
            lateness.append(max(CLOCK() - self.epoch - scheduled, 0.0))
            tasks.append(asyncio.create_task(self._do(record, prompt, semaphore)))
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- progress -------------------------------------------------------------------------
    async def _ticker(self, scraper: Scraper) -> None:
        next_tick = 1.0
        scrape: asyncio.Task | None = None
        try:
            while True:
                if self.spec.scrape_metrics:
                    await self._sleep_until(next_tick - SCRAPE_LEAD_S)
                    # /metrics is read beside the tick, never in its way: an engine that
                    # answers slowly (its /metrics is served by the busy API process) would
                    # otherwise push every point late. Started a little ahead so a prompt
                    # answer is in this second's point; a slow one shows in a later point;
                    # one scrape at a time, so a stuck engine is not piled up on.
                    if scrape is None or scrape.done():
                        scrape = asyncio.create_task(scraper.snapshot(CLOCK() - self.epoch))
                await self._sleep_until(next_tick)
                await self._emit(self._tick(scraper))
                # What survived the last second (records, their chunk times, finished tasks)
                # is moved out of the collector's reach too, so no pass ever walks the whole
                # run's heap: a full collection at 256 streams stalled the loop for 60+ ms.
                # Garbage cycles frozen this way are freed when the run ends (unfreeze,
                # collect).
                gc.freeze()
                next_tick += 1.0
        finally:
            if scrape is not None:
                scrape.cancel()
                await asyncio.gather(scrape, return_exceptions=True)

    async def _sleep_until(self, at: float) -> None:
        delay = at - (CLOCK() - self.epoch)
        if delay > 0:
            await asyncio.sleep(delay)

    async def _emit(self, point: dict) -> None:
        if self.on_progress is not None:
            outcome = self.on_progress(point)
            if inspect.isawaitable(outcome):
                await outcome

    def _tick(self, scraper: Scraper) -> dict:
        now = CLOCK() - self.epoch
        completed, failed = self.completed, self.failed
        chunks = self._finished_chunks + sum(len(r.chunk_times) for r in self.in_flight)
        window = self.recent_ttfts
        while window and window[0][0] < now - ROLLING_WINDOW_S:
            window.popleft()
        ttfts = sorted(ttft for _, ttft in window)
        fresh, self._tick_ttfts = self._tick_ttfts, []
        if len(fresh) > TTFT_SAMPLES_PER_TICK:
            step = len(fresh) / TTFT_SAMPLES_PER_TICK
            fresh = [fresh[int(i * step)] for i in range(TTFT_SAMPLES_PER_TICK)]
        last = self._last_tick
        elapsed = max(now - last.get("t", 0.0), 1e-9)
        server = scraper.last or {}
        point = {
            "t": round(now, 3),
            "stage": self.stage_name,
            "in_flight": len(self.in_flight),
            "completed": completed,
            "failed": failed,
            "requests_per_s": (completed - last["completed"]) / elapsed,
            "errors_per_s": (failed - last["failed"]) / elapsed,
            "output_tokens_per_s": (chunks - last["chunks"]) / elapsed,
            "ttft_p50_ms": percentile(ttfts, 50) if ttfts else None,
            "ttft_p95_ms": percentile(ttfts, 95) if ttfts else None,
            "server_waiting": server.get("waiting"),
            "server_running": server.get("running"),
            "kv_cache_usage": server.get("kv_cache_usage"),
            # [first token at (s), TTFT (ms)] of requests that finished in this tick.
            "ttfts": [[round(t, 3), round(ms, 2)] for t, ms in fresh],
        }
        self._last_tick = {"t": now, "completed": completed, "failed": failed, "chunks": chunks}
        # The result's timeline stays small: the samples are for live views only.
        self.timeline.append({k: v for k, v in point.items() if k != "ttfts"})
        return point

    def _result(self, scraper: Scraper, started_at: str) -> Result:
        kept = [r for r in self.records if r.error_class != "cancelled"]
        stages = {}
        for name in dict.fromkeys(r.stage for r in kept if not r.warmup):
            stages[name] = summarize([r for r in kept if r.stage == name], self.spec.goodput)
        summary = summarize(kept, self.spec.goodput)
        summary["cancelled_requests"] = len(self.records) - len(kept)
        summary["warmup_requests"] = sum(1 for r in self.records if r.warmup)
        summary["timestamps"] = self.transport.stamp_source or "read"
        measured = [r for r in kept if not r.warmup]
        return Result(
            spec=self.spec.to_dict(),
            summary=summary,
            stages=stages,
            timeline=self.timeline,
            server=scraper.report() if self.spec.scrape_metrics else {"available": False},
            started_at=started_at,
            cancelled=self.cancelled,
            stopped_early=self.stopped_early,
            stopped_on_errors=self.stopped_on_errors,
            failures=engine_state(measured, self.url),
            records=[r.to_dict() for r in self.records] if self.spec.record_requests else None,
            notes=self.notes,
            client_health=self.health(),
        )


def _cpu_clocks() -> tuple[float, float, float]:
    """(CPU seconds of this thread, of this process, wall seconds) now."""
    times = os.times()
    return time.thread_time(), times.user + times.system, CLOCK()


async def arun(spec: LoadSpec, on_progress=None) -> Result:
    return await arun_with(LoadRun(spec, on_progress))


async def arun_with(load: LoadRun) -> Result:
    # Whatever exists before the run (modules, the spec, prompts) is moved out of the GC's
    # reach, so collections only walk the run's own objects. (Turning the GC off or raising
    # its thresholds made each pass longer: 5-30 ms stalls landing in some TTFT.)
    gc.collect()
    gc.freeze()
    try:
        return await load.execute()
    finally:
        gc.unfreeze()
        gc.collect()


def run_in_process(spec: LoadSpec, on_progress=None) -> Result:
    """Run ``spec`` to the end in this process (blocking). Uses uvloop when it is installed:
    its cheaper I/O callbacks keep the client's own delay out of the numbers. ``run`` (in
    ``entry``) picks this or the sharded run by ``spec.workers``."""
    with asyncio.Runner(loop_factory=new_event_loop_factory()) as runner:
        return runner.run(arun(spec, on_progress))
