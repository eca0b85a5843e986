"""SLOs: validation, the check and its margin, and the change to a simulator's virtual time."""

import pytest

from benchmarks.sweep import Slo, SloError


def test_from_dict_validates():
    slo = Slo.from_dict({"ttft_p95_ms": 500, "itl_p95_ms": "50", "max_error_rate": 0.02})
    assert slo.ttft_p95_ms == 500 and slo.itl_p95_ms == 50 and slo.max_error_rate == 0.02
    assert Slo.from_dict(slo.to_dict()) == slo
    assert Slo.from_dict({"min_output_tps_per_user": 20}).min_output_tps_per_user == 20
    with pytest.raises(SloError, match="set at least one latency limit"):
        Slo.from_dict({"max_error_rate": 0.1})
    with pytest.raises(SloError, match="unknown SLO field"):
        Slo.from_dict({"ttft": 500})
    with pytest.raises(SloError, match="above 0"):
        Slo.from_dict({"ttft_p95_ms": 0})
    with pytest.raises(SloError, match="between 0 and 1"):
        Slo.from_dict({"ttft_p95_ms": 5, "max_error_rate": 2})
    with pytest.raises(SloError, match="a number"):
        Slo.from_dict({"ttft_p95_ms": True})
    with pytest.raises(SloError, match="finite"):
        Slo.from_dict({"ttft_p95_ms": float("nan")})


def test_describe():
    assert Slo(ttft_p95_ms=500).describe() == "p95 TTFT ≤ 500 ms, errors ≤ 1 %"
    text = Slo(itl_p95_ms=50, min_output_tps_per_user=20, max_error_rate=0).describe()
    assert text == "p95 ITL ≤ 50 ms, ≥ 20 tok/s per user, errors ≤ 0 %"


def test_check_and_margin():
    slo = Slo(ttft_p95_ms=500, itl_p95_ms=50, min_output_tps_per_user=20)
    good = {"ttft_p95_ms": 400, "itl_p95_ms": 25, "output_tps_per_user": 30, "error_rate": 0}
    check = slo.check(good)
    assert check.ok and check.violations == [] and check.margin == pytest.approx(0.2)
    bad = dict(good, ttft_p95_ms=600, output_tps_per_user=15, error_rate=0.05)
    check = slo.check(bad)
    assert not check.ok and len(check.violations) == 3
    assert "p95 TTFT 600 ms > 500 ms" in check.violations
    assert check.margin == pytest.approx((0.01 - 0.05) / 0.01)
    check = slo.check({"ttft_p95_ms": 100, "error_rate": 0, "output_tps_per_user": 30})
    assert not check.ok and check.violations == ["no p95 ITL measured"] and check.margin < 0
    assert "no error rate measured" in slo.check({**good, "error_rate": None}).violations


def test_scaled_is_virtual_time():
    slo = Slo(ttft_p95_ms=500, itl_p95_ms=50, min_output_tps_per_user=20, max_error_rate=0.05)
    fast = slo.scaled(0.25)  # the simulator runs four times faster than real time
    assert (fast.ttft_p95_ms, fast.itl_p95_ms, fast.min_output_tps_per_user) == (2000, 200, 5)
    assert fast.max_error_rate == 0.05 and fast.ttft_p99_ms is None
    with pytest.raises(SloError):
        slo.scaled(0)
