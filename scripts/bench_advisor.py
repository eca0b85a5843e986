#!/usr/bin/env python3
"""How long the advisor takes on one deployment (docs/: "Advisor"; issue 17's target: under
50 ms to evaluate every rule).

Builds a full snapshot by hand — 8 GPUs (a 70B model at tensor parallel 8, two of them
power-capped), a live window of the engine's /metrics, the host with two NUMA nodes, 3 runs of
3 stages each, a traffic sample — in two versions: a sick one that raises findings in most
rules (their wording and suggestions are part of the cost) and a healthy one that raises none.
Times ``evaluate()`` over ``--repeat`` iterations each and prints the median and p99 per
evaluation, and the machine it ran on.

    .venv/bin/python scripts/bench_advisor.py [--repeat 1000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from changes.advisor import rules as _rules  # noqa: E402, F401 - registers the rules
from changes.advisor.engine import RULES, evaluate  # noqa: E402
from changes.advisor.facts import (  # noqa: E402
    ConfigFacts,
    EngineWindow,
    GpuFacts,
    HostFacts,
    LengthFacts,
    RunFacts,
    Snapshot,
    StageFacts,
)

TARGET_MS = 50.0
GIB = 2**30
NOW = 1_790_000_000.0


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def window(source: str, seconds: float, **kw) -> EngineWindow:
    base = dict(
        seconds=seconds,
        ended_at=NOW,
        source=source,
        requests=2400,
        running_mean=60.0,
        running_max=64.0,
        waiting_mean=22.0,
        waiting_max=41.0,
        kv_usage_mean=0.55,
        kv_usage_max=0.7,
        preemptions=0,
        prefix_cache_queries=4.8e6,
        prefix_cache_hits=0.3e6,
        hit_rate=None,
        queue_ms=1800.0,
        prefill_ms=420.0,
        ttft_ms=2300.0,
        itl_ms=38.0,
        prompt_tokens=2400 * 2000.0,
        generation_tokens=2400 * 300.0,
    )
    base.update(kw)
    return EngineWindow(**base)


def stages(scale: float) -> tuple[StageFacts, ...]:
    out = []
    for name, concurrency, p50, p99, itl in (
        ("low", 1, 180.0, 420.0, 45.0),
        ("normal", 16, 350.0, 1400.0, 52.0),
        ("peak", 64, 900.0, 7200.0, 70.0),
    ):
        out.append(
            StageFacts(
                name=name,
                concurrency=concurrency,
                requests=400,
                error_rate=0.0,
                ttft_p50_ms=p50 * scale,
                ttft_p95_ms=p99 * scale * 0.8,
                ttft_p99_ms=p99 * scale,
                itl_p50_ms=itl,
                itl_p95_ms=itl * 1.3,
                itl_p99_ms=itl * 1.6,
                output_tokens_per_s=concurrency * 1000 / itl,
                max_concurrent=concurrency,
            )
        )
    return tuple(out)


def sick() -> Snapshot:
    lengths = LengthFacts(
        input_p50=2000.0,
        input_p99=6000.0,
        output_p50=300.0,
        output_p99=900.0,
        total_p99=6800.0,
        shared_prefix_share=0.4,
    )
    runs = tuple(
        RunFacts(
            run_id=40 - i,
            label=f"nightly {i}",
            profile="chat v4",
            finished_at=NOW - 3600 * (i + 1),
            status="succeeded",
            config_current=i == 0,
            completed=1200 - 330 * (i == 0),
            failed=330 * (i == 0),
            error_rate=0.275 if i == 0 else 0.0,
            errors_by_class={"HTTP_4XX": 330} if i == 0 else {},
            errors_by_message=(
                {
                    "This model's maximum context length is 8192 tokens. However, your request "
                    "has 9000 input tokens. Please reduce the length of the input messages.": 330
                }
                if i == 0
                else {}
            ),
            warmup_requests=0,
            stages=stages(1.0 + i / 10),
            lengths=lengths,
            server=window(f"run {40 - i}", 600.0),
            output_tokens_per_s=3000.0 + 100 * i,
            faster_than=39 if i == 0 else None,
        )
        for i in range(3)
    )
    gpus = tuple(
        GpuFacts(
            index=i,
            model="NVIDIA H100 80GB HBM3",
            memory_total_bytes=80 * GIB,
            numa_node=0 if i < 4 else 1,
            utilization_pct=92.0,
            memory_used_bytes=int(0.97 * 80 * GIB),
            power_w=699.0 if i < 2 else 520.0,
            power_limit_w=700.0,
            temperature_c=74.0,
            sm_clock_mhz=1500.0 if i < 2 else 1980.0,
            max_sm_clock_mhz=1980.0,
            clock_events={"SwPowerCap": 0.45} if i < 2 else {"Idle": 0.01},
            pcie_tx_kbps=2.0e6,
            pcie_rx_kbps=1.5e6,
        )
        for i in range(8)
    )
    return Snapshot(
        deployment="gpu-07/llama-70b",
        taken_at=NOW,
        config=ConfigFacts(
            engine="vllm",
            engine_version="0.11.0",
            model="meta-llama/Llama-3.1-70B-Instruct",
            settings={"tensor_parallel_size": 8, "max_num_seqs": 64},
            tensor_parallel=8,
            max_num_seqs=64,
            max_model_len=8192,
            max_num_batched_tokens=8192,
            chunked_prefill=True,
            prefix_caching=True,
            memory_fraction=0.97,
            kv_cache_dtype="auto",
            quantization=None,
            weights_bytes=140 * GIB,
            kv_bytes_per_token=327_680,
            kv_capacity_tokens=1_400_000,
            cpus=tuple(range(64, 96)),
            numa_node=2,
        ),
        gpus=gpus,
        engine=window("live", 60.0),
        host=HostFacts(
            cpu_count=128,
            load_1m=40.0,
            cpu_util_pct=35.0,
            numa_cpus={0: tuple(range(0, 64)), 1: tuple(range(64, 128))},
        ),
        runs=runs,
        traffic=replace(lengths, input_p50=5000.0, input_p99=12000.0),
        telemetry_seconds=300.0,
    )


def healthy() -> Snapshot:
    s = sick()
    quiet = dict(waiting_mean=0.0, waiting_max=0.0, queue_ms=5.0, ttft_ms=300.0, itl_ms=20.0)
    runs = tuple(
        replace(
            r,
            completed=1200,
            failed=0,
            error_rate=0.0,
            errors_by_class={},
            errors_by_message={},
            warmup_requests=20,
            stages=tuple(
                replace(st, ttft_p99_ms=st.ttft_p50_ms * 2, itl_p50_ms=20.0) for st in r.stages
            ),
            server=replace(r.server, **quiet),
            faster_than=None,
        )
        for r in s.runs
    )
    return replace(
        s,
        config=replace(s.config, memory_fraction=0.9, cpus=tuple(range(0, 32)), numa_node=0),
        gpus=tuple(
            replace(g, clock_events={}, memory_used_bytes=int(0.9 * 80 * GIB)) for g in s.gpus
        ),
        engine=replace(s.engine, hit_rate=0.35, **quiet),
        runs=runs,
        traffic=runs[0].lengths,
    )


def timed(snapshot: Snapshot, repeat: int) -> tuple[list[float], int]:
    found = evaluate(snapshot)  # warm: imports the rules
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        evaluate(snapshot)
        times.append((time.perf_counter() - start) * 1000)
    return times, len(found)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1000)
    args = p.parse_args()
    print(f"machine: {machine()}")
    print(f"{len(RULES)} rules, {args.repeat} evaluations per snapshot")
    worst = 0.0
    for name, snapshot in (("sick", sick()), ("healthy", healthy())):
        times, findings = timed(snapshot, args.repeat)
        times.sort()
        median = statistics.median(times)
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
        worst = max(worst, p99)
        print(
            f"{name:8} 8 GPUs, 3 runs × 3 stages, live window: {findings:2} findings, "
            f"median {median:.3f} ms, p99 {p99:.3f} ms per evaluate()"
        )
    ok = worst < TARGET_MS
    print(f"target: under {TARGET_MS:.0f} ms per evaluation: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
