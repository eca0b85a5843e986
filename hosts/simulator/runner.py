"""The simulated engine in real time: steps the engine core on the event loop.

An ``EngineRunner`` task plans a step, sleeps until the step would end on the simulated GPU, then
hands each request its new token through the request's ``Stream``, where the HTTP handlers of
``hosts.simulator.server`` wait for it.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque

from hosts.simulator import text
from hosts.simulator.config import SimConfig
from hosts.simulator.core import FINISHED, EngineCore, Request
from hosts.simulator.metrics import EngineMetrics
from hosts.simulator.telemetry import Telemetry

NATURAL_MEDIAN_TOKENS = 180  # typical answer length when a request may stop at "EOS"
DELIVERY_BATCH = 16  # streams woken per event-loop turn
# Real seconds the loop may lag behind the planned timeline before the engine's clock
# restarts from now (see EngineRunner._next_start).
MAX_CATCH_UP_S = 0.05


class Stream:
    """The tokens of one request as they are delivered to its HTTP handler."""

    __slots__ = ("delivered", "done", "_waiter")

    def __init__(self):
        self.delivered = 0
        self.done = False
        self._waiter: asyncio.Future | None = None

    def push(self, count: int, done: bool) -> None:
        self.delivered = count
        self.done = done
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, seen: int) -> None:
        while self.delivered <= seen and not self.done:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter


class LoopLagMonitor:
    """Measures how late the event loop wakes a sleeper: the server's own responsiveness."""

    INTERVAL = 0.005

    def __init__(self, keep: int = 20000):
        self.samples: deque[float] = deque(maxlen=keep)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def _run(self) -> None:
        clock = time.perf_counter  # loop.time() may tick in whole milliseconds (uvloop)
        while True:
            expected = clock() + self.INTERVAL
            await asyncio.sleep(self.INTERVAL)
            self.samples.append(max(0.0, clock() - expected))

    def summary(self) -> dict:
        ordered = sorted(self.samples)
        if not ordered:
            return {"samples": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}

        def pct(p):
            return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000

        return {
            "samples": len(ordered),
            "p50_ms": pct(50),
            "p99_ms": pct(99),
            "max_ms": ordered[-1] * 1000,
        }


