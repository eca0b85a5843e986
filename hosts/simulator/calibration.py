"""Public measurements the simulator's speed is held to, and how to reproduce each in virtual time.

Each point names its source (address, engine version or date as the source states them), the
engine, model, GPU, tensor parallelism, the workload as the source ran it and the metric it
reported. ``measure(point)`` runs the same workload through ``predict`` — the scheduler, KV
cache and cost model the real-time server runs — and returns the simulator's value of that
metric. tests/hosts/simulator/test_calibration.py holds every point within ±15 %;
``python scripts/calibration_table.py`` prints the table for the manual (docs/simulator.md).

How vLLM's nightly latency test measures (vllm/benchmarks/latency.py, vLLM 0.11; settings in
.buildkite/nightly-benchmarks/tests/latency-tests.json): ``LLM.generate`` on a batch of
``--batch-size 8`` prompts of ``--input-len 32`` random token ids, ``max_tokens=--output-len
128``, ``ignore_eos=True``, temperature 1.0, prefix caching off, ``load_format=dummy``; the
latency is the wall time of the whole call, averaged over 15 iterations after 5 warm-ups.
Here: 8 requests arriving at once, the time until the last one finishes.

Points left out, and why:
* vLLM's nightly throughput and serving tests sample 200 ShareGPT conversations; the simulator
  has no ShareGPT length distribution to replay, so a match would be a guess.
* MLPerf Inference (Llama-2-70B, Llama-3.1-8B on H100/H200): submissions run TensorRT-LLM with
  FP8 and per-system tuning under the benchmark's latency constraints; they calibrate a
  different engine, not vLLM or SGLang.
* Mixtral-8x7B (also in vLLM's nightly latency test): the catalog has no mixture-of-experts
  model; its step reads only the routed experts' weights, which this cost model does not do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hosts.simulator.predict import Workload, predict

TOLERANCE = 0.15

VLLM_LATENCY_BATCH = Workload(
    num_requests=8, input_tokens=32, output_tokens=128, concurrency=None, request_rate=float("inf")
)
# LLM(...) as the latency benchmark builds it: Llama-3 checkpoints (8192 positions), prefix
# caching off (latency.py sets it off by default).
VLLM_LATENCY_SETTINGS = {"max_model_len": 8192, "enable_prefix_caching": False}

BUILDKITE_H100 = "https://buildkite.com/elastic/enterprise-search-ruby/builds/571"
BUILDKITE_H200 = "https://buildkite.com/vllm/performance-benchmark/builds/9515"
A100_SWEEP = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"
H100_SWEEP = "https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/"
L4_SWEEP = "https://ai.wmx.dev/benchmarks"
SGLANG_PR_1060 = "https://github.com/sgl-project/sglang/pull/1060"
# vLLM's "Performance Benchmark" Buildkite annotations; neither page states the vLLM version.
# The H100 table is stored under an unrelated pipeline's address (its GPU column: 8xH100).
H100_VERSION = "vLLM performance benchmark annotation, GPU 8xH100"
H200_VERSION = "vLLM performance benchmark, build 9515"


@dataclass(frozen=True)
class Run:
    """One simulated benchmark run and the metric read from its result."""

    workload: Workload
    metric: str  # a key of METRICS


@dataclass(frozen=True)
class Point:
    """One public measurement and how to reproduce it."""

    key: str
    source: str
    version: str  # engine version and/or date, as the source states them
    engine: str
    model: str
    gpu: str
    tp: int
    workload: str  # the source's workload, in words
    metric: str  # what was reported, with its unit
    public: float
    runs: tuple[Run, ...]  # one run: its metric; two: the first over the second
    settings: dict = field(default_factory=dict)
    note: str = ""


METRICS = {
    # vllm bench latency: wall time of the whole batch.
    "batch_ms": lambda r: r["duration_s"] * 1000,
    "tpot_p50_ms": lambda r: r["tpot_ms"]["p50"],
    "itl_p50_ms": lambda r: r["itl_ms"]["p50"],
    # Decode speed of one stream: 1000 / mean TPOT.
    "decode_tok_s": lambda r: 1000 / r["tpot_ms"]["mean"],
    "output_tok_s": lambda r: r["output_throughput"],
    "input_tok_s": lambda r: r["total_input_tokens"] / r["duration_s"],
}


def _closed(concurrency: int, prompts: int, input_tokens: int, output_tokens: int) -> Workload:
    return Workload(
        num_requests=prompts,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        concurrency=concurrency,
    )


POINTS: tuple[Point, ...] = (
    Point(
        "vllm-latency-llama8b-tp1-h100",
        BUILDKITE_H100,
        H100_VERSION,
        "vllm",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "h100-sxm",
        1,
        "vllm bench latency: batch 8, 32 in / 128 out, ignore_eos, dummy weights",
        "mean latency of the batch (ms)",
        997.542,
        (Run(VLLM_LATENCY_BATCH, "batch_ms"),),
        VLLM_LATENCY_SETTINGS,
    ),
    Point(
        "vllm-latency-llama8b-tp1-h200",
        BUILDKITE_H200,
        H200_VERSION,
        "vllm",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "h200",
        1,
        "vllm bench latency: batch 8, 32 in / 128 out, ignore_eos, dummy weights",
        "mean latency of the batch (ms)",
        833.421,
        (Run(VLLM_LATENCY_BATCH, "batch_ms"),),
        VLLM_LATENCY_SETTINGS,
    ),
    Point(
        "vllm-latency-llama70b-tp4-h100",
        BUILDKITE_H100,
        H100_VERSION,
        "vllm",
        "meta-llama/Meta-Llama-3-70B-Instruct",
        "h100-sxm",
        4,
        "vllm bench latency: batch 8, 32 in / 128 out, ignore_eos, dummy weights",
        "mean latency of the batch (ms)",
        2444.47,
        (Run(VLLM_LATENCY_BATCH, "batch_ms"),),
        VLLM_LATENCY_SETTINGS,
    ),
    Point(
        "vllm-latency-llama70b-tp4-h200",
        BUILDKITE_H200,
        H200_VERSION,
        "vllm",
        "meta-llama/Meta-Llama-3-70B-Instruct",
        "h200",
        4,
        "vllm bench latency: batch 8, 32 in / 128 out, ignore_eos, dummy weights",
        "mean latency of the batch (ms)",
        2077.53,
        (Run(VLLM_LATENCY_BATCH, "batch_ms"),),
        VLLM_LATENCY_SETTINGS,
    ),
    Point(
        "vllm-a100-40g-llama8b-decode-c1",
        A100_SWEEP,
        "vLLM 0.23.0 (as stated), default vllm serve settings",
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
        "a100-40g",
        1,
        "vllm bench serve random 1024 in / 128 out, ignore_eos, max-concurrency 1, 20 prompts",
        "single-stream decode (tokens/s, 1000 / TPOT)",
        75.0,
        (Run(_closed(1, 20, 1024, 128), "decode_tok_s"),),
        note="the source gives 'about 75 tokens/sec'",
    ),
    Point(
        "vllm-a100-40g-llama8b-gain-c8",
        A100_SWEEP,
        "vLLM 0.23.0 (as stated), default vllm serve settings",
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
        "a100-40g",
        1,
        "as above, max-concurrency 8 (160 prompts) vs 1 (20 prompts)",
        "output throughput at concurrency 8 / at 1 (×)",
        6.6,
        (
            Run(_closed(8, 160, 1024, 128), "output_tok_s"),
            Run(_closed(1, 20, 1024, 128), "output_tok_s"),
        ),
    ),
    Point(
        "vllm-h100-llama8b-tpot-c1",
        H100_SWEEP,
        "vLLM 0.21.0, fp16, 2026-05-16",
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
        "h100-sxm",
        1,
        "InferenceBench llm.inference.chatbot-short, concurrency 1",
        "TPOT p50 (ms)",
        6.48,
        (Run(_closed(1, 8, 512, 256), "tpot_p50_ms"),),
        note="the suite's lengths are not stated; short chats (512 in / 256 out) assumed — "
        "the simulated TPOT moves by 1.6 % between 128 and 2048 prompt tokens",
    ),
    Point(
        "vllm-l4-qwen0.5b-itl-c1",
        L4_SWEEP,
        "vLLM v0.23.0 (V1 engine)",
        "vllm",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "l4",
        1,
        "vllm bench serve 256 in / 128 out, ignore_eos, closed loop, concurrency 1",
        "ITL p50 (ms)",
        5.1,
        (Run(_closed(1, 20, 256, 128), "itl_p50_ms"),),
        {"gpu_memory_utilization": 0.6, "max_model_len": 8192},
    ),
    Point(
        "vllm-l4-qwen0.5b-throughput-c8",
        L4_SWEEP,
        "vLLM v0.23.0 (V1 engine)",
        "vllm",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "l4",
        1,
        "vllm bench serve 256 in / 128 out, ignore_eos, closed loop, concurrency 8",
        "output throughput (tokens/s)",
        1312.0,
        (Run(_closed(8, 80, 256, 128), "output_tok_s"),),
        {"gpu_memory_utilization": 0.6, "max_model_len": 8192},
    ),
    Point(
        "vllm-l4-qwen0.5b-throughput-c32",
        L4_SWEEP,
        "vLLM v0.23.0 (V1 engine)",
        "vllm",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "l4",
        1,
        "vllm bench serve 256 in / 128 out, ignore_eos, closed loop, concurrency 32",
        "output throughput (tokens/s)",
        3773.0,
        (Run(_closed(32, 320, 256, 128), "output_tok_s"),),
        {"gpu_memory_utilization": 0.6, "max_model_len": 8192},
    ),
    Point(
        "sglang-h100-llama8b-prefill",
        SGLANG_PR_1060,
        "SGLang main of 2024-08-13; GPU per the pull request's title (H100)",
        "sglang",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "h100-sxm",
        1,
        "sglang.bench_serving random, 1000 prompts, input uniform up to 8192 (mean 4065), "
        "output up to 8, all at once, radix cache off",
        "input token throughput (tokens/s)",
        27670.26,
        (
            Run(
                Workload(
                    num_requests=1000,
                    input_tokens=4096,
                    output_tokens=4,
                    input_jitter=1.0,
                    output_jitter=1.0,
                    concurrency=None,
                    request_rate=float("inf"),
                ),
                "input_tok_s",
            ),
        ),
        {"disable_radix_cache": True},
        note="run with --enable-torch-compile --disable-flashinfer (Triton attention), "
        "which the simulator does not model",
    ),
)


def measure(point: Point) -> float:
    """The simulator's value of ``point``'s metric, for the point's workload and settings."""
    for run in point.runs:
        if run.metric not in METRICS:
            raise ValueError(f"unknown metric {run.metric!r} (choose from {', '.join(METRICS)})")
    values = [
        METRICS[run.metric](
            predict(
                point.engine,
                point.model,
                {**_parallel(point), **point.settings},
                point.gpu,
                run.workload,
                num_gpus=point.tp,
            )
        )
        for run in point.runs
    ]
    return values[0] if len(values) == 1 else values[0] / values[1]


def _parallel(point: Point) -> dict:
    if point.tp == 1:
        return {}
    return {"tensor_parallel_size" if point.engine == "vllm" else "tp_size": point.tp}


def within(point: Point, value: float) -> bool:
    return abs(value / point.public - 1) <= TOLERANCE
