"""Engine /metrics → snapshots, for vLLM (current and older names) and SGLang, from real
expositions; and histogram quantiles as Prometheus computes them.

Fixtures (tests/scaling/fixtures/, see expo_SOURCES.md): the simulator's vLLM 0.11 and
SGLang 0.5.3 expositions after five requests, and a real vLLM capture (Qwen3-0.6B, v0
engine) that still names KV use ``gpu_cache_usage_perc`` and ITL ``time_per_output_token``.
"""

from __future__ import annotations

import bisect
import math
import random
from pathlib import Path

import pytest

from scaling.planning.expo import parse_snapshot, quantile

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def cumulative_ok(hist: dict) -> bool:
    counts = hist["counts"]
    return (
        hist["le"] == sorted(hist["le"])
        and all(math.isfinite(b) for b in hist["le"])
        and all(a <= b for a, b in zip(counts, counts[1:], strict=False))
        and (not counts or counts[-1] <= hist["count"])
    )


# --- parse_snapshot ----------------------------------------------------------------------------
def test_vllm_current_names():
    snap = parse_snapshot(fixture("expo_vllm_sim_0_11.txt"))
    assert snap["engine"] == "vllm"
    assert snap["missing"] == []
    assert snap["gauges"] == {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0}
    assert snap["counters"] == {
        "prompt_tokens": 660.0,
        "generation_tokens": 50.0,
        "preemptions": 0.0,
        "requests_finished": 5.0,  # summed over finished_reason
    }
    hists = snap["histograms"]
    assert set(hists) == {"ttft", "itl", "prompt_len", "queue"}
    assert all(cumulative_ok(h) for h in hists.values())
    assert hists["ttft"]["count"] == 5 and hists["ttft"]["le"][0] == 0.001
    assert hists["ttft"]["le"][-1] == 2560.0  # +Inf is the count, not a bound
    # 0.11 exports ITL under its new and its deprecated name with the same observations:
    # counted once (five requests, nine gaps each), never twice.
    assert hists["itl"]["count"] == 45
    assert hists["prompt_len"]["count"] == 5 and hists["prompt_len"]["sum"] == 660.0


def test_vllm_older_names_of_a_real_capture():
    snap = parse_snapshot(fixture("expo_vllm_real_v0_qwen3.txt"))
    assert snap["engine"] == "vllm" and snap["missing"] == []
    assert snap["gauges"]["kv_cache_usage"] == 0.0  # vllm:gpu_cache_usage_perc
    itl = snap["histograms"]["itl"]  # vllm:time_per_output_token_seconds
    assert itl["count"] == 4805 and itl["counts"][:5] == [0, 0, 106, 367, 372]
    assert itl["sum"] == pytest.approx(662.8116002082825)
    assert snap["histograms"]["ttft"]["count"] == 69
    assert snap["counters"]["requests_finished"] == 38
    assert snap["histograms"]["prompt_len"]["sum"] == 12952.0


def test_sglang_names():
    snap = parse_snapshot(fixture("expo_sglang_sim_0_5_3.txt"))
    assert snap["engine"] == "sglang"
    assert set(snap["gauges"]) == {"running", "waiting", "kv_cache_usage"}
    assert snap["gauges"]["kv_cache_usage"] == pytest.approx(0.00022868343678539294)
    assert snap["counters"]["requests_finished"] == 5.0  # sglang:num_requests_total
    assert snap["counters"]["prompt_tokens"] == 660.0
    assert snap["histograms"]["ttft"]["count"] == 5
    assert snap["histograms"]["itl"]["count"] == 45
    # SGLang 0.5.3 has no preemption counter; its prompt-length histogram is opt-in.
    assert snap["missing"] == ["preemptions", "prompt_len"]


def test_label_sets_are_summed_and_a_ratio_averaged():
    one = fixture("expo_vllm_sim_0_11.txt")
    # A second engine behind the same API server (data parallel): each engine="0" sample
    # gets an engine="1" twin beside it, the second engine's KV half full.
    lines = []
    for line in one.splitlines():
        lines.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            twin = line.replace('engine="0"', 'engine="1"')
            if twin.startswith("vllm:kv_cache_usage_perc{"):
                twin = twin.rsplit(" ", 1)[0] + " 0.5"
            lines.append(twin)
    doubled, single = parse_snapshot("\n".join(lines) + "\n"), parse_snapshot(one)
    assert doubled["counters"]["prompt_tokens"] == 2 * single["counters"]["prompt_tokens"]
    assert doubled["counters"]["requests_finished"] == 10
    assert doubled["histograms"]["ttft"]["count"] == 2 * single["histograms"]["ttft"]["count"]
    assert doubled["histograms"]["ttft"]["counts"] == [
        2 * c for c in single["histograms"]["ttft"]["counts"]
    ]
    assert doubled["histograms"]["itl"]["count"] == 90  # still the newest name only
    assert doubled["gauges"]["kv_cache_usage"] == pytest.approx(0.25)  # mean of 0 and 0.5


