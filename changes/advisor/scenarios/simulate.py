"""The scenarios' driver: a benchmark run through the simulator's engine core in virtual time,
and the facts the panel would read from it (the engine's /metrics over a window, the simulated
GPU's telemetry, the run's per-stage percentiles, errors and lengths, the running config).
PURE and deterministic (seeded)."""

from __future__ import annotations

import heapq
import math
import random
import re
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from changes.advisor.facts import (
    ConfigFacts,
    EngineWindow,
    GpuFacts,
    LengthFacts,
    RunFacts,
    StageFacts,
)
from hosts.engines.catalog import GpuSpec, resolve_gpu
from hosts.simulator.config import SimConfig, build_config
from hosts.simulator.core import EngineCore, Request
from hosts.simulator.dialects import VllmDialect
from hosts.simulator.predict import percentiles, prompt_block_hashes
from hosts.simulator.telemetry import IDLE, SW_POWER_CAP, Telemetry
from hosts.simulator.wire_errors import ApiError

# Virtual time 0 is this Unix time (2026-09-21), so windows and runs have plausible dates.
EPOCH = 1_790_000_000.0
SAMPLE_EVERY_S = 1.0  # the telemetry poll and the engine scrape, in virtual seconds
CLIENT_TURNAROUND_S = 0.001  # closed loop: a client's next request after its last token

# A two-socket host like the demo's: 64 CPUs, node 0 holds GPU 0 (telemetry.py puts the first
# half of the GPUs on node 0), node 1 the rest.
NUMA_CPUS = {0: tuple(range(0, 32)), 1: tuple(range(32, 64))}


@dataclass(frozen=True)
class Dist:
    """A length distribution like a load profile's: fixed, uniform (low..high), normal (mean,
    sigma) or lognormal (median ``mean``, log-sigma ``sigma``), clipped to ``low..high``."""

    kind: str
    mean: float
    sigma: float = 0.0
    low: int = 1
    high: int = 1 << 20

    def sample(self, rng: random.Random) -> int:
        if self.kind == "uniform":
            value = rng.uniform(self.low, self.high)
        elif self.kind == "normal":
            value = rng.gauss(self.mean, self.sigma)
        elif self.kind == "lognormal":
            value = rng.lognormvariate(math.log(self.mean), self.sigma)
        else:
            value = self.mean
        return int(min(max(round(value), self.low), self.high))


@dataclass(frozen=True)
class Stage:
    """One load level: closed loop at ``concurrency``, or open loop at ``request_rate`` (gamma
    gaps of shape ``burstiness``) with at most ``max_concurrency`` in flight."""

    name: str
    num_requests: int
    input_len: Dist
    output_len: Dist
    concurrency: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None
    burstiness: float = 1.0
    prefix_len: int = 0  # a system prompt shared by ``prefix_share`` of the requests
    prefix_groups: int = 1
    prefix_share: float = 1.0


# The built-in "Interactive chat" profile's lengths (benchmarks/loadgen/profile.py BUILTINS).
CHAT_IN = Dist("lognormal", 600, 0.7, 16, 4096)
CHAT_OUT = Dist("lognormal", 220, 0.5, 8, 1024)


def chat_stages(low: int = 4, normal: int = 16, peak: int = 48) -> tuple[Stage, ...]:
    """The built-in chat profile's three levels (40, 120 and 240 requests)."""
    return (
        Stage("low", 40, CHAT_IN, CHAT_OUT, concurrency=low),
        Stage("normal", 120, CHAT_IN, CHAT_OUT, concurrency=normal),
        Stage("peak", 240, CHAT_IN, CHAT_OUT, concurrency=peak),
    )


@dataclass
class Sent:
    """A request as the load generator sends it, and what became of it."""

    request: Request | None
    prompt: int
    output: int
    prefix: int  # tokens of a shared prefix in its prompt
    error: str | None = None
    sent: float = 0.0


@dataclass
class _Window:
    """Time-weighted gauges, telemetry samples and the requests of one stage."""

    start: float
    end: float = 0.0
    weighted: dict = field(default_factory=lambda: {"running": 0.0, "waiting": 0.0, "kv": 0.0})
    running_max: int = 0
    waiting_max: int = 0
    kv_max: float = 0.0
    samples: list = field(default_factory=list)  # telemetry readings (lists, one per poll)
    itl: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    preemptions: int = 0
    queries: int = 0
    hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0


