"""How long one engine step takes: a roofline model calibrated to public measurements.

A step reads every weight once and the KV cache of every token it attends to (memory bound,
decode), and does 2 × params FLOPs per new token plus attention (compute bound, prefill). The
slower of the two sets the pace; a fixed launch/scheduling overhead, a per-sequence cost
(sampling, detokenising, attention kernel set-up) and the tensor-parallel all-reduces come on
top. Calibration (Llama-3.1-8B bf16): H100 1 stream ≈ 6.5 ms/token, 16 streams ≈ 11 ms/token;
A100-40GB 1 stream ≈ 75 tokens/s — see tests/simulator/test_calibration.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from hosts.simulator.config import SimConfig

BANDWIDTH_EFFICIENCY = 0.75  # achieved share of peak HBM bandwidth
COMPUTE_EFFICIENCY = 0.55  # achieved share of dense peak FLOP/s in large prefills
# GEMMs over few tokens use the tensor cores poorly: efficiency × tokens / (tokens + this).
# It is why small prefill chunks (a small max_num_batched_tokens) cost TTFT.
HALF_EFFICIENCY_TOKENS = 256
STEP_OVERHEAD = 0.25e-3  # seconds: kernel launches, scheduler, CUDA-graph replay
PER_SEQUENCE = 0.12e-3  # seconds per sequence in the batch
ALLREDUCE_LATENCY = 8e-6  # seconds per all-reduce


@dataclass(frozen=True)
class CostModel:
    """Step time for one configuration; pure arithmetic, no state."""

    weight_bytes: float  # per GPU
    kv_bytes_per_token: float  # per GPU
    flops_per_token: float  # per GPU
    attn_flops_per_pair: float  # per GPU, per (new token × attended token)
    bandwidth: float  # effective bytes/s
    flops: float  # effective FLOP/s
    tp: int
    layers: int
    hidden: int
    interconnect: float

    @classmethod
    def for_config(cls, cfg: SimConfig) -> CostModel:
        model, gpu, tp = cfg.model, cfg.gpu, cfg.tp
        peak = gpu.fp8_flops if model.quantization == "fp8" else gpu.bf16_flops
        if cfg.weight_dtype_bytes == 4.0:
            peak = gpu.bf16_flops / 4  # fp32 runs without tensor-core bf16 rates
        return cls(
            weight_bytes=cfg.weights_bytes_per_gpu,
            kv_bytes_per_token=cfg.kv_bytes_per_token,
            flops_per_token=2 * model.params / tp,
            attn_flops_per_pair=4 * model.layers * model.heads * model.head_dim / tp,
            bandwidth=gpu.hbm_bandwidth * BANDWIDTH_EFFICIENCY,
            flops=peak * COMPUTE_EFFICIENCY,
            tp=tp,
            layers=model.layers,
            hidden=model.hidden,
            interconnect=gpu.interconnect_bandwidth,
        )

    def step_time(
        self,
        new_tokens: int,
        kv_tokens_read: int,
        attn_pairs: float,
        num_seqs: int,
        prefill_tokens: int = 0,
    ) -> float:
        """Seconds for a step computing ``new_tokens`` (``prefill_tokens`` of them prompt
        tokens) over ``num_seqs`` sequences that read ``kv_tokens_read`` cached tokens in
        total; ``attn_pairs`` = Σ new × attended."""
        if new_tokens <= 0:
            return 0.0
        memory = (self.weight_bytes + kv_tokens_read * self.kv_bytes_per_token) / self.bandwidth
        decode_tokens = new_tokens - prefill_tokens
        compute = decode_tokens * self.flops_per_token / self.flops
        if prefill_tokens:
            efficiency = prefill_tokens / (prefill_tokens + HALF_EFFICIENCY_TOKENS)
            compute += (prefill_tokens * self.flops_per_token) / (self.flops * efficiency)
        compute += attn_pairs * self.attn_flops_per_pair / self.flops
        seconds = STEP_OVERHEAD + num_seqs * PER_SEQUENCE + max(memory, compute)
        if self.tp > 1:
            # Two all-reduces per layer of the activations of every new token (ring: 2(n-1)/n).
            volume = new_tokens * self.hidden * 2 * 2 * (self.tp - 1) / self.tp
            seconds += 2 * self.layers * (ALLREDUCE_LATENCY + volume / self.interconnect)
        return seconds
