"""Statistics for paired probe results: intervals for one accuracy and for a paired difference.

The same items are asked of both models, so the comparison is paired: only the discordant items
(right on one side, wrong on the other) carry information about a difference. ``b`` counts the
items only the baseline got right, ``c`` those only the candidate got right.

Paired-difference interval: Agresti–Min (2005) adjusted Wald — add one half to each of the four
cells of the 2×2 table (so n + 2 items) and use the Wald interval on the adjusted proportions.
It needs only b, c and n, has close to nominal coverage even with few discordant pairs, and
unlike the plain Wald interval does not collapse to a zero-width interval when b = c = 0.
"""

from __future__ import annotations

import math
from statistics import NormalDist


def z_value(confidence: float) -> float:
    """Two-sided normal quantile: 1.96 for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError("k must be between 0 and n")
    z = z_value(confidence)
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def binomial_two_sided(b: int, c: int) -> float:
    """Exact two-sided sign test of b against c (each discordant pair a fair coin)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


EXACT_BELOW = 25  # the usual rule: the chi-square approximation is poor under ~25 discordant


def mcnemar(b: int, c: int) -> float:
    """McNemar's test p-value: exact binomial under 25 discordant pairs, else chi-square (cc)."""
    if b < 0 or c < 0:
        raise ValueError("counts must be non-negative")
    if b + c < EXACT_BELOW:
        return binomial_two_sided(b, c)
    chi2 = (abs(b - c) - 1) ** 2 / (b + c)
    return math.erfc(math.sqrt(chi2 / 2))  # survival of chi-square with 1 degree of freedom


def paired_difference_ci(b: int, c: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Agresti–Min interval for (baseline accuracy − candidate accuracy) = (b − c) / n."""
    if n <= 0:
        return -1.0, 1.0
    if b < 0 or c < 0 or b + c > n:
        raise ValueError("need 0 <= b, c and b + c <= n")
    z = z_value(confidence)
    m = n + 2
    pb = (b + 0.5) / m
    pc = (c + 0.5) / m
    diff = pb - pc
    half = z * math.sqrt(max(0.0, (pb + pc) - diff * diff) / m)
    return max(-1.0, diff - half), min(1.0, diff + half)


def min_items_for_no_loss(max_loss: float, confidence: float = 0.95) -> int:
    """The fewest paired items for which identical answers can prove "no loss" at max_loss.

    With b = c = 0 the upper bound is z / (n + 2); below this size no result can say "no loss".
    """
    if max_loss <= 0:
        return math.inf  # type: ignore[return-value]
    return max(1, math.ceil(z_value(confidence) / max_loss) - 2)