@dataclass
class SimRun:
    """What a benchmark run through the simulator measured, stage by stage."""

    cfg: SimConfig
    stages: list  # (Stage, _Window)
    warmup: list  # the warm-up requests
    power_cap_w: float | None = None


def _throttle(readings: list[dict], cap_w: float | None) -> list[dict]:
    """A power limit below what the load draws: power held at the limit, the SM clock lowered
    (dynamic power ~ f·V², V following f: clock ∝ (limit / draw)^(1/3)), sw_power_cap set."""
    if cap_w is None:
        return readings
    out = []
    for r in readings:
        r = dict(r, power_limit_w=cap_w)
        if r["power_w"] > cap_w:
            ratio = (cap_w / r["power_w"]) ** (1 / 3)
            r.update(
                power_w=cap_w,
                sm_clock_mhz=int(r["max_sm_clock_mhz"] * ratio),
                clocks_event_reasons=r["clocks_event_reasons"] | SW_POWER_CAP,
            )
        out.append(r)
    return out


def simulate(
    model: str,
    settings: dict,
    gpu: str | GpuSpec,
    stages: tuple[Stage, ...],
    num_gpus: int = 1,
    warmup: int = 0,
    seed: int = 0,
    cpu_stall_s: float = 0.0,
    power_cap_w: float | None = None,
) -> SimRun:
    """Run ``stages`` one after the other through one vLLM engine core in virtual time.

    ``cpu_stall_s``: CPU work per step the GPU waits for (a starved or mis-pinned host);
    ``power_cap_w``: a power limit under the GPU's TDP. Requests longer than the context are
    refused with the simulated vLLM's own 400 message, as its server does before queueing."""
    spec = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    if power_cap_w is not None:
        # The clock the cap leaves at full draw slows the compute-bound part of each step.
        slow = (power_cap_w / spec.tdp_watts) ** (1 / 3)
        spec = replace(spec, compute_efficiency=spec.compute_efficiency * slow)
    cfg = build_config("vllm", model, settings, spec, num_gpus)
    core = EngineCore(cfg)
    dialect = VllmDialect(SimpleNamespace(cfg=cfg))
    rng = random.Random(seed)  # noqa: S311 - workload lengths, not secrets
    clock = [0.0]
    telemetry = Telemetry(replace(cfg, gpu=resolve_gpu(cfg.gpu.key)), clock=lambda: clock[0])
    next_sample = SAMPLE_EVERY_S
    run = SimRun(cfg, [], [], power_cap_w)
    counter = 0

    for number, stage in enumerate(stages):
        count = stage.num_requests + (warmup if number == 0 else 0)
        reqs = []
        for _ in range(count):
            reqs.append(_make(stage, cfg, dialect, rng, counter))
            counter += 1
        if number == 0 and warmup:
            run.warmup = reqs[:warmup]
        window = _Window(start=clock[0])
        core.itl = window.itl
        kv0 = (core.kv.queries, core.kv.hits, core.num_preemptions)
        tok0 = (core.prompt_tokens, core.generation_tokens)
        feed = _Feed(stage, reqs, clock[0], rng)
        while feed.left or core.has_work:
            for item in feed.send(clock[0]):
                core.add(item.request)
            if not core.has_work:
                upcoming = feed.next_time()
                if upcoming is not None:
                    next_sample = _poll(telemetry, clock, upcoming, next_sample, window, run)
                    clock[0] = max(clock[0], upcoming)
                continue
            result = core.step(clock[0])
            if result is None:
                continue
            end = result.end + cpu_stall_s
            dt = end - clock[0]
            clock[0] = result.end  # the telemetry stamps the busy time at the step's end
            telemetry.record_step(
                result.duration, result.num_prefill_tokens, result.num_decode_tokens
            )
            next_sample = _poll(telemetry, clock, end, next_sample, window, run)
            clock[0] = end
            running, waiting = len(core.running), len(core.waiting)
            window.weighted["running"] += running * dt
            window.weighted["waiting"] += waiting * dt
            window.weighted["kv"] += core.kv.usage * dt
            window.running_max = max(window.running_max, running + len(result.finished))
            window.waiting_max = max(window.waiting_max, waiting)
            window.kv_max = max(window.kv_max, core.kv.usage)
            feed.finished(len(result.finished), clock[0])
        window.end = clock[0]
        measured = reqs[warmup:] if number == 0 else reqs
        window.requests = measured
        window.queries = core.kv.queries - kv0[0]
        window.hits = core.kv.hits - kv0[1]
        window.preemptions = core.num_preemptions - kv0[2]
        window.prompt_tokens = core.prompt_tokens - tok0[0]
        window.generation_tokens = core.generation_tokens - tok0[1]
        run.stages.append((stage, window))
    return run


