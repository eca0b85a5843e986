"""Loads for sweeps: the main stage of a profile, a workload at one load, a profile at one
load (still a valid profile), and the moved helpers' old import paths."""

import pytest

from benchmarks.loadgen.profile import build_spec, normalize
from benchmarks.loadgen.spec import SpecError
from benchmarks.sweep import SWEEP_REQUESTS, apply_load, sweep_workload, with_load

PROFILE = {
    "input_len": {"kind": "uniform", "low": 100, "high": 300},
    "output_len": {"kind": "fixed", "mean": 64},
    "prefix_len": 32,
    "stages": [
        {"name": "warm", "concurrency": 2, "num_requests": 30},
        {"name": "peak", "request_rate": 4.0, "burstiness": 0.5, "num_requests": 90},
        {"name": "tail", "concurrency": 8, "max_concurrency": 8, "num_requests": 40},
    ],
}


def test_sweep_workload_takes_the_main_stage():
    w = sweep_workload(PROFILE, "rate")
    assert (w.num_requests, w.request_rate, w.concurrency) == (90, 4.0, None)
    # The 32-token prefix comes on top of the 200-token mean input (vLLM's --random-prefix-len).
    assert (w.input_tokens, w.output_tokens, w.shared_prefix_tokens) == (232, 64, 32)
    assert w.burstiness == 0.5 and w.warmup_requests == 0
    c = sweep_workload(PROFILE, "concurrency")
    assert c.request_rate is None and c.concurrency >= 1
    big = {"stages": [{"name": "s", "concurrency": 4, "num_requests": 10_000}]}
    assert sweep_workload(big, "rate").num_requests == SWEEP_REQUESTS
    with pytest.raises(ValueError, match="unknown load mode"):
        sweep_workload(PROFILE, "qps")


def test_with_load():
    w = sweep_workload(PROFILE, "rate")
    assert with_load(w, "concurrency", 12.7).concurrency == 12
    assert with_load(w, "concurrency", 12.7).request_rate is None
    assert with_load(w, "rate", 3).request_rate == 3.0


def test_apply_load_is_still_a_valid_profile():
    rate = apply_load(PROFILE, "rate", 7.5)
    assert all(s["request_rate"] == 7.5 for s in rate["stages"])
    assert not any("concurrency" in s or "max_concurrency" in s for s in rate["stages"])
    assert rate["stages"][1]["burstiness"] == 0.5 and PROFILE["stages"][0]["concurrency"] == 2
    conc = apply_load(rate, "concurrency", 16.0)
    assert all(s["concurrency"] == 16 for s in conc["stages"])
    assert not any("request_rate" in s or "burstiness" in s for s in conc["stages"])
    for doc in (rate, conc, apply_load({}, "rate", 2)):
        normalize(doc)
        spec = build_spec(doc, "http://engine.invalid", "model")
        assert spec.stages
    with pytest.raises(SpecError, match="replay"):
        apply_load({"replay": {"rows": [[0, 10, 10]]}}, "rate", 1)


def test_moved_helpers_keep_their_old_homes():
    from benchmarks.sweep.load import workloads
    from changes.advice import gpu_key as old_gpu_key
    from changes.advice import workloads as old_workloads
    from hosts.engines.catalog import gpu_key

    assert old_gpu_key is gpu_key and old_workloads is workloads
    assert gpu_key("NVIDIA H100 80GB HBM3") == "h100-sxm"
