"""The cheapest option that meets an SLO: runs' costs (``benchmarks.cost.RunCost``) ranked
under a latency and error SLO, among runs of one load profile, each refusal said in words.

PURE: imports nothing from Django (like ``benchmarks.cost``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.cost import METRICS, RunCost, check_rate, check_share, number, percent

# The error rate a run may have and still be a config to buy, unless the user says otherwise:
# a config that fails one request in a hundred is not cheap whatever its cost per success.
DEFAULT_MAX_ERROR_RATE = 0.01


@dataclass(frozen=True)
class Slo:
    """What a run must achieve to count: p95 TTFT at most ``ttft_p95_ms`` and, optionally,
    an error rate (a fraction) at most ``max_error_rate``. None means no limit."""

    ttft_p95_ms: float | None = None
    max_error_rate: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "ttft_p95_ms", check_rate(self.ttft_p95_ms, "p95 TTFT limit"))
        object.__setattr__(
            self, "max_error_rate", check_share(self.max_error_rate, "error rate limit")
        )

    def misses(self, ttft_p95_ms, error_rate) -> list[str]:
        """Why a run with these numbers misses the SLO (empty when it meets it)."""
        reasons = []
        if self.ttft_p95_ms is not None:
            if ttft_p95_ms is None:
                reasons.append("no p95 TTFT measured")
            elif ttft_p95_ms > self.ttft_p95_ms:
                reasons.append(f"p95 TTFT {number(ttft_p95_ms)} ms > {number(self.ttft_p95_ms)} ms")
        if self.max_error_rate is not None:
            if error_rate is None:
                reasons.append("no error rate measured")
            elif error_rate > self.max_error_rate:
                reasons.append(f"error rate {percent(error_rate)} > {percent(self.max_error_rate)}")
        return reasons

    def meets(self, ttft_p95_ms, error_rate) -> bool:
        return not self.misses(ttft_p95_ms, error_rate)

    def describe(self) -> str:
        parts = []
        if self.ttft_p95_ms is not None:
            parts.append(f"p95 TTFT ≤ {number(self.ttft_p95_ms)} ms")
        if self.max_error_rate is not None:
            parts.append(f"error rate ≤ {percent(self.max_error_rate)}")
        return " and ".join(parts) or "no SLO"


@dataclass(frozen=True)
class Option:
    """One candidate (a run of a config on an instance) with its cost and latency."""

    key: Any
    cost: RunCost
    ttft_p95_ms: float | None = None
    label: str = ""
    # Why its run may not be evidence ("client-limited: …", ``benchmarks.evidence``): such
    # an option is never ranked, and says so.
    refused: str | None = None
    # The load profile its run measured ("chat v3"): a ranking compares one profile's runs
    # only, since the same config is cheaper under a lighter load.
    profile: str | None = None

    @property
    def currency(self) -> str:
        return self.cost.currency

    @property
    def error_rate(self) -> float | None:
        return self.cost.error_rate


@dataclass
class Ranking:
    """Options sorted for one currency and one cost metric: those meeting the SLO cheapest
    first, and every other option with the reason it was left out."""

    currency: str
    metric: str
    slo: Slo
    ranked: list[Option] = field(default_factory=list)
    missed: dict[Any, list[str]] = field(default_factory=dict)
    other_currency: list[Option] = field(default_factory=list)
    unpriced: dict[Any, str] = field(default_factory=dict)
    refused: dict[Any, str] = field(default_factory=dict)
    profile: str | None = None  # the one profile whose runs are ranked (None: any)
    other_profile: dict[Any, str] = field(default_factory=dict)

    @property
    def cheapest(self) -> Option | None:
        return self.ranked[0] if self.ranked else None

    def status(self, option: Option) -> str:
        """A few words on where ``option`` stands."""
        if option.key in {other.key for other in self.other_currency}:
            return (
                f"priced in {option.currency or 'no currency'}: not ranked against {self.currency}"
            )
        if option.key in self.unpriced:
            return self.unpriced[option.key]
        if option.key in self.refused:
            return f"not ranked: {self.refused[option.key]}"
        if option.key in self.other_profile:
            return (
                f"not ranked: profile {self.other_profile[option.key]}, not {self.profile} "
                "(runs under different loads do not compare)"
            )
        if option.key in self.missed:
            return "misses the SLO: " + "; ".join(self.missed[option.key])
        if self.cheapest is not None and option.key == self.cheapest.key:
            return "cheapest meeting the SLO"
        place = [ranked.key for ranked in self.ranked].index(option.key) + 1
        return f"meets the SLO (#{place})"


def rank(
    options: Iterable[Option],
    slo: Slo | None = None,
    *,
    currency: str,
    metric="per_request",
    profile: str | None = None,
) -> Ranking:
    """Rank ``options`` priced in ``currency`` by ``metric`` among those meeting ``slo``.

    Options in another currency are set aside (money in two currencies is never compared),
    as are those of another ``profile`` than the one given (a config measured under a
    lighter load looks cheaper: only runs of one load compare), those without a cost (no
    throughput measured) or with a zero price (no price set: free is not cheap, it is
    unknown). Ties keep the order given.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown cost metric {metric!r}: one of {', '.join(METRICS)}")
    slo = slo or Slo()
    ranking = Ranking(currency=currency, metric=metric, slo=slo, profile=profile)
    meeting = []
    for option in options:
        if option.refused:
            ranking.refused[option.key] = option.refused
            continue
        if profile is not None and option.profile != profile:
            ranking.other_profile[option.key] = option.profile or "none"
            continue
        if option.currency != currency:
            ranking.other_currency.append(option)
            continue
        value = option.cost.value(metric)
        if option.cost.hourly_price == 0:
            ranking.unpriced[option.key] = "no price set (0 per hour): not ranked"
            continue
        if value is None:
            ranking.unpriced[option.key] = f"no {METRICS[metric]}: nothing measured"
            continue
        reasons = slo.misses(option.ttft_p95_ms, option.error_rate)
        if reasons:
            ranking.missed[option.key] = reasons
            continue
        meeting.append((value, option))
    meeting.sort(key=lambda pair: pair[0])
    ranking.ranked = [option for _, option in meeting]
    return ranking


def cheapest(
    options: Iterable[Option],
    slo: Slo | None = None,
    *,
    currency: str | None = None,
    metric: str = "per_request",
) -> Option | None:
    """The cheapest option meeting ``slo`` by ``metric`` (None if none does). Options in
    several currencies need ``currency`` to say which to rank: they are never compared."""
    options = list(options)
    if currency is None:
        currencies = sorted({option.currency for option in options})
        if len(currencies) > 1:
            raise ValueError(
                f"options are priced in several currencies ({', '.join(currencies)}): "
                "say which currency to rank; prices in different currencies are not compared"
            )
        currency = currencies[0] if currencies else ""
    return rank(options, slo, currency=currency, metric=metric).cheapest