class _Feed:
    """The load generator of one stage: which requests go to the engine, and when.

    Closed loop: ``concurrency`` clients, each sending its next request a moment after its
    last one ended. Open loop: gamma-distributed arrivals, held back while ``max_concurrency``
    are in flight (then sent when a slot frees, as vLLM's benchmark does). A request refused
    for its length never reaches the engine and frees its slot at once."""

    def __init__(self, stage: Stage, reqs: list[Sent], start: float, rng: random.Random):
        self.reqs, self.cursor, self.closed = reqs, 0, stage.request_rate is None
        if self.closed:
            self.slots = [start] * min(stage.concurrency or 1, len(reqs))
            self.limit = len(reqs)
        else:
            shape, rate = stage.burstiness, stage.request_rate
            t, self.due = start, []
            for _ in reqs:
                self.due.append(t)
                t += rng.gammavariate(shape, 1 / (shape * rate))
            self.limit = stage.max_concurrency or len(reqs)
        self.in_flight = 0
        self.last_free = start

    @property
    def left(self) -> bool:
        return self.cursor < len(self.reqs)

    def _ready(self, now: float) -> float | None:
        """When the next request may go, if at or before ``now``."""
        if not self.left:
            return None
        if self.closed:
            return self.slots[0] if self.slots and self.slots[0] <= now else None
        due = self.due[self.cursor]
        return due if due <= now and self.in_flight < self.limit else None

    def send(self, now: float) -> list[Sent]:
        sent = []
        while (when := self._ready(now)) is not None:
            if self.closed:
                heapq.heappop(self.slots)
            item = self.reqs[self.cursor]
            self.cursor += 1
            # Held back by max_concurrency, a request goes when a slot frees (the benchmark
            # starts its clock after the semaphore, so the hold is not TTFT).
            item.sent = when if self.closed else max(when, self.last_free)
            if item.error is not None:
                if self.closed:
                    heapq.heappush(self.slots, when)
                continue
            item.request.arrival = item.sent
            self.in_flight += 1
            sent.append(item)
        return sent

    def finished(self, count: int, now: float) -> None:
        self.in_flight -= count
        if count:
            self.last_free = now
        if self.closed:
            for _ in range(count):
                heapq.heappush(self.slots, now + CLIENT_TURNAROUND_S)

    def next_time(self) -> float | None:
        """When the engine, idle now, gets its next request."""
        if not self.left:
            return None
        if self.closed:
            return self.slots[0] if self.slots else None
        return self.due[self.cursor] if self.in_flight < self.limit else None


def _make(stage: Stage, cfg: SimConfig, dialect, rng: random.Random, i: int) -> Sent:
    prompt, output = stage.input_len.sample(rng), stage.output_len.sample(rng)
    shared = stage.prefix_len and rng.random() < stage.prefix_share
    prefix = stage.prefix_len if shared else 0
    prompt += prefix
    try:
        dialect.max_tokens(prompt, output)
    except ApiError as refused:
        return Sent(None, prompt, output, prefix, error=refused.message)
    hashes = prompt_block_hashes(
        rng.randrange(stage.prefix_groups) if shared else None, prefix, i, prompt, cfg.block_size
    )
    request = Request(f"req-{i}", prompt, hashes, output, output, 0.0)
    return Sent(request, prompt, output, prefix)


