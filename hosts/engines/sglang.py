"""``python -m sglang.launch_server``: the flags that matter for performance, with SGLang's
names, types, defaults and choices (python/sglang/srt/server_args.py)."""

from __future__ import annotations

from hosts.engines.flags import EngineArgError, EngineSpec, Flag

KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16")
QUANTIZATIONS = (
    "awq",
    "fp8",
    "gptq",
    "marlin",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "w8a8_int8",
    "w8a8_fp8",
)
SCHEDULE_POLICIES = ("fcfs", "lpm", "random", "dfs-weight", "lof", "priority")

FLAGS = (
    Flag(
        "host", ("--host",), "str", "127.0.0.1", "The host of the HTTP server.", performance=False
    ),
    Flag(
        "port",
        ("--port",),
        "int",
        30000,
        "The port of the HTTP server.",
        minimum=1,
        maximum=65535,
        performance=False,
    ),
    Flag(
        "served_model_name",
        ("--served-model-name",),
        "str",
        None,
        "Model name in the API.",
        performance=False,
    ),
    Flag(
        "api_key",
        ("--api-key",),
        "str",
        None,
        "API key of the server.",
        performance=False,
        secret=True,
    ),
    Flag(
        "mem_fraction_static",
        ("--mem-fraction-static",),
        "float",
        None,
        "Fraction of memory for static allocation (weights and KV cache pool).",
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
    ),
    Flag(
        "max_running_requests",
        ("--max-running-requests",),
        "int",
        None,
        "Maximum number of running requests.",
        minimum=1,
    ),
    Flag(
        "max_total_tokens",
        ("--max-total-tokens",),
        "int",
        None,
        "Maximum number of tokens in the memory pool (from memory when unset).",
        minimum=1,
    ),
    Flag(
        "chunked_prefill_size",
        ("--chunked-prefill-size",),
        "int",
        None,
        "Maximum tokens in a prefill chunk; -1 disables chunked prefill.",
        minimum=-1,
    ),
    Flag(
        "max_prefill_tokens",
        ("--max-prefill-tokens",),
        "int",
        16384,
        "Maximum tokens in a prefill batch.",
        minimum=1,
    ),
    Flag(
        "context_length",
        ("--context-length",),
        "int",
        None,
        "The model's maximum context length (from the model config when unset).",
        minimum=1,
    ),
    # --tp-size first so it is what gets rendered: every release has it (the v0.1 server_args
    # knew only --tp-size), --tensor-parallel-size is an alias since sgl-project/sglang#941.
    Flag(
        "tp_size",
        ("--tp-size", "--tensor-parallel-size"),
        "int",
        1,
        "The tensor parallelism size.",
        minimum=1,
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
        choices=("auto", "half", "float16", "bfloat16", "float", "float32"),
        affects_answers=True,
    ),
    Flag(
        "quantization",
        ("--quantization",),
        "str",
        None,
        "The quantization method.",
        choices=QUANTIZATIONS,
        affects_answers=True,
    ),
    Flag(
        "disable_radix_cache",
        ("--disable-radix-cache",),
        "bool",
        None,
        "Disable RadixAttention prefix caching.",
        bool_style="store_true",
    ),
    Flag(
        "schedule_policy",
        ("--schedule-policy",),
        "str",
        "fcfs",
        "The scheduling policy of the requests.",
        choices=SCHEDULE_POLICIES,
    ),
    Flag(
        "schedule_conservativeness",
        ("--schedule-conservativeness",),
        "float",
        1.0,
        "How conservative the scheduler is in admitting requests.",
        minimum=0,
    ),
    Flag("page_size", ("--page-size",), "int", 1, "Tokens per KV page.", minimum=1),
    Flag(
        "enable_metrics",
        ("--enable-metrics",),
        "bool",
        None,
        "Enable Prometheus metrics at /metrics.",
        bool_style="store_true",
        performance=False,
    ),
    Flag("random_seed", ("--random-seed",), "int", None, "The random seed.", performance=False),
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
)


def _prefill_chunk_fits(settings: dict) -> None:
    chunk = settings.get("chunked_prefill_size")
    if chunk == 0:
        raise EngineArgError(
            "chunked_prefill_size must be positive, or -1 to disable", "chunked_prefill_size"
        )


SPEC = EngineSpec(
    kind="sglang",
    prog="launch_server.py",
    model_option="--model-path",
    flags=FLAGS,
    cross_checks=(_prefill_chunk_fits,),
    tp_dest="tp_size",
    title="sglang",
)


def auto_defaults(gpu_memory_bytes: int, tp_size: int = 1) -> dict:
    """What SGLang picks when the flags are unset (server_args ``_handle_gpu_memory_settings``):
    the prefill chunk and CUDA-graph batch by GPU memory, then ``mem_fraction_static`` as what
    is left after reserving memory for activations and graphs."""
    mb = gpu_memory_bytes / 2**20
    gb = gpu_memory_bytes / 1e9
    small_tp = tp_size < 4
    if gb < 20:
        chunk, graph_bs = 2048, 8
    elif gb < 35:
        chunk, graph_bs = 2048, 24 if small_tp else 80
    elif gb < 60:
        chunk, graph_bs = 4096, 32 if small_tp else 160
    elif gb < 160:
        chunk, graph_bs = 8192, 256 if small_tp else 512
    else:
        chunk, graph_bs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp_size / 8 * 1024
    if gb > 60:
        reserved = max(reserved, 10240)
    return {
        "chunked_prefill_size": chunk,
        "cuda_graph_max_bs": graph_bs,
        "mem_fraction_static": round((mb - reserved) / mb, 3),
    }


METRIC_PREFIX = "sglang:"
HEALTH_PATH = "/health"
DEFAULT_PORT = 30000
