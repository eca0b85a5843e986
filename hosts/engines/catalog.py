"""GPUs and models as plain data: what NVML reports of a GPU and what bounds an inference step,
and the shapes of models (weights, layers, KV heads) that KV-cache and speed math need. The
simulator, the launch rules and the advisor read it; add a row to extend it."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

MIB = 2**20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: what NVML would report and what bounds an inference step."""

    key: str
    nvml_name: str
    memory_bytes: int
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    fp8_flops: float  # dense FLOP/s (= bf16 where the GPU has no FP8 tensor cores)
    tdp_watts: float
    idle_watts: float
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    interconnect_bandwidth: float  # bytes/s per direction between GPUs (NVLink or PCIe)
    pcie_generation: int = 5
    # Share of peak HBM bandwidth that decode's weight reads achieve end to end (CUDA graphs,
    # many mid-sized GEMV/GEMM kernels, their tails). Lower on H200: its HBM3e peak grows
    # 43 % over the H100's but public decode latencies improve by far less (see
    # hosts/simulator/calibration.py).
    bandwidth_efficiency: float = 0.75
    # Share of dense tensor-core peak that large prefill GEMMs sustain. Ampere reaches more
    # of its (lower) peak than Hopper, whose 989 TFLOP/s is rarely held under the power cap.
    compute_efficiency: float = 0.55


GPUS: dict[str, GpuSpec] = {
    g.key: g
    for g in (
        GpuSpec(
            "h100-sxm",
            "NVIDIA H100 80GB HBM3",
            81559 * MIB,
            3.35e12,
            989e12,
            1979e12,
            700,
            72,
            1980,
            2619,
            450e9,
            bandwidth_efficiency=0.73,
            compute_efficiency=0.47,
        ),
        GpuSpec(
            "h200",
            "NVIDIA H200",
            143771 * MIB,
            4.8e12,
            989e12,
            1979e12,
            700,
            76,
            1980,
            3201,
            450e9,
            # HBM3e: 43 % more peak than the H100, ~22 % more achieved in decode.
            bandwidth_efficiency=0.62,
            compute_efficiency=0.47,  # the H100's die and power cap
        ),
        GpuSpec(
            "a100-80g",
            "NVIDIA A100-SXM4-80GB",
            81920 * MIB,
            2.039e12,
            312e12,
            312e12,
            400,
            55,
            1410,
            1593,
            300e9,
            pcie_generation=4,
            bandwidth_efficiency=0.77,
            compute_efficiency=0.75,
        ),
        GpuSpec(
            "a100-40g",
            "NVIDIA A100-SXM4-40GB",
            40960 * MIB,
            1.555e12,
            312e12,
            312e12,
            400,
            50,
            1410,
            1215,
            300e9,
            pcie_generation=4,
            bandwidth_efficiency=0.77,
            compute_efficiency=0.75,
        ),
        GpuSpec(
            "l40s",
            "NVIDIA L40S",
            46068 * MIB,
            0.864e12,
            362e12,
            733e12,
            350,
            35,
            2520,
            9001,
            32e9,
            pcie_generation=4,
        ),
        GpuSpec(
            "l4",
            "NVIDIA L4",
            23034 * MIB,
            0.300e12,
            121e12,
            242e12,
            72,
            16,
            2040,
            6251,
            32e9,
            pcie_generation=4,
        ),
    )
}


