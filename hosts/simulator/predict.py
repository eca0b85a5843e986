"""Virtual time: run a workload through the engine core without sleeping.

``predict()`` answers "what would a load test measure with these settings?" in a fraction of a
second, with the same scheduler, KV cache and cost model the real-time server runs.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import asdict, dataclass

from hosts.engines.catalog import GpuSpec, resolve_gpu
from hosts.simulator.config import build_config
from hosts.simulator.core import EngineCore, Request

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Workload:
    """A reproducible load, like a load profile: lengths, arrival pattern, shared prefixes."""

    num_requests: int = 200
    input_tokens: int = 512
    output_tokens: int = 128
    input_jitter: float = 0.0  # ± fraction, uniform
    output_jitter: float = 0.0
    concurrency: int | None = 16  # closed loop when request_rate is None
    request_rate: float | None = None  # open loop: mean requests/s (inf = all at once)
    burstiness: float = 1.0  # gamma shape of the gaps; 1 = Poisson
    shared_prefix_tokens: int = 0  # a system prompt common to the requests of one prefix
    num_prefixes: int = 1
    warmup_requests: int = 0
    seed: int = 0
    # Closed loop: how long a client takes to send its next request after the last token.
    # Even 1 ms matters: the engine has started its next step by then, so the new request
    # waits for that step to end (as it does in front of a real engine).
    client_turnaround_s: float = 0.001


def prompt_block_hashes(
    prefix_id: int | None, prefix_len: int, request_key, total: int, block_size: int
) -> list[int]:
    """Hashes of the full blocks of a prompt made of a shared prefix and a unique rest.

    A block lies wholly inside the shared prefix or it is unique: chained hashing makes any
    block after the first differing token differ, so that is what the engines see too.
    """
    return [
        hash(("prefix", prefix_id, i))
        if prefix_id is not None and (i + 1) * block_size <= prefix_len
        else hash(("unique", request_key, i))
        for i in range(total // block_size)
    ]


def arrival_times(workload: Workload, rng: random.Random) -> list[float]:
    """Open-loop arrival offsets: gamma gaps rescaled so that N requests span N / rate seconds
    exactly (vLLM's fix for rate drift), as absolute offsets from the start.

    The same algorithm as ``benchmarks.loadgen.arrivals.open_loop_offsets``, kept apart
    because hosts may not import benchmarks (apps layer upward only); keep them in step.
    """
    n, rate = workload.num_requests, workload.request_rate
    if rate is None or math.isinf(rate):
        return [0.0] * n
    shape = workload.burstiness
    gaps = [rng.gammavariate(shape, 1.0 / (shape * rate)) for _ in range(n)]
    scale = (n / rate) / sum(gaps)
    times, t = [], 0.0
    for gap in gaps:
        times.append(t)
        t += gap * scale
    return times


def predict(
    engine: str,
    model: str,
    settings: dict,
    gpu: str | GpuSpec,
    workload: Workload,
    num_gpus: int = 1,
) -> dict:
    """Metrics a load test would measure: latency percentiles (ms), throughput, KV use."""
    gpu_spec = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    cfg = build_config(engine, model, settings, gpu_spec, num_gpus)
    core = EngineCore(cfg)
    core.itl = []
    rng = random.Random(workload.seed)
    requests = [_make_request(i, workload, cfg, rng) for i in range(workload.num_requests)]

    closed = workload.request_rate is None
    if closed:
        pending = [(0.0, i) for i in range(min(workload.concurrency or 1, len(requests)))]
        next_index = len(pending)
    else:
        pending = list(zip(arrival_times(workload, rng), range(len(requests)), strict=True))
        next_index = len(requests)
    heapq.heapify(pending)

    clock = 0.0
    busy = 0.0  # seconds the engine spent stepping: what NVML reports as utilisation
    kv_samples: list[float] = []
    max_running = 0
    while pending or core.has_work:
        if not core.has_work and pending and pending[0][0] > clock:
            clock = pending[0][0]
        while pending and pending[0][0] <= clock:
            t, i = heapq.heappop(pending)
            requests[i].arrival = t
            core.add(requests[i])
        result = core.step(clock)
        if result is None:
            continue
        busy += result.duration
        clock = result.end
        kv_samples.append(core.kv.usage)
        max_running = max(max_running, result.num_running + len(result.finished))
        if closed:
            for _ in result.finished:
                if next_index < len(requests):
                    heapq.heappush(pending, (clock + workload.client_turnaround_s, next_index))
                    next_index += 1
    measured = requests[workload.warmup_requests :]
    out = summarize(measured, core, kv_samples, max_running, cfg)
    # Over the whole run (warm-up included): the GPU was busy then too.
    out["busy_fraction"] = min(1.0, busy / clock) if clock > 0 else 0.0
    return out


def _make_request(i: int, w: Workload, cfg, rng: random.Random) -> Request:
    def jitter(mean: int, spread: float) -> int:
        if not spread:
            return mean
        return max(1, round(mean * (1 + rng.uniform(-spread, spread))))

    prompt = min(jitter(w.input_tokens, w.input_jitter), cfg.max_model_len - 1)
    out = min(jitter(w.output_tokens, w.output_jitter), cfg.max_model_len - prompt)
    prefix_id = i % w.num_prefixes if w.shared_prefix_tokens else None
    hashes = prompt_block_hashes(
        prefix_id, min(w.shared_prefix_tokens, prompt), (w.seed, i), prompt, cfg.block_size
    )
    return Request(
        id=f"req-{i}",
        prompt_len=prompt,
        block_hashes=hashes,
        max_tokens=out,
        output_target=out,
        arrival=0.0,
    )


def percentiles(values: list[float], scale: float = 1000.0) -> dict:
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ordered = sorted(values)
    out = {"mean": sum(ordered) / len(ordered) * scale}
    for p in PERCENTILES:
        # Nearest-rank on the sorted sample, like numpy's "lower" interpolation.
        k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
        out[f"p{p}"] = ordered[k] * scale
    return out


def summarize(requests, core: EngineCore, kv_samples, max_running, cfg) -> dict:
    done = [r for r in requests if r.finish_reason in ("stop", "length")]
    if done:
        start = min(r.arrival for r in done)
        end = max(r.finished_at for r in done)
    else:
        start = end = 0.0
    duration = max(end - start, 1e-9)
    out_tokens = sum(r.num_output for r in done)
    in_tokens = sum(r.prompt_len for r in done)
    tpot = [(r.finished_at - r.first_token) / (r.num_output - 1) for r in done if r.num_output > 1]
    result = {
        "engine": cfg.engine,
        "model": cfg.model.key,
        "gpu": cfg.gpu.key,
        "completed": len(done),
        "failed": len(requests) - len(done),
        "duration_s": duration,
        "request_throughput": len(done) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "ttft_ms": percentiles([r.first_token - r.arrival for r in done]),
        "tpot_ms": percentiles(tpot),
        "itl_ms": percentiles(core.itl or []),
        "e2el_ms": percentiles([r.finished_at - r.arrival for r in done]),
        "queue_ms": percentiles([r.first_scheduled - r.arrival for r in done]),
        # From admission to first token: the engine's prefill time, without queueing.
        "prefill_ms": percentiles([r.first_token - r.first_scheduled for r in done]),
        "num_preemptions": core.num_preemptions,
        "max_concurrent_requests": max_running,
        "kv_cache_usage_mean": sum(kv_samples) / len(kv_samples) if kv_samples else 0.0,
        "kv_cache_usage_max": max(kv_samples, default=0.0),
        "prefix_cache_hit_rate": core.kv.hits / core.kv.queries if core.kv.queries else 0.0,
        "kv_cache_capacity_tokens": cfg.kv_capacity_tokens,
        "max_num_seqs": cfg.max_num_seqs,
        "token_budget": cfg.token_budget,
    }
    return result


__all__ = ["Workload", "predict", "arrival_times", "prompt_block_hashes", "asdict"]