def test_sglang_tensor_parallel_ranks_count_once():
    rank0 = 'engine_type="unified",model_name="Q",pp_rank="0",tp_rank="0"'
    rank1 = rank0.replace('tp_rank="0"', 'tp_rank="1"')
    lines = ["# TYPE sglang:queue_time_seconds histogram"]
    for labels in (rank0, rank1):
        lines += [
            f'sglang:queue_time_seconds_bucket{{{labels},le="1.0"}} 2',
            f'sglang:queue_time_seconds_bucket{{{labels},le="+Inf"}} 3',
            f"sglang:queue_time_seconds_count{{{labels}}} 3",
            f"sglang:queue_time_seconds_sum{{{labels}}} 1.5",
        ]
    lines += ["# TYPE sglang:num_queue_reqs gauge", f"sglang:num_queue_reqs{{{rank0}}} 4"]
    lines += [f"sglang:num_queue_reqs{{{rank1}}} 4"]
    snap = parse_snapshot("\n".join(lines) + "\n")
    assert snap["histograms"]["queue"] == {"le": [1.0], "counts": [2.0], "count": 3.0, "sum": 1.5}
    assert snap["gauges"]["waiting"] == 4


def test_newest_name_wins_whatever_the_order():
    text = """# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc 0.9
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc 0.4
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.1"} 7
vllm:time_per_output_token_seconds_bucket{le="+Inf"} 9
vllm:time_per_output_token_seconds_count 9
vllm:time_per_output_token_seconds_sum 1
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{le="0.1"} 3
vllm:inter_token_latency_seconds_bucket{le="+Inf"} 4
vllm:inter_token_latency_seconds_count 4
vllm:inter_token_latency_seconds_sum 0.2
"""
    snap = parse_snapshot(text)
    assert snap["gauges"]["kv_cache_usage"] == 0.4
    assert snap["histograms"]["itl"] == {"le": [0.1], "counts": [3.0], "count": 4.0, "sum": 0.2}


def test_untyped_exposition():
    text = """vllm:num_requests_waiting 3
vllm:request_success_total{finished_reason="stop"} 5
vllm:request_success_total{finished_reason="length"} 2
vllm:time_to_first_token_seconds_bucket{le="0.5"} 4
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 6
vllm:time_to_first_token_seconds_count 6
vllm:time_to_first_token_seconds_sum 2.5
"""
    snap = parse_snapshot(text)
    assert snap["gauges"]["waiting"] == 3
    assert snap["counters"]["requests_finished"] == 7
    assert snap["histograms"]["ttft"] == {"le": [0.5], "counts": [4.0], "count": 6.0, "sum": 2.5}


def test_no_engine_metrics():
    snap = parse_snapshot("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n")
    assert snap["engine"] is None and snap["gauges"] == {} and "waiting" in snap["missing"]


def test_not_an_exposition_is_a_value_error():
    with pytest.raises(ValueError):
        parse_snapshot("vllm:num_requests_waiting{ nonsense\n")


# --- quantile ------------------------------------------------------------------------------------
LE = [0.1, 0.5, 1.0]
COUNTS = [10.0, 30.0, 40.0]  # 10 in (0, 0.1], 20 in (0.1, 0.5], 10 in (0.5, 1], 10 above 1


def test_quantile_by_hand():
    # rank 25 lies 15 of the 20 observations into (0.1, 0.5]: 0.1 + 0.4 × 15/20
    assert quantile(0.5, LE, COUNTS, 50) == pytest.approx(0.4)
    # rank 2.5 in the first bucket, which starts at 0: 0.1 × 2.5/10
    assert quantile(0.05, LE, COUNTS, 50) == pytest.approx(0.025)
    # rank 35 in (0.5, 1]: 0.5 + 0.5 × 5/10
    assert quantile(0.7, LE, COUNTS, 50) == pytest.approx(0.75)
    # rank 47.5 in the +Inf bucket: the highest finite bound
    assert quantile(0.95, LE, COUNTS, 50) == 1.0


def test_quantile_without_observations_is_none():
    assert quantile(0.95, LE, [0, 0, 0], 0) is None
    assert quantile(0.5, [], [], 3) is None


def test_quantile_outside_0_1_is_refused():
    with pytest.raises(ValueError):
        quantile(1.5, LE, COUNTS, 50)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.95, 0.99])
def test_quantile_falls_in_the_bucket_of_the_true_percentile(seed, q):
    bounds = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
    rng = random.Random(seed)
    observations = sorted(rng.lognormvariate(-2.0, 1.2) for _ in range(5000))
    counts = [float(bisect.bisect_right(observations, b)) for b in bounds]
    estimate = quantile(q, bounds, counts, len(observations))
    # The true percentile, by the same rank rule: the smallest observation with at least
    # q × n observations at or below it.
    true = observations[max(math.ceil(q * len(observations)) - 1, 0)]
    index = bisect.bisect_left(bounds, true)
    if index == len(bounds):  # above the highest bound: Prometheus says the highest bound
        assert estimate == bounds[-1]
        return
    lower = bounds[index - 1] if index else 0.0
    assert lower <= estimate <= bounds[index]
