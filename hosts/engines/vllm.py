"""``vllm serve``: the flags that matter for performance, with vLLM's names, types, defaults
and choices (vllm/engine/arg_utils.py, vllm/config/cache.py, vllm/config/scheduler.py).

Defaults of ``None`` are chosen by vLLM at start from the GPU (see ``auto_defaults``).
"""

from __future__ import annotations

from hosts.engines.flags import EngineArgError, EngineSpec, Flag, human_int

KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
QUANTIZATIONS = (
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "fp8",
    "compressed-tensors",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "marlin",
    "experts_int8",
    "fbgemm_fp8",
)

FLAGS = (
    Flag(
        "host",
        ("--host",),
        "str",
        None,
        "Host name to listen on (all interfaces if unset).",
        performance=False,
    ),
    Flag(
        "port",
        ("--port",),
        "int",
        8000,
        "Port to listen on.",
        minimum=1,
        maximum=65535,
        performance=False,
    ),
    Flag(
        "served_model_name",
        ("--served-model-name",),
        "str",
        None,
        "Model name(s) used in the API.",
        nargs="+",
        performance=False,
    ),
    Flag(
        "api_key",
        ("--api-key",),
        "str",
        None,
        "Key the server requires in the header.",
        performance=False,
        secret=True,
    ),
    Flag(
        "gpu_memory_utilization",
        ("--gpu-memory-utilization",),
        "float",
        0.9,
        "Fraction of GPU memory for the model executor (weights, activations, KV cache).",
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
    ),
    Flag(
        "max_num_seqs",
        ("--max-num-seqs",),
        "int",
        None,
        "Maximum number of sequences per iteration.",
        minimum=1,
    ),
    Flag(
        "max_num_batched_tokens",
        ("--max-num-batched-tokens",),
        "int",
        None,
        "Maximum number of tokens processed in one iteration.",
        minimum=1,
        parse=human_int,
    ),
    Flag(
        "max_model_len",
        ("--max-model-len",),
        "int",
        None,
        "Model context length (prompt + output); 1k, 32K or auto accepted.",
        minimum=-1,
        parse=human_int,
    ),
    Flag(
        "tensor_parallel_size",
        ("--tensor-parallel-size", "-tp"),
        "int",
        1,
        "Number of tensor parallel groups.",
        minimum=1,
    ),
    Flag(
        "enable_prefix_caching",
        ("--enable-prefix-caching",),
        "bool",
        None,
        "Automatic prefix caching (on by default).",
    ),
    Flag(
        "enable_chunked_prefill",
        ("--enable-chunked-prefill",),
        "bool",
        None,
        "Chunk prefills so they share steps with decodes (on by default).",
    ),
    Flag(
        "kv_cache_dtype",
        ("--kv-cache-dtype",),
        "str",
        "auto",
        "Data type of the KV cache.",
        choices=KV_CACHE_DTYPES,
        affects_answers=True,
    ),
    Flag(
        "dtype",
        ("--dtype",),
        "str",
        "auto",
        "Data type of weights and activations.",
        choices=DTYPES,
        affects_answers=True,
    ),
    Flag(
        "quantization",
        ("--quantization", "-q"),
        "str",
        None,
        "Weight quantization method.",
        choices=QUANTIZATIONS,
        affects_answers=True,
    ),
    Flag(
        "block_size",
        ("--block-size",),
        "int",
        None,
        "Tokens per KV-cache block (16).",
        choices=(1, 8, 16, 32, 64, 128),
    ),
    Flag(
        "scheduling_policy",
        ("--scheduling-policy",),
        "str",
        "fcfs",
        "fcfs: first come first served; priority: by request priority, then arrival.",
        choices=("fcfs", "priority"),
    ),
    Flag("seed", ("--seed",), "int", 0, "Random seed.", performance=False),
    Flag(
        "trust_remote_code",
        ("--trust-remote-code",),
        "bool",
        None,
        "Trust remote code from Hugging Face: runs the model repository's Python code.",
        bool_style="store_true",
        performance=False,
        loads_code=True,
    ),
    Flag(
        "disable_log_stats",
        ("--disable-log-stats",),
        "bool",
        None,
        "Do not log statistics.",
        bool_style="store_true",
        performance=False,
    ),
    # Request logging flipped to opt-in in vllm-project/vllm#21739 (first released in 0.10.1:
    # ray-project/ray#55336 keys on "<0.10.1"; vllm-project/vllm#24578 runs
    # `vllm-openai:v0.10.1 --enable-log-requests`). docs.vllm.ai/en/v0.12.0/cli/serve still
    # lists --disable-log-requests as [DEPRECATED]; llm-d/llm-d-benchmark#781 reports it gone
    # in 0.17.0 (vllm/engine/arg_utils.py AsyncEngineArgs.add_cli_args had both until then).
    Flag(
        "enable_log_requests",
        ("--enable-log-requests",),
        "bool",
        None,
        "Log every request.",
        bool_style="negatable",
        performance=False,
        since="0.10.1",
        counterpart="disable_log_requests",
    ),
    Flag(
        "disable_log_requests",
        ("--disable-log-requests",),
        "bool",
        None,
        "Do not log requests (the default from 0.10.1 on).",
        bool_style="store_true",
        performance=False,
        until="0.17.0",
        counterpart="enable_log_requests",
    ),
    # Unused since the V1 engine (vllm-project/vllm#27984), dropped from EngineArgs by
    # vllm-project/vllm#36216: present in 0.17.1, absent from 0.18.0 on (every release
    # checked with inspect.signature(EngineArgs) in unslothai/unsloth-zoo#1210).
    Flag(
        "swap_space",
        ("--swap-space",),
        "float",
        4,
        "CPU swap space per GPU in GiB (no effect on the V1 engine).",
        minimum=0,
        performance=False,
        until="0.18.0",
    ),
)


