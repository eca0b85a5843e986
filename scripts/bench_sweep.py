"""How long the predict phase of a tuning sweep takes: a 200-point space scored with rate
bisection, as the manual quotes it.

    .venv/bin/python scripts/bench_sweep.py [--workers N] [--json]

The space: max_num_seqs × max_num_batched_tokens × gpu_memory_utilization ×
enable_chunked_prefill for Llama-3.1-8B on one H100 SXM (5 × 5 × 4 × 2 = 200 points) at an 8k
context, the default profile's load (512 in / 128 out), p95 TTFT ≤ 500 ms and p95 ITL ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sweep import Slo, parse_space, predict_space, sweep_workload  # noqa: E402

# Without chunked prefill vLLM needs max_num_batched_tokens ≥ max_model_len: an 8k context
# keeps most of those points startable (the others show the engine's refusal).
BASE = {"max_model_len": 8192}
SPACE = {
    "max_num_seqs": [16, 32, 64, 128, 256],
    "max_num_batched_tokens": [2048, 4096, 8192, 16384, 32768],
    "gpu_memory_utilization": {"min": 0.80, "max": 0.95, "step": 0.05},
    "enable_chunked_prefill": [True, False],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="default: all CPUs")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args()
    space = parse_space("vllm", None, SPACE)
    prediction = predict_space(
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
        BASE,
        space,
        "h100-sxm",
        1,
        sweep_workload({}, "rate"),
        "rate",
        Slo(ttft_p95_ms=500, itl_p95_ms=50),
        "tps_per_gpu",
        workers=args.workers,
    )
    numbers = {
        "points": space.size,
        "seconds": round(prediction.elapsed_s, 2),
        "ms_per_point": round(prediction.elapsed_s / space.size * 1000, 1),
        "workers": prediction.workers,
        # Machine-independent: simulator runs per startable point (the saturation run, then
        # one per load probed).
        "runs_per_point": round(
            sum(len(p.curve) + 1 for p in prediction.points if p.feasible)
            / max(1, prediction.counts["feasible"]),
            1,
        ),
        "cpus": os.cpu_count(),
        **prediction.counts,
    }
    if args.json:
        print(json.dumps(numbers))
    else:
        print(f"space: {space.describe()}")
        for key, value in numbers.items():
            print(f"{key:>14}: {value}")
        best = prediction.best
        if best is not None:
            print(f"{'best':>14}: {best.point} at {best.max_load:.2f} req/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
