"""From engine flags to a simulated engine: effective settings and GPU memory, as the engines
compute them at start, or the error the real engine would stop with."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hosts.engines import get_spec, sglang, vllm
from hosts.engines.catalog import GpuSpec, ModelSpec, resolve_model

GIB = 2**30
CUDA_CONTEXT_BYTES = 0.55 * GIB  # CUDA context + NCCL/cuBLAS workspaces: outside torch
NON_TORCH_BYTES = 0.45 * GIB  # counted inside the budget by vLLM's profiler
SIM_BLOCK = 16  # KV accounting unit where the engine pages by single tokens (SGLang)


class StartupError(RuntimeError):
    """The engine refuses to start; ``str()`` is the real engine's message."""

    def __init__(self, message: str, exception: str = "ValueError"):
        super().__init__(message)
        self.exception = exception


@dataclass
class SimConfig:
    """Everything the scheduler, the cost model and the server need, already derived."""

    engine: str
    model_name: str
    served_model_name: str
    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int
    tp: int
    max_num_seqs: int
    token_budget: int  # tokens per step (vLLM max_num_batched_tokens / SGLang chunk size)
    max_model_len: int
    block_size: int
    num_blocks: int
    prefix_caching: bool
    chunked_prefill: bool
    mixed_batches: bool  # vLLM mixes prefill chunks into decode steps; SGLang alternates
    scheduling_policy: str
    weight_dtype_bytes: float
    kv_dtype_bytes: float
    kv_bytes_per_token: float  # per GPU
    weights_bytes_per_gpu: float
    activation_bytes: float
    kv_pool_bytes: float  # per GPU
    reserved_bytes: float  # what the engine holds on each GPU once started
    api_key: str | None = None
    host: str | None = None
    port: int = 8000
    metrics_enabled: bool = True
    settings: dict = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def metric_prefix(self) -> str:
        return "vllm:" if self.engine == "vllm" else "sglang:"


def activation_peak_bytes(model: ModelSpec, tokens: int, seqs: int, tp: int) -> float:
    """Peak activation memory of a forward pass over ``tokens`` and sampling for ``seqs``."""
    per_token = (2 * model.intermediate + 4 * model.hidden) * 2 / tp
    logits = seqs * model.vocab * 4 * 2  # fp32 logits + probabilities
    return tokens * per_token + logits


def cuda_graph_bytes(seqs: int) -> float:
    """Memory of the captured CUDA graphs: one per batch size up to 512 sequences."""
    return min(seqs, 512) * 2 * 2**20 + 0.3 * GIB


def build_config(
    engine: str, model_name: str, settings: dict, gpu: GpuSpec, num_gpus: int = 1
) -> SimConfig:
    """Validate like the engine and derive the simulated engine, or raise StartupError."""
    spec = get_spec(engine)
    clean, errors = spec.validate(settings)
    if errors:
        raise StartupError("; ".join(errors.values()))
    model = resolve_model(model_name)
    build = _build_vllm if engine == "vllm" else _build_sglang
    return build(spec, model_name, model, clean, gpu, num_gpus)


def _weights(
    model: ModelSpec, quantization: str | None, dtype: str
) -> tuple[ModelSpec, float, float]:
    """``(model as loaded, activation dtype bytes, weight bytes)``, or the engine's refusal."""
    if quantization and model.quantization and quantization.split("_")[0] != model.quantization:
        raise StartupError(
            f"Quantization method specified in the model config ({model.quantization}) does not "
            f"match the quantization method specified in the `quantization` argument "
            f"({quantization})."
        )
    if quantization in ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin") and (
        model.quantization is None
    ):
        raise StartupError(
            f"Cannot find the config file for {quantization}: the model is not quantized with it."
        )
    if quantization in ("fp8", "fbgemm_fp8", "modelopt", "w8a8_fp8") and model.quantization is None:
        model = replace(model, quantization="fp8")  # online FP8 weight quantization
    if model.quantization is None and dtype in ("float", "float32"):
        return model, 4.0, model.params * 4.0
    return model, 2.0, model.weight_bytes


def _kv_dtype_bytes(kv_cache_dtype: str, dtype_bytes: float) -> float:
    if kv_cache_dtype.startswith("fp8"):
        return 1.0
    if kv_cache_dtype == "auto":
        return dtype_bytes
    return 2.0


def _check_parallel(model: ModelSpec, tp: int, num_gpus: int) -> None:
    if tp > num_gpus:
        raise StartupError(
            f"The number of required GPUs exceeds the total number of available GPUs in the "
            f"placement group: tensor_parallel_size ({tp}) > {num_gpus} GPU(s) on this host."
        )
    if model.heads % tp:
        raise StartupError(
            f"Total number of attention heads ({model.heads}) must be divisible by tensor "
            f"parallel size ({tp})."
        )


