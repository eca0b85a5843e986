"""How long one engine step takes: a roofline model calibrated to public measurements.

A step reads every weight it multiplies once and the KV cache of every token it attends to
(memory bound: decode), and does 2 FLOPs per weight per token plus attention (compute bound:
prefill). The slower of the two sets the pace. On top come a fixed cost per step (scheduling,
input preparation, CUDA-graph launch), a small cost per sequence (sampling, output
bookkeeping) and, under tensor parallelism, two all-reduces per layer.

What the GPU achieves of its peaks is a property of the GPU (``GpuSpec.bandwidth_efficiency``
and ``compute_efficiency`` in hosts/engines/catalog.py), not of the workload. The constants
here and those fields are fitted to the public points in hosts/simulator/calibration.py, which
tests/hosts/simulator/test_calibration.py holds within ±15 %.
"""

from __future__ import annotations

from dataclasses import dataclass

from hosts.simulator.config import SimConfig

# GEMMs over few tokens use the tensor cores poorly: efficiency × tokens / (tokens + this).
# It is why small prefill chunks (a small max_num_batched_tokens) cost TTFT.
HALF_EFFICIENCY_TOKENS = 128
# Seconds per step whatever the batch: the scheduler's pass, building the input tensors and
# launching the CUDA graph. vLLM V1 overlaps detokenisation with the GPU in its front-end
# process, so what is left per step is small.
STEP_OVERHEAD = 0.35e-3
# Seconds per sequence in the batch: sampling over the vocabulary and the engine core's
# bookkeeping of each output. Public points bracket it: TPOT at 4 streams is 0.11 ms above
# 1 stream on an H100 (~40 µs a sequence, vLLM 0.21 serving); ITL on an L4 rises ~65 µs a
# sequence from 1 to 32 streams; vLLM's offline latency test (detokenising in the loop) implies
# ~150 µs. 80 µs keeps every point within 10 %; it was 120 µs, which held batching gains
# ~20 % under what vLLM measures.
PER_SEQUENCE = 0.08e-3
# Seconds per all-reduce under tensor parallelism beyond the bytes moved: NCCL's / vLLM's
# custom all-reduce launch and cross-GPU synchronisation for decode-sized messages (tens of KB)
# costs ~10-30 µs on NVLink; two per layer make it milliseconds per step for an 80-layer model.
ALLREDUCE_LATENCY = 22e-6
# Bytes per element of the embedding table and output projection: quantized checkpoints
# (FP8, AWQ) keep both in bf16.
EMBEDDING_BYTES = 2.0


@dataclass(frozen=True)
class CostModel:
    """Step time for one configuration; pure arithmetic, no state."""

    read_bytes: float  # weight bytes a step reads, per GPU
    kv_bytes_per_token: float  # per GPU
    body_flops_per_token: float  # per GPU, per token, all layers but the output projection
    head_flops_per_seq: float  # per GPU, the output projection for one sampled position
    attn_flops_per_pair: float  # per GPU, per (new token × attended token)
    bandwidth: float  # achieved bytes/s
    flops: float  # achieved FLOP/s in large GEMMs
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
        embedding = model.embedding_params
        # The input embedding is a row lookup: a step reads only the rows of its tokens, so
        # its table is not streamed (unless the output projection shares it).
        unread = 0.0 if model.tied_embeddings else embedding * EMBEDDING_BYTES / tp
        read_bytes = max(cfg.weights_bytes_per_gpu - unread, cfg.weights_bytes_per_gpu / 2)
        # Matmul parameters of the layers: all but the embedding and the output projection.
        body_params = model.params - embedding * (1 if model.tied_embeddings else 2)
        return cls(
            read_bytes=read_bytes,
            kv_bytes_per_token=cfg.kv_bytes_per_token,
            body_flops_per_token=2 * body_params / tp,
            head_flops_per_seq=2 * embedding / tp,
            attn_flops_per_pair=4 * model.layers * model.heads * model.head_dim / tp,
            bandwidth=gpu.hbm_bandwidth * gpu.bandwidth_efficiency,
            flops=peak * gpu.compute_efficiency,
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
        memory = (self.read_bytes + kv_tokens_read * self.kv_bytes_per_token) / self.bandwidth
        decode_tokens = new_tokens - prefill_tokens
        compute = decode_tokens * self.body_flops_per_token / self.flops
        if prefill_tokens:
            efficiency = prefill_tokens / (prefill_tokens + HALF_EFFICIENCY_TOKENS)
            compute += (prefill_tokens * self.body_flops_per_token) / (self.flops * efficiency)
        # Logits are computed for one position per sequence (the last of a prefill chunk).
        compute += num_seqs * self.head_flops_per_seq / self.flops
        compute += attn_pairs * self.attn_flops_per_pair / self.flops
        seconds = STEP_OVERHEAD + num_seqs * PER_SEQUENCE + max(memory, compute)
        if self.tp > 1:
            # Two all-reduces per layer of the activations of every new token (ring: 2(n-1)/n).
            volume = new_tokens * self.hidden * 2 * 2 * (self.tp - 1) / self.tp
            seconds += 2 * self.layers * (ALLREDUCE_LATENCY + volume / self.interconnect)
        return seconds
