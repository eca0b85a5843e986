"""The rules on the config's sizing (changes/advisor/rules_config.py), each both ways."""

from __future__ import annotations

from dataclasses import replace

import pytest

from changes.advisor.engine import evaluate
from changes.advisor.findings import CRITICAL, INFO, WARNING
from tests.changes.advisor import builders as b
from tests.changes.advisor.builders import none, one

VLLM_REFUSAL = (
    "This model's maximum context length is 8192 tokens. However, your request has 9000 "
    "input tokens. Please reduce the length of the input messages."
)
VLLM_MAX_TOKENS = (
    "'max_tokens' or 'max_completion_tokens' is too large: 2000. This model's maximum context "
    "length is 8192 tokens and your request has 7000 input tokens (2000 > 8192 - 7000)."
)
SGLANG_REFUSAL = "The input (9000 tokens) is longer than the model's context length (8192 tokens)."


# --- length-rejections -------------------------------------------------------------------------
def refused(n=330, ok=870, message=VLLM_REFUSAL, engine="vllm"):
    return b.with_run(
        b.healthy(engine),
        completed=ok,
        failed=n,
        error_rate=n / (n + ok),
        errors_by_class={"HTTP_4XX": n},
        errors_by_message={message: n},
    )


def test_length_rejections_critical_with_the_needed_length():
    f = one(refused(), "length-rejections")
    assert f.severity == CRITICAL  # 27.5 %
    assert dict(f.suggestion.settings) == {"max_model_len": 16384}  # 9,001 → 16,384
    assert "330 of 1,200 requests (27.5 %) in run 12" in f.seen
    assert "limit 8,192 tokens" in f.seen and "9,001 tokens" in f.seen
    assert f.evidence["longest_needed"] == 9001 and f.source == "run 12"


def test_length_rejections_keeps_an_unchunked_budget_above_the_context():
    s = b.with_config(refused(), chunked_prefill=False, max_num_batched_tokens=8192)
    assert dict(one(s, "length-rejections").suggestion.settings) == {
        "max_model_len": 16384,
        "max_num_batched_tokens": 16384,
    }


def test_length_rejections_reads_max_tokens_refusals():
    f = one(refused(message=VLLM_MAX_TOKENS), "length-rejections")
    assert f.evidence["longest_needed"] == 9000
    assert dict(f.suggestion.settings) == {"max_model_len": 16384}


def test_length_rejections_sglang():
    f = one(refused(message=SGLANG_REFUSAL, engine="sglang"), "length-rejections")
    assert dict(f.suggestion.settings) == {"context_length": 16384}


def test_length_rejections_warning_and_unreadable_message():
    f = one(refused(n=20, ok=980, message="maximum context length exceeded"), "length-rejections")
    assert f.severity == WARNING  # 2 %
    # no length in the message and the run's p99 (3,400) fits: nothing to raise it to
    assert not f.suggestion.settings and "client" in f.suggestion.action


@pytest.mark.parametrize(
    "s",
    [
        refused(n=10, ok=1100),  # 0.9 %
        refused(message="Request timed out"),  # not a length refusal
        b.with_run(refused(), config_current=False),  # another config's run
    ],
)
def test_length_rejections_near_misses(s):
    assert none(s, "length-rejections")


# --- max-model-len-oversized -------------------------------------------------------------------
def test_max_model_len_oversized():
    f = one(b.with_config(b.healthy(), max_model_len=131072), "max-model-len-oversized")
    assert f.severity == INFO
    assert dict(f.suggestion.settings) == {"max_model_len": 8192}  # 3,400 × 1.25 → 8,192
    assert "131,072 tokens, 39× the p99 prompt + output of 3,400 tokens" in f.seen
    assert "traffic sample" in f.seen and f.source == "traffic sample"


def test_max_model_len_from_the_run_and_summed_p99s():
    s = replace(b.with_config(b.healthy(), max_model_len=131072), traffic=None)
    s = b.with_lengths(s, total_p99=None)
    f = one(s, "max-model-len-oversized")
    assert f.source == "run 12" and f.evidence["total_p99"] == 3600  # 3,000 + 600
    sg = b.with_config(b.healthy("sglang"), max_model_len=131072)
    assert dict(one(sg, "max-model-len-oversized").suggestion.settings) == {"context_length": 8192}


def test_max_model_len_near_misses_and_missing():
    assert none(b.with_config(b.healthy(), max_model_len=13600), "max-model-len-oversized")
    s = b.with_config(refused(), max_model_len=131072)  # some requests need more
    assert none(s, "max-model-len-oversized")
    s = b.with_lengths(b.with_config(b.healthy(), max_model_len=131072), total_p99=None)
    assert none(b.with_lengths(s, input_p99=None), "max-model-len-oversized")
    assert none(b.with_config(b.healthy(), max_model_len=None), "max-model-len-oversized")


# --- no-memory-headroom ------------------------------------------------------------------------
def test_no_memory_headroom():
    s = b.with_gpus(b.with_config(b.healthy(), memory_fraction=0.97), memory_used_bytes=78 * b.GIB)
    f = one(s, "no-memory-headroom")
    assert f.severity == WARNING
    assert dict(f.suggestion.settings) == {"gpu_memory_utilization": 0.9}
    assert "0.97 (above 0.95)" in f.seen and "97.5 %" in f.seen
    assert "over the last 5 min of telemetry" in f.seen
    sg = b.with_config(b.healthy("sglang"), memory_fraction=0.97)
    assert dict(one(sg, "no-memory-headroom").suggestion.settings) == {"mem_fraction_static": 0.9}


def test_no_memory_headroom_with_out_of_memory_errors_is_critical():
    s = b.with_config(b.healthy(), memory_fraction=0.98)
    s = b.with_run(s, failed=4, errors_by_message={"CUDA out of memory. Tried to allocate": 4})
    f = one(s, "no-memory-headroom")
    assert f.severity == CRITICAL and f.evidence["oom_errors"] == 4


def test_no_memory_headroom_near_miss_and_missing():
    assert none(b.with_config(b.healthy(), memory_fraction=0.95), "no-memory-headroom")
    assert none(b.with_config(b.healthy(), memory_fraction=None), "no-memory-headroom")


# --- tp-unneeded -------------------------------------------------------------------------------
def split(weights_gib=16, engine="vllm"):
    s = b.with_config(b.healthy(engine), tensor_parallel=2, weights_bytes=weights_gib * b.GIB)
    return replace(s, gpus=(b.gpu(0), b.gpu(1)))


def test_tp_unneeded():
    f = one(split(), "tp-unneeded")
    assert f.severity == INFO
    assert dict(f.suggestion.settings) == {"tensor_parallel_size": 1}
    assert "16 GiB, 20 % of one GPU's 80 GiB" in f.seen and "is 2" in f.seen
    assert dict(one(split(engine="sglang"), "tp-unneeded").suggestion.settings) == {"tp_size": 1}


def test_tp_unneeded_near_miss_and_missing():
    assert none(split(48), "tp-unneeded")  # 60 % of 80 GiB
    assert none(b.with_config(split(), weights_bytes=None), "tp-unneeded")
    assert none(b.with_gpus(split(), memory_total_bytes=None), "tp-unneeded")
    assert none(b.with_config(split(), tensor_parallel=1), "tp-unneeded")


def test_sizing_rules_quiet_on_the_healthy_deployment():
    rules = ["length-rejections", "max-model-len-oversized", "no-memory-headroom", "tp-unneeded"]
    assert evaluate(b.healthy(), only=rules) == []