class EngineRunner:
    """Drives the engine core in real time (scaled by ``time_scale``; 0 = as fast as possible)."""

    def __init__(
        self,
        cfg: SimConfig,
        *,
        time_scale: float = 1.0,
        startup_seconds: float = 0.0,
        seed: int = 0,
        engine_version: str = "",
        quality=None,
    ):
        self.cfg = cfg
        # What the simulated model knows (hosts.simulator.quality.QualityModel), or None.
        self.quality = quality
        self.core = EngineCore(cfg)
        self.metrics = EngineMetrics(cfg)
        self.core.itl = self.metrics
        self.telemetry = Telemetry(cfg)
        self.time_scale = time_scale
        self.startup_seconds = startup_seconds
        self.engine_version = engine_version
        self.rng = random.Random(seed)
        self.seed = seed
        self.ready = False
        self.created = int(time.time())
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.loop_lag = LoopLagMonitor()
        self._t0 = 0.0
        self._virtual = 0.0
        self._ids = 0
        # Requests taken by the HTTP handlers, not yet seen by the engine (see _admit).
        self._arrivals: deque[Request] = deque()
        self.clock_resets = 0  # times the loop stalled past MAX_CATCH_UP_S

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._t0 = loop.time()
        self._task = loop.create_task(self._run(), name="engine-core")
        self.loop_lag.start()
        if self.startup_seconds > 0:
            loop.call_later(self.startup_seconds * max(self.time_scale, 0), self._set_ready)
        else:
            self._set_ready()

    def _set_ready(self) -> None:
        self.ready = True

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def now(self) -> float:
        """Simulated seconds since start."""
        if self.time_scale <= 0:
            return self._virtual
        return (asyncio.get_running_loop().time() - self._t0) / self.time_scale

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        step = None
        while True:
            if step is None:
                if not core.has_work and not self._arrivals:
                    self._wake.clear()
                    await self._wake.wait()
                # Idle until now: the engine starts its next step when work arrives.
                start = self.now()
                self._admit(start)
                step = core.step(start)
                continue
            self._account(step)
            if self.time_scale > 0:
                delay = self._t0 + step.end * self.time_scale - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            else:
                self._virtual = step.end
            start = self._next_start(step)
            self._admit(start)
            # Like a real engine, start the next step before streaming this one's tokens out,
            # so that the time spent writing to a thousand sockets does not stretch the step.
            following = core.step(start) if core.has_work else None
            await self._deliver(step)
            step = following

    def _next_start(self, step) -> float:
        """When the step after ``step`` starts: at ``step``'s planned end, like a GPU that
        runs one step after another. Starting it at "now" instead would add every late
        wake-up of the event loop (0.3-1 ms each, more when a client shares the CPU) to the
        engine's clock, and the server would run 6-15 % slower than its own model. A loop
        that stalled for longer than ``MAX_CATCH_UP_S`` (a paused process, a swapped page)
        restarts from now rather than replaying the stall as a burst of instant steps."""
        now = self.now()
        if (now - step.end) * max(self.time_scale, 0) > MAX_CATCH_UP_S:
            self.clock_resets += 1
            return now
        return step.end

    def _admit(self, start: float) -> None:
        """Hand the engine the requests that arrived by ``start``. A request the HTTP
        handler took after the planned start of the next step (the loop woke late) waits
        for the step after it, as it would in front of a real engine."""
        arrivals = self._arrivals
        while arrivals and arrivals[0].arrival <= start:
            self.core.add(arrivals.popleft())

    def _account(self, step) -> None:
        self.metrics.on_step(self.core, step)
        self.telemetry.record_step(
            step.duration * max(self.time_scale, 0), step.num_prefill_tokens, step.num_decode_tokens
        )

    async def _deliver(self, step) -> None:
        finished = {id(req) for req in step.finished}
        for i, req in enumerate(step.emitted, start=1):
            if req.sink is not None:
                req.sink.push(req.sink.delivered + 1, id(req) in finished)
            if i % DELIVERY_BATCH == 0:
                # Let the woken handlers write before waking more: with a thousand streams
                # one burst would hold the loop for tens of milliseconds.
                await asyncio.sleep(0)
        for req in step.finished:
            self.metrics.on_finished(req)
            if req.sink is not None and not req.sink.done:
                req.sink.push(req.sink.delivered, True)
        if self.time_scale <= 0:
            await asyncio.sleep(0)

    # --- requests ------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        ignore_eos: bool,
        min_tokens: int,
        priority: int = 0,
        natural: int | None = None,
    ) -> Request:
        """Queue a request; ``natural``: where the model's answer ends (its EOS), when known
        (a known answer), else drawn like typical answer lengths."""
        self._ids += 1
        if ignore_eos:
            target = max_tokens
        else:
            if natural is None:
                natural = int(self.rng.lognormvariate(math.log(NATURAL_MEDIAN_TOKENS), 0.6))
            target = min(max_tokens, max(min_tokens, natural, 1))
        req = Request(
            id=f"{self._ids}",
            prompt_len=len(prompt_ids),
            block_hashes=text.block_hashes(prompt_ids, self.cfg.block_size),
            max_tokens=max_tokens,
            output_target=target,
            arrival=self.now(),
            priority=priority,
        )
        req.sink = Stream()
        self._arrivals.append(req)
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        if req.status == FINISHED:
            return
        if req in self._arrivals:
            # Not yet seen by the engine: enter it so that it is counted and finished as
            # aborted like any other request the client gave up on.
            self._arrivals.remove(req)
            self.core.add(req)
        self.core.abort(req, self.now())


async def wait_done(req: Request) -> None:
    """Until the engine has finished (or aborted) ``req``."""
    sink: Stream = req.sink
    seen = -1
    while not sink.done:
        seen = sink.delivered
        await sink.wait(seen)