def _batched_tokens_cover_seqs(settings: dict) -> None:
    seqs, tokens = settings.get("max_num_seqs"), settings.get("max_num_batched_tokens")
    if seqs is not None and tokens is not None and tokens < seqs:
        raise EngineArgError(
            f"max_num_batched_tokens ({tokens}) must be greater than or equal to "
            f"max_num_seqs ({seqs}).",
            "max_num_batched_tokens",
        )


def _unchunked_prefill_fits_context(settings: dict) -> None:
    tokens, length = settings.get("max_num_batched_tokens"), settings.get("max_model_len")
    if settings.get("enable_chunked_prefill") is False and tokens and length and length > 0:
        if tokens < length:
            raise EngineArgError(
                f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({length}). "
                "This effectively limits the maximum sequence length to max_num_batched_tokens "
                "and makes vLLM reject longer sequences. Please increase max_num_batched_tokens "
                "or decrease max_model_len.",
                "max_num_batched_tokens",
            )


SPEC = EngineSpec(
    kind="vllm",
    prog="vllm serve",
    model_option=None,
    flags=FLAGS,
    cross_checks=(_batched_tokens_cover_seqs, _unchunked_prefill_fits_context),
    tp_dest="tensor_parallel_size",
    title="vllm serve",
)


def auto_defaults(gpu_memory_bytes: int, gpu_name: str = "") -> dict:
    """What ``vllm serve`` picks when the flags are unset (arg_utils ``_set_default_args``):
    1024 sequences / 8192 batched tokens on GPUs of 70 GiB or more except A100s, else 256 /
    2048."""
    big = gpu_memory_bytes >= 70 * 2**30 and "a100" not in gpu_name.lower()
    return {
        "max_num_seqs": 1024 if big else 256,
        "max_num_batched_tokens": 8192 if big else 2048,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "block_size": 16,
    }


METRIC_PREFIX = "vllm:"
HEALTH_PATH = "/health"
DEFAULT_PORT = 8000