def _kv_per_token_per_gpu(model: ModelSpec, kv_bytes: float, tp: int) -> float:
    kv_heads_per_gpu = max(1, model.kv_heads // tp) if tp <= model.kv_heads else 1
    return 2 * model.layers * kv_heads_per_gpu * model.head_dim * kv_bytes


def _build_vllm(spec, model_name, model, s, gpu, num_gpus) -> SimConfig:
    auto = vllm.auto_defaults(gpu.memory_bytes, gpu.nvml_name)
    tp = s.get("tensor_parallel_size", 1)
    _check_parallel(model, tp, num_gpus)
    model, dtype_bytes, weights = _weights(model, s.get("quantization"), s.get("dtype", "auto"))
    kv_bytes = _kv_dtype_bytes(s.get("kv_cache_dtype", "auto"), dtype_bytes)

    derived_len = model.max_position
    max_model_len = s.get("max_model_len", -1)
    if max_model_len in (None, -1):
        max_model_len = derived_len
    elif max_model_len > derived_len:
        raise StartupError(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={derived_len} or model_max_length=None in "
            f"model's config.json). To allow overriding this maximum, set the env var "
            f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    chunked = s.get("enable_chunked_prefill", auto["enable_chunked_prefill"])
    budget = s.get("max_num_batched_tokens")
    max_num_seqs = s.get("max_num_seqs")
    if max_num_seqs is None:
        # An unset max_num_seqs never exceeds an explicit token budget.
        max_num_seqs = min(auto["max_num_seqs"], budget or auto["max_num_seqs"])
    if budget is None:
        budget = (
            auto["max_num_batched_tokens"]
            if chunked
            else max(max_model_len, auto["max_num_batched_tokens"])
        )
        budget = max(budget, max_num_seqs)
    if budget < max_num_seqs:
        raise StartupError(
            f"max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs "
            f"({max_num_seqs})."
        )
    if not chunked and budget < max_model_len:
        raise StartupError(
            f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and "
            "makes vLLM reject longer sequences. Please increase max_num_batched_tokens or "
            "decrease max_model_len."
        )
    block_size = s.get("block_size", auto["block_size"])
    util = s.get("gpu_memory_utilization", 0.9)

    total = gpu.memory_bytes
    free_at_start = total - CUDA_CONTEXT_BYTES
    requested = total * util
    if requested > free_at_start:
        raise StartupError(
            f"Free memory on device ({free_at_start / GIB:.2f}/{total / GIB:.2f} GiB) on startup "
            f"is less than desired GPU memory utilization ({util}, {requested / GIB:.2f} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes."
        )
    weights_per_gpu = weights / tp
    activation = activation_peak_bytes(model, budget, max_num_seqs, tp)
    non_torch = NON_TORCH_BYTES + (0.25 * GIB if tp > 1 else 0)
    kv_pool = requested - weights_per_gpu - activation - non_torch
    if kv_pool <= 0:
        raise StartupError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when initializing the engine."
        )
    graphs = cuda_graph_bytes(max_num_seqs)
    if requested + graphs > free_at_start:
        left = max(free_at_start - requested, 0)
        raise StartupError(
            f"CUDA out of memory. Tried to allocate {graphs / GIB:.2f} GiB. GPU 0 has a total "
            f"capacity of {total / GIB:.2f} GiB of which {left / GIB:.2f} GiB is free. "
            f"(while capturing CUDA graphs for max_num_seqs={max_num_seqs})",
            exception="torch.OutOfMemoryError",
        )
    kv_per_token = _kv_per_token_per_gpu(model, kv_bytes, tp)
    num_blocks = int(kv_pool // (kv_per_token * block_size))
    capacity = num_blocks * block_size
    if max_model_len > capacity:
        needed = max_model_len * kv_per_token
        raise StartupError(
            f"To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV "
            f"cache memory ({kv_pool / GIB:.2f} GiB). Based on the available memory, the "
            f"estimated maximum model length is {capacity}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )
    served = s.get("served_model_name") or [model_name]
    config = SimConfig(
        engine="vllm",
        model_name=model_name,
        served_model_name=served[0],
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        tp=tp,
        max_num_seqs=max_num_seqs,
        token_budget=budget,
        max_model_len=max_model_len,
        block_size=block_size,
        num_blocks=num_blocks,
        prefix_caching=s.get("enable_prefix_caching", auto["enable_prefix_caching"]),
        chunked_prefill=chunked,
        mixed_batches=True,
        scheduling_policy=s.get("scheduling_policy", "fcfs"),
        weight_dtype_bytes=dtype_bytes,
        kv_dtype_bytes=kv_bytes,
        kv_bytes_per_token=kv_per_token,
        weights_bytes_per_gpu=weights_per_gpu,
        activation_bytes=activation,
        kv_pool_bytes=kv_pool,
        reserved_bytes=requested + graphs + CUDA_CONTEXT_BYTES,
        api_key=s.get("api_key"),
        host=s.get("host"),
        port=s.get("port", vllm.DEFAULT_PORT),
        metrics_enabled=True,
        settings=dict(s),
    )
    config.log_lines = [
        f"Model loading took {weights_per_gpu / GIB:.4f} GiB of memory",
        f"Available KV cache memory: {kv_pool / GIB:.2f} GiB",
        f"GPU KV cache size: {capacity:,} tokens",
        f"Maximum concurrency for {max_model_len:,} tokens per request: "
        f"{capacity / max_model_len:.2f}x",
    ]
    return config


def _build_sglang(spec, model_name, model, s, gpu, num_gpus) -> SimConfig:
    tp = s.get("tp_size", 1)
    _check_parallel(model, tp, num_gpus)
    auto = sglang.auto_defaults(gpu.memory_bytes, tp)
    model, dtype_bytes, weights = _weights(model, s.get("quantization"), s.get("dtype", "auto"))
    kv_bytes = _kv_dtype_bytes(s.get("kv_cache_dtype", "auto"), dtype_bytes)
    fraction = s.get("mem_fraction_static", auto["mem_fraction_static"])
    chunk = s.get("chunked_prefill_size", auto["chunked_prefill_size"])
    chunked = chunk != -1
    budget = chunk if chunked else s.get("max_prefill_tokens", 16384)

    total = gpu.memory_bytes
    weights_per_gpu = weights / tp
    kv_pool = total * fraction - weights_per_gpu
    kv_per_token = _kv_per_token_per_gpu(model, kv_bytes, tp)
    if kv_pool <= 0:
        raise StartupError(
            "Not enough memory. Please try to increase --mem-fraction-static.",
            exception="RuntimeError",
        )
    max_total = int(kv_pool // kv_per_token)
    if s.get("max_total_tokens"):
        max_total = min(max_total, s["max_total_tokens"])
    context_len = s.get("context_length") or model.max_position
    if context_len > model.max_position:
        raise StartupError(
            f"Requested context_length={context_len} is greater than the derived "
            f"context_length={model.max_position}. This may lead to incorrect model outputs or "
            "CUDA errors. To allow overriding this maximum, set the env var "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
        )
    # model_runner: min(max(max_total / context_len × 512, 2048), 4096)
    max_running = s.get("max_running_requests") or min(
        max(int(max_total / context_len * 512), 2048), 4096
    )
    activation = activation_peak_bytes(model, budget, min(max_running, 1024), tp)
    headroom = total * (1 - fraction) - CUDA_CONTEXT_BYTES
    graphs = cuda_graph_bytes(auto["cuda_graph_max_bs"])
    if headroom < activation + graphs:
        raise StartupError(
            f"CUDA out of memory. Tried to allocate {activation / GIB:.2f} GiB. GPU 0 has a total "
            f"capacity of {total / GIB:.2f} GiB of which {max(headroom, 0) / GIB:.2f} GiB is free."
            " Try decreasing --mem-fraction-static or --chunked-prefill-size.",
            exception="torch.OutOfMemoryError",
        )
    block_size = SIM_BLOCK
    num_blocks = max_total // block_size
    served = s.get("served_model_name") or model_name
    config = SimConfig(
        engine="sglang",
        model_name=model_name,
        served_model_name=served,
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        tp=tp,
        max_num_seqs=max_running,
        token_budget=budget,
        max_model_len=context_len,
        block_size=block_size,
        num_blocks=num_blocks,
        prefix_caching=not s.get("disable_radix_cache", False),
        chunked_prefill=chunked,
        mixed_batches=False,
        scheduling_policy=s.get("schedule_policy", "fcfs"),
        weight_dtype_bytes=dtype_bytes,
        kv_dtype_bytes=kv_bytes,
        kv_bytes_per_token=kv_per_token,
        weights_bytes_per_gpu=weights_per_gpu,
        activation_bytes=activation,
        kv_pool_bytes=kv_pool,
        reserved_bytes=total * fraction + graphs + CUDA_CONTEXT_BYTES,
        api_key=s.get("api_key"),
        host=s.get("host", "127.0.0.1"),
        port=s.get("port", sglang.DEFAULT_PORT),
        metrics_enabled=bool(s.get("enable_metrics")),
        settings=dict(s),
    )
    config.log_lines = [
        f"Load weight end. mem usage={weights_per_gpu / GIB:.2f} GB.",
        f"KV Cache is allocated. #tokens: {max_total}, K size: {kv_pool / 2 / GIB:.2f} GB, "
        f"V size: {kv_pool / 2 / GIB:.2f} GB",
        f"max_total_num_tokens={max_total}, chunked_prefill_size={chunk}, "
        f"max_prefill_tokens={s.get('max_prefill_tokens', 16384)}, "
        f"max_running_requests={max_running}, context_len={context_len}",
    ]
    return config


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
