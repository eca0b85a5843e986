"""Paired statistics against values worked out by hand or from the literature."""

import math

import pytest

from benchmarks.quality.stats import (
    mcnemar,
    min_items_for_no_loss,
    paired_difference_ci,
    wilson,
)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (8, 10, 0.4902, 0.9433),  # the textbook example
        (0, 10, 0.0, 0.2775),
        (50, 100, 0.4038, 0.5962),
        (10, 10, 0.7225, 1.0),
    ],
)
def test_wilson_known_values(k, n, low, high):
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(low, abs=1e-4)
    assert hi == pytest.approx(high, abs=1e-4)


def test_wilson_edges():
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(8, 10, 0.99)[0] < wilson(8, 10)[0]


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (0, 0, 1.0),
        (1, 6, 0.125),  # 2 * (1 + 7) / 2**7
        (0, 5, 0.0625),
        (2, 8, 0.109375),  # 2 * (1 + 10 + 45) / 2**10
        (10, 0, 2 / 1024),
        (5, 5, 1.0),
    ],
)
def test_mcnemar_exact_small_samples(b, c, p):
    assert mcnemar(b, c) == pytest.approx(p)


def test_mcnemar_chi_square_with_continuity_correction_from_25():
    # (|10 - 30| - 1)^2 / 40 = 9.025 -> p = 0.00266 (chi-square, 1 df)
    assert mcnemar(10, 30) == pytest.approx(0.002663, abs=2e-6)


def test_agresti_min_interval():
    low, high = paired_difference_ci(10, 3, 100)
    pb, pc = 10.5 / 102, 3.5 / 102
    half = 1.959964 * math.sqrt(((pb + pc) - (pb - pc) ** 2) / 102)
    assert (low, high) == pytest.approx((pb - pc - half, pb - pc + half), abs=1e-6)
    assert low == pytest.approx(-0.00203, abs=1e-4)
    assert high == pytest.approx(0.13928, abs=1e-4)


def test_identical_results_have_a_nonzero_interval_shrinking_with_n():
    low, high = paired_difference_ci(0, 0, 100)
    assert high == pytest.approx(1.959964 / 102) and low == -high
    assert paired_difference_ci(0, 0, 1000)[1] < high
    assert paired_difference_ci(0, 0, 0) == (-1.0, 1.0)
    needed = min_items_for_no_loss(0.01)
    assert needed == 194
    assert paired_difference_ci(0, 0, needed)[1] <= 0.01 < paired_difference_ci(0, 0, needed - 1)[1]