@dataclass(frozen=True)
class ModelSpec:
    """A model's shape: what sets its weight bytes, KV bytes per token and FLOPs per token."""

    key: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    params: float
    vocab: int
    max_position: int
    quantization: str | None = None  # weights: None (bf16), "fp8", "awq"
    # The output projection shares the input embedding's matrix (small Qwen models do).
    tied_embeddings: bool = False

    @property
    def embedding_params(self) -> float:
        """Parameters of the input embedding table (vocab × hidden)."""
        return float(self.vocab * self.hidden)

    @property
    def weight_bytes_per_param(self) -> float:
        # AWQ: 4-bit weights plus group scales/zeros; FP8: 1 byte plus a few bf16 layers.
        return {None: 2.0, "fp8": 1.03, "awq": 0.56}.get(self.quantization, 2.0)

    @property
    def weight_bytes(self) -> float:
        return self.params * self.weight_bytes_per_param

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2) -> float:
        """2 (K and V) × layers × KV heads × head dim × bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


_BASE_MODELS = (
    # key, layers, hidden, intermediate, heads, kv_heads, head_dim, params, vocab, context
    ModelSpec("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 8.03e9, 128256, 131072),
    ModelSpec("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 70.6e9, 128256, 131072),
    ModelSpec("qwen2.5-7b", 28, 3584, 18944, 28, 4, 128, 7.62e9, 152064, 32768),
    ModelSpec("mistral-7b", 32, 4096, 14336, 32, 8, 128, 7.24e9, 32768, 32768),
    # Qwen/Qwen2.5-0.5B(-Instruct) config.json: tie_word_embeddings true.
    ModelSpec(
        "qwen2.5-0.5b", 24, 896, 4864, 14, 2, 64, 0.494e9, 151936, 32768, tied_embeddings=True
    ),
)
MODELS: dict[str, ModelSpec] = {}
for _model in _BASE_MODELS:
    MODELS[_model.key] = _model
    for _quant in ("fp8", "awq"):
        MODELS[f"{_model.key}-{_quant}"] = replace(
            _model, key=f"{_model.key}-{_quant}", quantization=_quant
        )

# Hugging Face ids and other spellings → catalog family.
_FAMILIES = (
    (re.compile(r"llama-?3(\.[13])?-?8b", re.I), "llama-3.1-8b"),
    (re.compile(r"llama-?3(\.[13])?-?70b", re.I), "llama-3.1-70b"),
    (re.compile(r"qwen-?2\.5-?7b", re.I), "qwen2.5-7b"),
    (re.compile(r"qwen-?2\.5-?0\.5b", re.I), "qwen2.5-0.5b"),
    (re.compile(r"mistral-?7b", re.I), "mistral-7b"),
)


# The Hugging Face repository a catalogue entry is usually served from: what a real engine
# needs as its model argument (the catalogue keys only mean something to the simulator).
# Each resolves back to its entry through resolve_model (tested).
HF_REPOS: dict[str, str] = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-8b-fp8": "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8",
    "llama-3.1-8b-awq": "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.1-70b-fp8": "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",
    "llama-3.1-70b-awq": "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-7b-awq": "Qwen/Qwen2.5-7B-Instruct-AWQ",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
}


class UnknownModel(ValueError):
    """The simulator has no shape for this model name."""


def resolve_model(name: str) -> ModelSpec:
    """``meta-llama/Llama-3.1-8B-Instruct-FP8`` → the FP8 variant of llama-3.1-8b."""
    if name in MODELS:
        return MODELS[name]
    base = name.rsplit("/", 1)[-1]
    for pattern, family in _FAMILIES:
        if pattern.search(base):
            lowered = base.lower()
            quant = "awq" if "awq" in lowered else "fp8" if "fp8" in lowered else None
            return MODELS[f"{family}-{quant}" if quant else family]
    known = ", ".join(sorted(k for k in MODELS if "-fp8" not in k and "-awq" not in k))
    raise UnknownModel(f"Model {name!r} is not in the simulator's catalog (known: {known}).")


def resolve_gpu(key: str) -> GpuSpec:
    try:
        return GPUS[key]
    except KeyError:
        raise ValueError(f"unknown GPU {key!r} (choose from {', '.join(GPUS)})") from None


def gpu_key(gpu_name: str) -> str | None:
    """The simulator's GPU key for an NVML name (``NVIDIA H100 80GB HBM3`` → ``h100-sxm``)."""
    for key, spec in GPUS.items():
        if spec.nvml_name == gpu_name:
            return key
    lowered = gpu_name.lower()
    for key in sorted(GPUS, key=len, reverse=True):
        family, _, size = key.partition("-")
        if family in lowered and (not size or size.rstrip("g") in lowered or size == "sxm"):
            return key
    return None
