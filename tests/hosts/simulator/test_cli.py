"""The simulator's command line takes the real flags and fails like the real engines."""

import re

import pytest

from hosts.engines.catalog import GPUS
from hosts.simulator.config import build_config
from tests.hosts.simulator.conftest import LLAMA, QWEN, run_cli


def test_unknown_flag_is_refused_like_vllm():
    result = run_cli("vllm", LLAMA, "--swap-space", "4")
    assert result.returncode == 2
    assert "vllm: error: unrecognized arguments: --swap-space 4" in result.stderr
    assert result.stderr.startswith("usage: vllm serve")


def test_unknown_flag_is_refused_like_sglang():
    result = run_cli("sglang", "--model-path", QWEN, "--enable-magic")
    assert result.returncode == 2
    assert "launch_server.py: error: unrecognized arguments: --enable-magic" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-cache-dtype", "fp4"], "argument --kv-cache-dtype: invalid choice: 'fp4'"),
        (["--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value: 'many'"),
        (
            ["--gpu-memory-utilization", "1.5"],
            "argument --gpu-memory-utilization: 1.5 must be <= 1",
        ),
        (["--gpu-memory-utilization", "0"], "must be > 0"),
        (["--served-model-name", "x;reboot"], "invalid value 'x;reboot'"),
    ],
)
def test_invalid_values_are_refused(args, message):
    result = run_cli("vllm", LLAMA, *args)
    assert result.returncode == 2, result.stderr
    assert "vllm serve: error: " in result.stderr and message in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gpu-memory-utilization", "0.2"],
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
        ),
        (
            ["--gpu", "l4"],  # 131,072-token context does not fit in an L4's KV cache
            "To serve at least one request with the models's max seq len (131072)",
        ),
        (
            ["--max-model-len", "200000"],
            "User-specified max_model_len (200000) is greater than the "
            "derived max_model_len (max_position_embeddings=131072",
        ),
        (["-tp", "2"], "tensor_parallel_size (2) > 1 GPU(s)"),
        (
            ["-tp", "3", "--num-gpus", "4"],
            "Total number of attention heads (32) must be divisible by tensor parallel size (3).",
        ),
        (["--gpu-memory-utilization", "0.995"], "Free memory on device"),
        # vLLM checks this when it builds its scheduler config, after parsing: a start failure.
        (
            ["--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
            "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512)",
        ),
        (["--gpu-memory-utilization", "0.98", "--max-model-len", "8192"], "CUDA out of memory"),
    ],
)
def test_infeasible_configs_fail_at_start(args, message):
    result = run_cli("vllm", LLAMA, *args)
    assert result.returncode == 1
    assert "EngineCore failed to start." in result.stderr
    assert message in result.stderr


def test_near_full_memory_fails_only_for_larger_batches():
    # The same 0.98 that fails above with the default 1024 sequences starts with 64.
    ok = build_config(
        "vllm",
        LLAMA,
        {"gpu_memory_utilization": 0.98, "max_model_len": 8192, "max_num_seqs": 64},
        GPUS["h100-sxm"],
    )
    assert ok.max_num_seqs == 64


def test_sglang_start_failures():
    result = run_cli("sglang", "--model-path", QWEN, "--mem-fraction-static", "0.1")
    assert result.returncode == 1
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in (
        result.stderr
    )
    result = run_cli("sglang", "--model-path", QWEN, "--tp-size", "3", "--num-gpus", "4")
    assert result.returncode == 1
    assert "Total number of attention heads (28) must be divisible by tensor parallel size (3)" in (
        result.stderr
    )


def test_startup_log_reports_kv_capacity_like_vllm(sim_server):
    server = sim_server("vllm", "--max-model-len", "8192")
    log = server.stop()
    cfg = build_config("vllm", LLAMA, {"max_model_len": 8192}, GPUS["h100-sxm"])
    tokens = re.search(r"GPU KV cache size: ([\d,]+) tokens", log).group(1)
    assert int(tokens.replace(",", "")) == cfg.kv_capacity_tokens
    assert (
        f"Maximum concurrency for 8,192 tokens per request: {cfg.kv_capacity_tokens / 8192:.2f}x"
        in log
    )


def test_startup_log_reports_kv_capacity_like_sglang(sim_server):
    log = sim_server("sglang", "--context-length", "8192").stop()
    assert re.search(
        r"KV Cache is allocated\. #tokens: \d+, K size: [\d.]+ GB, V size: "
        r"[\d.]+ GB",
        log,
    )
    assert re.search(
        r"max_total_num_tokens=\d+, chunked_prefill_size=8192, "
        r"max_prefill_tokens=16384, max_running_requests=\d+, context_len=8192",
        log,
    )