def _poll(telemetry, clock, until: float, next_sample: float, window: _Window, run) -> float:
    """Telemetry polls due up to ``until``, into the window."""
    while next_sample <= until:
        clock[0] = next_sample
        window.samples.append(_throttle(telemetry.sample(), run.power_cap_w))
        next_sample += SAMPLE_EVERY_S
    return next_sample


# --- from a simulated run to facts --------------------------------------------------------


def _done(window: _Window) -> list[Request]:
    return [
        r.request
        for r in window.requests
        if r.request is not None and r.request.finish_reason in ("stop", "length")
    ]


def stage_facts(stage: Stage, window: _Window) -> StageFacts:
    """A stage's row on the run page: TTFT/ITL percentiles, errors, throughput."""
    done = _done(window)
    ttft = percentiles([r.first_token - r.arrival for r in done])
    itl = percentiles(window.itl)
    seconds = max(window.end - window.start, 1e-9)
    return StageFacts(
        name=stage.name,
        concurrency=stage.concurrency or stage.max_concurrency,
        request_rate=stage.request_rate,
        requests=len(window.requests),
        error_rate=1 - len(done) / len(window.requests) if window.requests else None,
        ttft_p50_ms=ttft["p50"],
        ttft_p95_ms=ttft["p95"],
        ttft_p99_ms=ttft["p99"],
        itl_p50_ms=itl["p50"],
        itl_p95_ms=itl["p95"],
        itl_p99_ms=itl["p99"],
        output_tokens_per_s=sum(r.num_output for r in done) / seconds,
        max_concurrent=window.running_max,
    )


def engine_window(windows: list[_Window], source: str) -> EngineWindow:
    """The engine's /metrics over ``windows`` (consecutive): gauges time-weighted, counters as
    deltas, server-side means per request."""
    start, end = windows[0].start, windows[-1].end
    seconds = max(end - start, 1e-9)
    done = [r for w in windows for r in _done(w)]
    itl = [gap for w in windows for gap in w.itl]
    queries = sum(w.queries for w in windows)
    hits = sum(w.hits for w in windows)

    def mean_ms(values):
        return sum(values) / len(values) * 1000 if values else None

    return EngineWindow(
        seconds=round(seconds, 3),
        ended_at=EPOCH + end,
        source=source,
        requests=len(done),
        running_mean=sum(w.weighted["running"] for w in windows) / seconds,
        running_max=max(w.running_max for w in windows),
        waiting_mean=sum(w.weighted["waiting"] for w in windows) / seconds,
        waiting_max=max(w.waiting_max for w in windows),
        kv_usage_mean=sum(w.weighted["kv"] for w in windows) / seconds,
        kv_usage_max=max(w.kv_max for w in windows),
        preemptions=sum(w.preemptions for w in windows),
        prefix_cache_queries=float(queries),
        prefix_cache_hits=float(hits),
        hit_rate=hits / queries if queries else None,
        queue_ms=mean_ms([r.first_scheduled - r.arrival for r in done]),
        prefill_ms=mean_ms([r.first_token - r.first_scheduled for r in done]),
        decode_ms=mean_ms([r.finished_at - r.first_token for r in done]),
        ttft_ms=mean_ms([r.first_token - r.arrival for r in done]),
        itl_ms=mean_ms(itl),
        prompt_tokens=float(sum(w.prompt_tokens for w in windows)),
        generation_tokens=float(sum(w.generation_tokens for w in windows)),
    )


def gpu_facts(run: SimRun, windows: list[_Window]) -> tuple[GpuFacts, ...]:
    """Per GPU the deployment uses: telemetry over ``windows`` as the panel aggregates it."""
    polls = [poll for w in windows for poll in w.samples]
    out = []
    for index in range(run.cfg.tp):
        rows = [poll[index] for poll in polls]
        if not rows:
            continue
        n = len(rows)
        events = {
            "idle": sum(1 for r in rows if r["clocks_event_reasons"] & IDLE) / n,
            "sw_power_cap": sum(1 for r in rows if r["clocks_event_reasons"] & SW_POWER_CAP) / n,
        }
        last = rows[-1]
        out.append(
            GpuFacts(
                index=index,
                model=last["name"],
                memory_total_bytes=last["memory_total_bytes"],
                numa_node=last["numa_node"],
                utilization_pct=sum(r["utilization_gpu_pct"] for r in rows) / n,
                memory_used_bytes=last["memory_used_bytes"],
                power_w=sum(r["power_w"] for r in rows) / n,
                power_limit_w=last["power_limit_w"],
                temperature_c=max(r["temperature_c"] for r in rows),
                sm_clock_mhz=sum(r["sm_clock_mhz"] for r in rows) / n,
                max_sm_clock_mhz=last["max_sm_clock_mhz"],
                clock_events={k: v for k, v in events.items() if v},
                pcie_tx_kbps=sum(r["pcie_tx_kbps"] for r in rows) / n,
                pcie_rx_kbps=sum(r["pcie_rx_kbps"] for r in rows) / n,
            )
        )
    return tuple(out)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))])


