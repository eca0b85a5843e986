"""The simulator's speed follows its settings: calibration to public figures and the
directional effects that experts rely on (virtual time, same scheduler as the server)."""

import pytest

from hosts.engines.catalog import GPUS
from hosts.simulator.config import StartupError, build_config
from hosts.simulator.predict import Workload, predict

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
CTX = {"max_model_len": 8192}


def within(value, target, tolerance=0.30):
    return target * (1 - tolerance) <= value <= target * (1 + tolerance)


# --- coarse sanity (±30 %) ----------------------------------------------------------------------
# Round figures without one public source to pin them; the sourced points (±15 %) are in
# hosts/simulator/calibration.py and test_calibration.py.
def test_h100_sixteen_streams():
    r = predict(
        "vllm",
        LLAMA,
        CTX,
        "h100-sxm",
        Workload(num_requests=64, input_tokens=1024, output_tokens=1024, concurrency=16),
    )
    assert within(r["itl_ms"]["p50"], 11.0), r["itl_ms"]
    assert within(r["output_throughput"], 1400), r["output_throughput"]


def test_prefill_rate_h100():
    """≈ 30k prompt tokens/s for an 8B model on an H100 (~45 % of dense bf16 peak on its
    matmul FLOPs, attention and the lm_head of one position per prompt on top)."""
    r = predict(
        "vllm",
        LLAMA,
        CTX,
        "h100-sxm",
        Workload(
            num_requests=64,
            input_tokens=4000,
            output_tokens=1,
            concurrency=64,
            request_rate=float("inf"),
        ),
    )
    assert within(r["total_input_tokens"] / r["duration_s"], 30000), r["duration_s"]


# --- directional effects -------------------------------------------------------------------------
def test_more_max_num_seqs_more_throughput_slower_tokens_under_overload():
    overload = Workload(num_requests=400, input_tokens=512, output_tokens=256, concurrency=256)
    small = predict("vllm", LLAMA, {**CTX, "max_num_seqs": 32}, "a100-80g", overload)
    large = predict("vllm", LLAMA, {**CTX, "max_num_seqs": 256}, "a100-80g", overload)
    assert large["output_throughput"] > 1.3 * small["output_throughput"]
    assert large["itl_ms"]["p50"] > 2 * small["itl_ms"]["p50"]
    # Once admitted, a request waits longer for its first token in the fuller batch; the
    # end-to-end TTFT still falls because the queue drains faster (docs/simulator.md).
    assert large["prefill_ms"]["p50"] > small["prefill_ms"]["p50"]
    assert large["max_concurrent_requests"] == 256 and small["max_concurrent_requests"] == 32


def test_larger_batched_token_budget_lowers_ttft_raises_itl():
    long_prompts = Workload(
        num_requests=200,
        input_tokens=6000,
        output_tokens=200,
        concurrency=None,
        request_rate=1.5,
        seed=2,
    )
    small = predict(
        "vllm", LLAMA, {**CTX, "max_num_batched_tokens": 1024}, "h100-sxm", long_prompts
    )
    large = predict(
        "vllm", LLAMA, {**CTX, "max_num_batched_tokens": 8192}, "h100-sxm", long_prompts
    )
    assert large["ttft_ms"]["mean"] < 0.9 * small["ttft_ms"]["mean"]
    assert large["itl_ms"]["p99"] > 2 * small["itl_ms"]["p99"]


def test_prefix_caching_lowers_ttft_for_shared_prefixes():
    shared = Workload(
        num_requests=200,
        input_tokens=2048,
        output_tokens=64,
        concurrency=8,
        shared_prefix_tokens=1800,
        num_prefixes=2,
    )
    on = predict("vllm", LLAMA, {**CTX, "enable_prefix_caching": True}, "h100-sxm", shared)
    off = predict("vllm", LLAMA, {**CTX, "enable_prefix_caching": False}, "h100-sxm", shared)
    assert on["ttft_ms"]["p50"] < 0.5 * off["ttft_ms"]["p50"]
    assert on["prefix_cache_hit_rate"] > 0.8 and off["prefix_cache_hit_rate"] == 0


def test_radix_cache_does_the_same_for_sglang():
    shared = Workload(
        num_requests=100,
        input_tokens=2048,
        output_tokens=32,
        concurrency=8,
        shared_prefix_tokens=1800,
    )
    on = predict("sglang", "Qwen/Qwen2.5-7B", {"context_length": 8192}, "h100-sxm", shared)
    off = predict(
        "sglang",
        "Qwen/Qwen2.5-7B",
        {"context_length": 8192, "disable_radix_cache": True},
        "h100-sxm",
        shared,
    )
    assert on["ttft_ms"]["p50"] < 0.5 * off["ttft_ms"]["p50"]


