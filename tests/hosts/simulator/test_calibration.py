"""The simulator's speed against public measurements: each point within ±15 %.

The points, their sources and how each benchmark is reproduced live in
hosts/simulator/calibration.py; ``python scripts/calibration_table.py`` prints the table.
"""

import dataclasses

import pytest

from hosts.engines.catalog import GPUS
from hosts.simulator import calibration
from hosts.simulator.calibration import POINTS, TOLERANCE, measure, within
from hosts.simulator.config import build_config
from hosts.simulator.costmodel import CostModel


@pytest.mark.parametrize("point", POINTS, ids=[p.key for p in POINTS])
def test_point_within_tolerance(point):
    value = measure(point)
    assert within(point, value), (
        f"{point.key}: simulator {value:.4g} vs public {point.public:.4g} "
        f"(ratio {value / point.public:.3f}, allowed ±{TOLERANCE:.0%}) — {point.metric}; "
        f"{point.engine} {point.model} on {point.gpu} TP{point.tp}, {point.workload}; "
        f"source: {point.source} ({point.version})"
    )


def test_catalogue_spans_gpus_models_parallelism_and_phases():
    """The issue asks for 10+ points across GPUs, models, TP, batch sizes, prefill and decode."""
    assert len(POINTS) >= 10
    assert len({p.key for p in POINTS}) == len(POINTS)
    assert {p.gpu for p in POINTS} >= {"h100-sxm", "h200", "a100-40g", "l4"}
    assert {p.engine for p in POINTS} == {"vllm", "sglang"}
    assert {p.tp for p in POINTS} >= {1, 4}
    assert any(r.metric == "input_tok_s" for p in POINTS for r in p.runs)  # prefill
    assert any(r.metric in ("tpot_p50_ms", "itl_p50_ms") for p in POINTS for r in p.runs)
    for point in POINTS:
        assert point.source.startswith("https://") and point.version and point.workload


def test_h200_gains_less_than_its_bandwidth_over_the_h100(monkeypatch):
    """Why the H200 has its own bandwidth share: vLLM's nightly latency improves by 1.20×
    (997.5 → 833.4 ms) where the peak bandwidth grows 1.43×. Given the H100's share, the
    H200 comes out more than 15 % too fast on this point (the old model's failure)."""
    h100, h200 = (p for p in POINTS if p.key.startswith("vllm-latency-llama8b"))
    assert h100.public / h200.public < GPUS["h200"].hbm_bandwidth / GPUS["h100-sxm"].hbm_bandwidth
    same_share = dataclasses.replace(
        GPUS["h200"], bandwidth_efficiency=GPUS["h100-sxm"].bandwidth_efficiency
    )
    monkeypatch.setitem(GPUS, "h200", same_share)
    assert not within(h200, measure(h200))


def test_unknown_metric_is_a_clear_error():
    broken = dataclasses.replace(
        POINTS[0], runs=(calibration.Run(POINTS[0].runs[0].workload, "nonsense"),)
    )
    with pytest.raises(ValueError, match="unknown metric 'nonsense'"):
        measure(broken)


def test_a_step_streams_the_output_projection_but_not_the_input_embedding():
    """Decode reads the lm_head in full but only the embedding rows of its tokens; a model
    whose lm_head is the embedding (tied) streams that one matrix."""
    llama = build_config("vllm", "meta-llama/Llama-3.1-8B-Instruct", {}, GPUS["h100-sxm"])
    qwen = build_config("vllm", "Qwen/Qwen2.5-0.5B-Instruct", {}, GPUS["l4"])
    embedding = llama.model.vocab * llama.model.hidden * 2
    assert CostModel.for_config(llama).read_bytes == pytest.approx(
        llama.weights_bytes_per_gpu - embedding
    )
    assert CostModel.for_config(qwen).read_bytes == pytest.approx(qwen.weights_bytes_per_gpu)


def test_prefill_computes_logits_once_per_sequence_not_per_token():
    cost = CostModel.for_config(
        build_config("vllm", "meta-llama/Llama-3.1-8B-Instruct", {}, GPUS["h100-sxm"])
    )
    one_prompt = cost.step_time(4096, 4096, 4096 * 2048, 1, prefill_tokens=4096)
    # The same tokens as 4096 one-token sequences pay 4095 more logit rows (and their
    # per-sequence overhead): what the old model charged every prompt token.
    many = cost.step_time(4096, 4096, 4096 * 2048, 4096, prefill_tokens=4096)
    assert many - one_prompt > 4095 * cost.head_flops_per_seq / cost.flops