def length_facts(items: list[Sent]) -> LengthFacts:
    """The lengths of what was sent (refused requests too: they are the profile's)."""
    prompts = [r.prompt for r in items]
    outputs = [r.output for r in items]
    totals = [r.prompt + r.output for r in items]
    return LengthFacts(
        input_p50=_quantile(prompts, 0.5),
        input_p99=_quantile(prompts, 0.99),
        output_p50=_quantile(outputs, 0.5),
        output_p99=_quantile(outputs, 0.99),
        total_p99=_quantile(totals, 0.99),
        shared_prefix_share=sum(r.prefix for r in items) / max(sum(prompts), 1),
    )


def _error_key(message: str) -> str:
    """The engine's words without the request's own numbers, so refusals group."""
    found = re.search(r"[^.]*maximum context length is \d+ tokens", message)
    return f"{found.group(0).strip()} …" if found else message


def run_facts(
    run: SimRun,
    run_id: int,
    label: str,
    profile: str,
    warmup: int,
    config_current: bool = True,
    faster_than: int | None = None,
) -> RunFacts:
    """A finished benchmark run as the run page shows it."""
    windows = [w for _, w in run.stages]
    items = [r for w in windows for r in w.requests]
    done = [r for w in windows for r in _done(w)]
    by_class: dict[str, int] = {}
    by_message: dict[str, int] = {}
    for r in items:
        if r.error is not None:
            by_class["http_4xx"] = by_class.get("http_4xx", 0) + 1
            key = _error_key(r.error)
            by_message[key] = by_message.get(key, 0) + 1
    seconds = max(windows[-1].end - windows[0].start, 1e-9)
    return RunFacts(
        run_id=run_id,
        label=label,
        profile=profile,
        finished_at=EPOCH + windows[-1].end,
        status="succeeded",
        config_current=config_current,
        completed=len(done),
        failed=len(items) - len(done),
        error_rate=(len(items) - len(done)) / len(items) if items else None,
        errors_by_class=by_class,
        errors_by_message=by_message,
        warmup_requests=warmup,
        stages=tuple(stage_facts(s, w) for s, w in run.stages),
        lengths=length_facts(items),
        server=engine_window(windows, f"run {run_id}"),
        output_tokens_per_s=sum(r.num_output for r in done) / seconds,
        faster_than=faster_than,
    )


def config_facts(run: SimRun, model: str, cpus=None, numa_node: int | None = None) -> ConfigFacts:
    """The running config with the engine's defaults filled in, as the engine computed them."""
    cfg = run.cfg
    s = cfg.settings
    return ConfigFacts(
        engine="vllm",
        engine_version="0.11.0",
        model=model,
        settings=dict(s),
        tensor_parallel=cfg.tp,
        max_num_seqs=cfg.max_num_seqs,
        max_model_len=cfg.max_model_len,
        max_num_batched_tokens=cfg.token_budget,
        chunked_prefill=cfg.chunked_prefill,
        prefix_caching=cfg.prefix_caching,
        memory_fraction=s.get("gpu_memory_utilization", 0.9),
        kv_cache_dtype=s.get("kv_cache_dtype", "auto"),
        quantization=s.get("quantization"),
        weights_bytes=int(cfg.model.weight_bytes),
        kv_bytes_per_token=int(cfg.model.kv_bytes_per_token(cfg.kv_dtype_bytes)),
        kv_capacity_tokens=cfg.kv_capacity_tokens,
        cpus=cpus,
        numa_node=numa_node,
    )