def test_fp8_kv_cache_runs_more_sequences_at_once():
    kv_bound = Workload(num_requests=600, input_tokens=2000, output_tokens=1000, concurrency=512)
    bf16 = predict("vllm", LLAMA, CTX, "a100-40g", kv_bound)
    fp8 = predict("vllm", LLAMA, {**CTX, "kv_cache_dtype": "fp8"}, "a100-40g", kv_bound)
    assert fp8["kv_cache_capacity_tokens"] >= 1.9 * bf16["kv_cache_capacity_tokens"]
    assert fp8["max_concurrent_requests"] > 1.5 * bf16["max_concurrent_requests"]
    assert fp8["output_throughput"] > bf16["output_throughput"]


def test_lower_max_model_len_allows_more_concurrent_sequences():
    long = build_config("vllm", LLAMA, {"max_model_len": 32768}, GPUS["a100-40g"])
    short = build_config("vllm", LLAMA, {"max_model_len": 4096}, GPUS["a100-40g"])
    assert "Maximum concurrency for 4,096 tokens per request" in short.log_lines[-1]
    assert short.kv_capacity_tokens / 4096 > 7 * long.kv_capacity_tokens / 32768
    sg_long = build_config("sglang", "Qwen/Qwen2.5-7B", {"context_length": 32768}, GPUS["l4"])
    sg_short = build_config("sglang", "Qwen/Qwen2.5-7B", {"context_length": 8192}, GPUS["l4"])
    assert sg_short.max_num_seqs > sg_long.max_num_seqs


def test_memory_utilisation_near_one_fails_for_large_batches_only():
    gpu = GPUS["h100-sxm"]
    build_config("vllm", LLAMA, {**CTX, "gpu_memory_utilization": 0.98, "max_num_seqs": 64}, gpu)
    with pytest.raises(StartupError, match="CUDA out of memory"):
        build_config(
            "vllm", LLAMA, {**CTX, "gpu_memory_utilization": 0.98, "max_num_seqs": 512}, gpu
        )
    build_config("vllm", LLAMA, {**CTX, "gpu_memory_utilization": 0.9, "max_num_seqs": 512}, gpu)


def test_tensor_parallel_speeds_up_a_big_model():
    w = Workload(num_requests=8, input_tokens=256, output_tokens=256, concurrency=1)
    tp2 = predict(
        "vllm",
        "meta-llama/Llama-3.1-70B-Instruct",
        {**CTX, "tensor_parallel_size": 2},
        "h100-sxm",
        w,
        num_gpus=2,
    )
    tp4 = predict(
        "vllm",
        "meta-llama/Llama-3.1-70B-Instruct",
        {**CTX, "tensor_parallel_size": 4},
        "h100-sxm",
        w,
        num_gpus=4,
    )
    # Faster, but less than 2× because of the all-reduces.
    assert tp2["tpot_ms"]["mean"] / 2 < tp4["tpot_ms"]["mean"] < tp2["tpot_ms"]["mean"]


def test_predict_is_deterministic():
    w = Workload(
        num_requests=50,
        input_tokens=300,
        output_tokens=50,
        concurrency=None,
        request_rate=5,
        input_jitter=0.5,
        seed=3,
    )
    assert predict("vllm", LLAMA, CTX, "l40s", w) == predict("vllm", LLAMA, CTX, "l40s", w)


def test_quantized_weights_leave_more_kv_and_decode_faster():
    gpu = GPUS["l40s"]
    bf16 = build_config("vllm", LLAMA, CTX, gpu)
    fp8 = build_config("vllm", "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", CTX, gpu)
    awq = build_config("vllm", "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4", CTX, gpu)
    assert awq.weights_bytes_per_gpu < fp8.weights_bytes_per_gpu < bf16.weights_bytes_per_gpu
    assert awq.kv_capacity_tokens > fp8.kv_capacity_tokens > bf16.kv_capacity_tokens
    w = Workload(num_requests=4, input_tokens=128, output_tokens=128, concurrency=1)
    slow = predict("vllm", LLAMA, CTX, gpu, w)["tpot_ms"]["mean"]
    fast = predict("vllm", "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", CTX, gpu, w)
    assert fast["tpot_ms"]["mean"] < 0.7 * slow
    with pytest.raises(StartupError, match="does not match the quantization method"):
        build_config(
            "vllm",
            "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8",
            {**CTX, "quantization": "awq"},
            gpu,
        )
