"""The predict phase on the simulator: one point, a space in one process and in a pool."""

import json

import pytest

from benchmarks.sweep import (
    PointScore,
    PredictError,
    Prediction,
    Slo,
    candidates,
    pareto_front,
    parse_space,
    predict_space,
    score_point,
    sweep_workload,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# A short load keeps each probe to a few milliseconds.
PROFILE = {
    "input_len": {"kind": "fixed", "mean": 256},
    "output_len": {"kind": "fixed", "mean": 32},
    "stages": [{"name": "main", "concurrency": 4, "num_requests": 60}],
}
RATE = sweep_workload(PROFILE, "rate")
LOOSE = Slo(ttft_p95_ms=2000)


def score(settings, slo=LOOSE, **kwargs):
    kwargs.setdefault("num_gpus", 1)
    return score_point(
        "vllm", MODEL, settings, "h100-sxm", workload=RATE, mode="rate", slo=slo, **kwargs
    )


def test_a_bigger_batch_holds_a_higher_rate():
    slo = Slo(ttft_p95_ms=500)
    small, big = score({"max_num_seqs": 2}, slo), score({"max_num_seqs": 32}, slo)
    assert small.meets_slo and big.meets_slo and not big.limit_above
    assert big.max_load > 1.5 * small.max_load
    assert big.numbers["output_tps_per_gpu"] > small.numbers["output_tps_per_gpu"]
    assert big.numbers["ttft_p95_ms"] <= 500 and big.gpus_used == 1
    assert big.curve == sorted(big.curve, key=lambda c: c["load"])
    missed = [c["load"] for c in big.curve if not c["ok"]]
    assert missed and min(missed) <= big.max_load * 1.03  # bracketed within rel_tol
    assert big.objective == big.numbers["output_tps_per_gpu"]


def test_a_burst_the_engine_absorbs_whole_has_no_limit():
    # 60 requests fit a batch of 64 at once: no rate makes them queue past 2 s.
    s = score({"max_num_seqs": 64})
    assert s.meets_slo and s.limit_above and all(c["ok"] for c in s.curve)


def test_infeasible_points_keep_the_engines_words():
    low = score({"gpu_memory_utilization": 0.3})
    assert not low.feasible and not low.meets_slo and low.max_load is None
    assert low.error.startswith("ValueError: ") and "gpu_memory_utilization" in low.error
    tp = score({"tensor_parallel_size": 2})
    assert not tp.feasible and "placement group" in tp.error
    assert score({"tensor_parallel_size": 2}, num_gpus=2).feasible


def test_time_scale_reports_wall_time():
    slo = Slo(ttft_p95_ms=500)
    real = score({"max_num_seqs": 2}, slo)
    fast = score({"max_num_seqs": 2}, slo, time_scale=0.5)  # a simulator twice as fast
    assert 1.8 < fast.max_load / real.max_load < 2.6
    assert fast.numbers["ttft_p95_ms"] <= 500
    # The same virtual search: what it measures, in wall time.
    virtual = score({"max_num_seqs": 2}, slo.scaled(0.5))
    assert fast.max_load == pytest.approx(2 * virtual.max_load)
    assert fast.numbers["ttft_p95_ms"] == pytest.approx(virtual.numbers["ttft_p95_ms"] / 2)
    assert fast.numbers["output_tps"] == pytest.approx(2 * virtual.numbers["output_tps"])
    assert fast.numbers["output_tps_per_user"] == pytest.approx(
        2 * virtual.numbers["output_tps_per_user"]
    )


def test_concurrency_mode_and_cost():
    w = sweep_workload(PROFILE, "concurrency")
    s = score_point(
        "vllm",
        MODEL,
        {"max_num_seqs": 8},
        "h100-sxm",
        1,
        w,
        "concurrency",
        Slo(ttft_p95_ms=300),
        price_per_gpu_hour=3.0,
        objective="cost_per_million",
    )
    assert s.meets_slo and isinstance(s.max_load, int) and 1 <= s.max_load <= 16
    assert s.cost_per_million == pytest.approx(3.0 / (s.numbers["output_tps"] * 3600) * 1e6)
    assert s.objective == s.cost_per_million


def space(**raw):
    return parse_space("vllm", None, raw)


def test_pool_and_serial_agree_and_rank():
    # 9 points: enough for a pool (smaller spaces are scored in-process).
    sp = space(max_num_seqs=[2, 8, 32], gpu_memory_utilization=[0.2, 0.3, 0.9])
    seen = []
    args = ("vllm", MODEL, {}, sp, "h100-sxm", 1, RATE, "rate", LOOSE, "tps_per_gpu")
    serial = predict_space(*args, workers=1, on_progress=lambda d, t: seen.append((d, t)))
    pooled = predict_space(*args, workers=2)
    strip = lambda p: {k: v for k, v in p.to_dict().items() if k not in ("elapsed_s", "workers")}  # noqa: E731
    assert strip(serial) == strip(pooled) and pooled.workers == 2
    assert seen[-1] == (9, 9) and len(seen) == 9
    assert serial.counts == {"total": 9, "feasible": 3, "meeting": 3}
    ranked = serial.ranked()
    assert [p.point["max_num_seqs"] for p in ranked] == [32, 8, 2]
    assert serial.best is ranked[0] and not serial.no_point_meets and serial.closest is None
    assert [p.feasible for p in serial.points] == [True] * 3 + [False] * 6
    # Grouped by error: a group's points differ only in the numbers of its message.
    assert sum(group["count"] for group in serial.infeasible) == 6
    assert all(group["count"] == 3 for group in serial.infeasible)
    back = Prediction.from_dict(json.loads(json.dumps(serial.to_dict())))
    assert back.to_dict() == serial.to_dict()


def test_no_point_meets_gives_the_closest():
    p = predict_space(
        "vllm",
        MODEL,
        {},
        space(max_num_seqs=[4, 16]),
        "h100-sxm",
        1,
        RATE,
        "rate",
        Slo(ttft_p95_ms=1),
        "tps_per_gpu",
        workers=1,
    )
    assert p.no_point_meets and p.ranked() == [] and p.best is None
    assert p.closest is p.points[0] and p.closest.closest["violations"]
    assert p.to_dict()["closest"]["point"] == p.closest.point
    picked = candidates(p, 3)
    assert len(picked) == 2 and all("predicted to miss the SLO" in c.note for c in picked)
    assert "margin -" in picked[0].note


def test_refusals():
    args = (space(max_num_seqs=[4]), "h100-sxm", 1, RATE, "rate", LOOSE)
    with pytest.raises(PredictError, match="needs a price per GPU-hour"):
        predict_space("vllm", MODEL, {}, *args, "cost_per_million")
    with pytest.raises(PredictError, match="does not model"):
        predict_space("vllm", "acme/Unknown-13B", {}, *args, "tps_per_gpu")
    with pytest.raises(PredictError, match="does not model the GPU"):
        predict_space(
            "vllm",
            MODEL,
            {},
            space(max_num_seqs=[4]),
            "tpu-v5",
            1,
            RATE,
            "rate",
            LOOSE,
            "tps_per_gpu",
        )
    with pytest.raises(PredictError, match="unknown objective"):
        predict_space("vllm", MODEL, {}, *args, "speed")


def test_candidates_skip_the_control_and_duplicates():
    def point(n, meets=True, objective=1.0):
        return PointScore(
            point={"max_num_seqs": n},
            settings={"max_num_seqs": n},
            feasible=True,
            meets_slo=meets,
            objective=objective,
            margin=0.1 if meets else -0.2,
        )

    pred = Prediction(
        "vllm",
        MODEL,
        "h100-sxm",
        1,
        "rate",
        "tps_per_gpu",
        {},
        {},
        {},
        {},
        1.0,
        None,
        [point(64, objective=3), point(32, objective=2), point(16, False)],
    )
    picked = candidates(pred, 2, control_settings={"max_num_seqs": "64"})
    assert [c.point["max_num_seqs"] for c in picked] == [32, 16]
    assert picked[0].meets_slo and not picked[1].meets_slo
    assert picked[1] is pred.points[2]  # the prediction's own objects: callers key on them
    assert len(candidates(pred, 5)) == 3 and len(candidates(pred, 1)) == 1


def test_pareto_front():
    items = [
        {"x": 1, "y": 5},
        {"x": 2, "y": 4},
        {"x": 2, "y": 3},  # dominated by (2, 4)
        {"x": 3, "y": 1},
        {"x": None, "y": 9},
    ]
    assert pareto_front(items, "x", "y") == [0, 1, 3]


def _in_daemon(queue):
    sp = space(max_num_seqs=[2, 8])
    p = predict_space("vllm", MODEL, {}, sp, "h100-sxm", 1, RATE, "rate", LOOSE, "tps_per_gpu",
                      workers=2)  # fmt: skip
    queue.put((p.workers, [s.max_load for s in p.points]))


def test_a_daemonic_process_falls_back_to_one_process():
    # A Celery prefork child is daemonic: it may not start a pool of its own.
    import multiprocessing

    queue = multiprocessing.Queue()
    child = multiprocessing.Process(target=_in_daemon, args=(queue,), daemon=True)
    child.start()
    workers, loads = queue.get(timeout=60)
    child.join(10)
    serial = predict_space("vllm", MODEL, {}, space(max_num_seqs=[2, 8]), "h100-sxm", 1, RATE,
                           "rate", LOOSE, "tps_per_gpu", workers=1)  # fmt: skip
    assert workers == 1 and loads == [s.max_load for s in serial.points]


def test_score_point_refuses_what_the_simulator_does_not_model():
    with pytest.raises(PredictError, match="does not model the GPU"):
        score_point("vllm", MODEL, {}, "tpu-v5", 1, RATE, "rate", LOOSE)
    with pytest.raises(PredictError, match="does not model this model"):
        score_point("vllm", "acme/Unknown-13B", {}, "h100-sxm", 1, RATE, "rate", LOOSE)
    # An NVML name works as well as the simulator's key.
    assert score_point("vllm", MODEL, {"max_num_seqs": 4}, "NVIDIA H100 80GB HBM3", 1, RATE,
                       "rate", LOOSE).meets_slo  # fmt: skip
