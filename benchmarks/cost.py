"""Cost of useful work: an hourly price and a benchmark's measured throughput turned into cost
per successful request and per million tokens (the cheapest option that meets an SLO is
``benchmarks.cost_ranking``).

PURE: imports nothing from Django, so the same arithmetic serves the cost page, the load
generator's CLI and the tests. Inputs may be ``Decimal``, ``int`` or ``float``; results are
floats (money to a fraction of a cent is a display question, not a storage one).

The model, in the words a finance person would check it with:

* The instance is paid for every hour (24 a day, 730 a month), whether it serves or idles.
* It serves traffic at the measured rate for a share of those hours:
  ``serving share = utilisation × (1 − restart overhead)``. Utilisation is the share of paid
  time with traffic (the rest is idle); restart overhead is the share of that time lost to
  restarts, model loading and failure recovery.
* Failed requests earn nothing: every throughput here counts successful requests (and their
  tokens) only, so the hours spent on failures are paid for by the successes.
* ``cost per unit = hourly price ÷ (units per second × 3600 × serving share)``. A per-token
  cost charges the whole hourly price to that kind of token, so the per-1M-output and
  per-1M-input figures are two views of the same bill, not parts to add up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

SECONDS_PER_HOUR = 3600
HOURS_PER_DAY = 24
HOURS_PER_MONTH = 730  # 8,760 hours a year ÷ 12
MILLION = 1_000_000
# Significant digits in the worked formulas: enough that the numbers shown reproduce the result.
EXACT = 8

# What "cheapest" can mean: attribute of RunCost → words for the page.
METRICS = {
    "per_request": "cost per successful request",
    "per_million_output": "cost per 1M output tokens",
    "per_million_input": "cost per 1M input tokens",
    "per_million_total": "cost per 1M tokens (input + output)",
    "per_slo_request": "cost per request meeting the profile's SLOs",
}


# --- validation ---------------------------------------------------------------------------


def _float(value, name: str) -> float | None:
    """``value`` as a finite float (None stays None); anything else is a ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def check_price(hourly_price) -> float:
    price = _float(hourly_price, "hourly price")
    if price is None:
        raise ValueError("hourly price is missing")
    if price < 0:
        raise ValueError(f"hourly price must be 0 or more, got {price:g}")
    return price


def check_utilisation(utilisation) -> float:
    value = _float(utilisation, "utilisation")
    if value is None or not 0 < value <= 1:
        raise ValueError(
            f"utilisation must be more than 0 and at most 1 (100 %), got {utilisation!r}"
        )
    return value


def check_restart_overhead(restart_overhead) -> float:
    value = _float(restart_overhead, "restart overhead")
    if value is None or not 0 <= value < 1:
        raise ValueError(
            f"restart overhead must be at least 0 and less than 1 (100 %), got {restart_overhead!r}"
        )
    return value


def check_rate(value, name: str) -> float | None:
    rate = _float(value, name)
    if rate is not None and rate < 0:
        raise ValueError(f"{name} must be 0 or more, got {rate:g}")
    return rate


def check_share(value, name: str) -> float | None:
    share = _float(value, name)
    if share is not None and not 0 <= share <= 1:
        raise ValueError(f"{name} must be between 0 and 1, got {share:g}")
    return share


# --- the formulas ---------------------------------------------------------------------------


def serving_share(utilisation=1.0, restart_overhead=0.0) -> float:
    """The share of paid hours spent serving at the measured rate."""
    return check_utilisation(utilisation) * (1 - check_restart_overhead(restart_overhead))


def cost_per_unit(
    hourly_price, units_per_s, utilisation=1.0, restart_overhead=0.0, per: float = 1
) -> float | None:
    """``per`` units' share of the hourly price at ``units_per_s`` while serving. None when
    nothing is produced (no rate measured, or zero) or no price is known."""
    share = serving_share(utilisation, restart_overhead)
    rate = check_rate(units_per_s, "throughput")
    price = None if hourly_price is None else check_price(hourly_price)
    if price is None or not rate:
        return None
    return price / (rate * SECONDS_PER_HOUR * share) * per


def cost_per_million(
    hourly_price, tokens_per_s, utilisation=1.0, restart_overhead=0.0
) -> float | None:
    """Price of a million tokens: hourly price ÷ (tokens/s × 3600 × serving share) × 10⁶."""
    return cost_per_unit(hourly_price, tokens_per_s, utilisation, restart_overhead, per=MILLION)


def cost_per_request(
    hourly_price, requests_per_s, utilisation=1.0, restart_overhead=0.0
) -> float | None:
    """Price of one successful request: hourly price ÷ (successful req/s × 3600 × share)."""
    return cost_per_unit(hourly_price, requests_per_s, utilisation, restart_overhead)


# --- the GPUs a deployment uses --------------------------------------------------------------


class GpuShare(NamedTuple):
    """An instance's hourly price split between the GPUs a deployment uses (charged to it)
    and the rest (idle as far as this deployment goes: charged to nothing here)."""

    instance_price: float | Decimal
    charged: float | Decimal
    used: int | None
    total: int | None

    @property
    def idle(self) -> int:
        return (self.total - self.used) if self.partial else 0

    @property
    def idle_price(self) -> float | Decimal:
        return self.instance_price - self.charged

    @property
    def partial(self) -> bool:
        return self.charged != self.instance_price

    def describe(self, currency: str = "") -> str:
        """ "1 of 2 GPUs: 2.45 of 4.90 USD/h" ("" when the deployment uses them all)."""
        if not self.partial:
            return ""
        return (
            f"{self.used} of {self.total} GPUs: {money(self.charged)} of "
            f"{money(self.instance_price, currency)}/h"
        )


def gpu_share(instance_price, used_gpus, instance_gpus) -> GpuShare:
    """The part of ``instance_price`` (per hour, for ``instance_gpus`` GPUs) that pays for
    ``used_gpus`` of them: price × used ÷ GPUs. The whole price when either count is unknown
    or the deployment uses every GPU (or claims more: then it is charged no more than all)."""
    check_price(instance_price)
    price = instance_price  # as given: a Decimal stays exact
    used, total = (int(n) if n else None for n in (used_gpus, instance_gpus))
    if not used or not total or used >= total:
        return GpuShare(price, price, used, total)
    return GpuShare(price, price * used / total, used, total)


def idle_gpus(instance_price, used_gpus: int, instance_gpus: int) -> GpuShare:
    """A host's GPUs that no deployment uses, as a share of its price (``used`` of them are
    in use); ``idle_price`` is what no deployment is charged."""
    check_price(instance_price)
    price = instance_price
    if not instance_gpus:
        return GpuShare(price, price, used_gpus, None)  # unknown: nothing said to be idle
    if not used_gpus:
        return GpuShare(price, price * 0, 0, int(instance_gpus))
    return gpu_share(price, used_gpus, instance_gpus)


# --- display --------------------------------------------------------------------------------


def number(value, significant: int = 4, min_decimals: int = 0) -> str:
    """``value`` to ``significant`` digits with thousands separators, trailing zeros dropped
    down to ``min_decimals`` ("1,280", "0.45", "0.0001543"); "—" for None."""
    if value is None:
        return "—"
    value = float(value)
    if value == 0 or math.isnan(value) or math.isinf(value):
        decimals = min_decimals
    else:
        magnitude = math.floor(math.log10(abs(value)))
        decimals = max(min_decimals, significant - 1 - magnitude)
    text = f"{value:,.{decimals}f}"
    if "." in text:
        whole, frac = text.split(".")
        frac = frac.rstrip("0").ljust(min_decimals, "0")
        text = f"{whole}.{frac}" if frac else whole
    return text


def money(value, currency: str = "", significant: int = 4) -> str:
    """An amount of money: at least 2 decimals, ``significant`` digits for small amounts."""
    if value is None:
        return "—"
    text = number(value, significant=significant, min_decimals=2)
    return f"{text} {currency}" if currency else text


def percent(share) -> str:
    return "—" if share is None else f"{number(share * 100, significant=3)} %"


class Formula(NamedTuple):
    """One line of the worked calculation: what it is, the rule, the rule with the numbers."""

    what: str
    rule: str
    worked: str

    def __str__(self) -> str:
        return f"{self.what} = {self.rule} = {self.worked}"


# --- one run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCost:
    """What a run's measured throughput costs at an hourly price, with the instance serving
    ``utilisation`` of the paid time and losing ``restart_overhead`` of that to restarts.

    Throughputs are of successful requests only (failed ones earn nothing); any may be None
    when not measured, and the costs built on it are then None too.
    """

    hourly_price: float
    currency: str = ""
    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None
    input_tokens_per_s: float | None = None
    goodput_rps: float | None = None
    error_rate: float | None = None
    utilisation: float = 1.0
    restart_overhead: float = 0.0

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "hourly_price", check_price(self.hourly_price))
        set_(self, "utilisation", check_utilisation(self.utilisation))
        set_(self, "restart_overhead", check_restart_overhead(self.restart_overhead))
        for name, words in (
            ("requests_per_s", "successful requests per second"),
            ("output_tokens_per_s", "output tokens per second"),
            ("input_tokens_per_s", "input tokens per second"),
            ("goodput_rps", "goodput (requests per second)"),
        ):
            set_(self, name, check_rate(getattr(self, name), words))
        set_(self, "error_rate", check_share(self.error_rate, "error rate"))
        set_(self, "currency", self.currency or "")

    @classmethod
    def from_run(
        cls,
        run: Any,
        hourly_price,
        currency: str = "",
        utilisation=1.0,
        restart_overhead=0.0,
    ) -> RunCost:
        """From anything with a benchmark run's headline attributes (``request_throughput``,
        ``output_tokens_per_s``, ``input_tokens_total``, ``duration_s``, ``goodput_rps``,
        ``error_rate``, ``completed``, ``failed``)."""
        duration = getattr(run, "duration_s", None)
        input_total = getattr(run, "input_tokens_total", None)
        input_rate = input_total / duration if input_total is not None and duration else None
        error_rate = getattr(run, "error_rate", None)
        if error_rate is None:
            done, failed = getattr(run, "completed", None), getattr(run, "failed", None)
            if done is not None and failed is not None and done + failed:
                error_rate = failed / (done + failed)
        return cls(
            hourly_price=hourly_price,
            currency=currency,
            requests_per_s=getattr(run, "request_throughput", None),
            output_tokens_per_s=getattr(run, "output_tokens_per_s", None),
            input_tokens_per_s=input_rate,
            goodput_rps=getattr(run, "goodput_rps", None),
            error_rate=error_rate,
            utilisation=utilisation,
            restart_overhead=restart_overhead,
        )

    # --- hours ------------------------------------------------------------------------------
    @property
    def serving_share(self) -> float:
        return self.utilisation * (1 - self.restart_overhead)

    @property
    def paid_hours_per_day(self) -> float:
        return float(HOURS_PER_DAY)

    @property
    def paid_hours_per_month(self) -> float:
        return float(HOURS_PER_MONTH)

    @property
    def serving_hours_per_day(self) -> float:
        return HOURS_PER_DAY * self.serving_share

    @property
    def serving_hours_per_month(self) -> float:
        return HOURS_PER_MONTH * self.serving_share

    @property
    def cost_per_day(self) -> float:
        return self.hourly_price * HOURS_PER_DAY

    @property
    def cost_per_month(self) -> float:
        return self.hourly_price * HOURS_PER_MONTH

    # --- rates per paid hour ----------------------------------------------------------------
    def _per_paid_hour(self, rate: float | None) -> float | None:
        return None if rate is None else rate * SECONDS_PER_HOUR * self.serving_share

    @property
    def total_tokens_per_s(self) -> float | None:
        if self.input_tokens_per_s is None or self.output_tokens_per_s is None:
            return None
        return self.input_tokens_per_s + self.output_tokens_per_s

    @property
    def requests_per_paid_hour(self) -> float | None:
        return self._per_paid_hour(self.requests_per_s)

    @property
    def requests_per_month(self) -> float | None:
        per_hour = self.requests_per_paid_hour
        return None if per_hour is None else per_hour * HOURS_PER_MONTH

    # --- costs ------------------------------------------------------------------------------
    def _cost(self, rate: float | None, per: float = 1) -> float | None:
        return cost_per_unit(self.hourly_price, rate, self.utilisation, self.restart_overhead, per)

    @property
    def per_request(self) -> float | None:
        return self._cost(self.requests_per_s)

    @property
    def per_million_output(self) -> float | None:
        return self._cost(self.output_tokens_per_s, MILLION)

    @property
    def per_million_input(self) -> float | None:
        return self._cost(self.input_tokens_per_s, MILLION)

    @property
    def per_million_total(self) -> float | None:
        return self._cost(self.total_tokens_per_s, MILLION)

    @property
    def per_slo_request(self) -> float | None:
        return self._cost(self.goodput_rps)

    def value(self, metric: str) -> float | None:
        if metric not in METRICS:
            raise ValueError(f"unknown cost metric {metric!r}: one of {', '.join(METRICS)}")
        return getattr(self, metric)

    # --- the worked calculation -------------------------------------------------------------
    def formula_table(self) -> list[Formula]:
        """Every figure as its rule and the rule with this run's numbers substituted."""
        c = self.currency
        price = money(self.hourly_price, c, EXACT)
        share = number(self.serving_share, EXACT)
        rows = [
            Formula(
                "Serving share",
                "utilisation × (1 − restart overhead)",
                f"{number(self.utilisation, EXACT)} × (1 − {number(self.restart_overhead, EXACT)})"
                f" = {share}",
            ),
            Formula(
                "Paid hours",
                f"{HOURS_PER_DAY} a day, {HOURS_PER_MONTH} a month (8,760 h ÷ 12), idle or not",
                f"{price}/h × {HOURS_PER_DAY} = {money(self.cost_per_day, c, EXACT)} a day; "
                f"{price}/h × {HOURS_PER_MONTH} = {money(self.cost_per_month, c, EXACT)} a month",
            ),
            Formula(
                "Serving hours",
                "paid hours × serving share",
                f"{HOURS_PER_DAY} × {share} = {number(self.serving_hours_per_day, EXACT)} h a day; "
                f"{HOURS_PER_MONTH} × {share} = {number(self.serving_hours_per_month, EXACT)} h "
                "a month",
            ),
        ]
        rows.append(
            Formula(
                "Failed requests",
                "earn nothing: every throughput below counts successful requests only",
                f"error rate {percent(self.error_rate)}; the time spent on failures is paid "
                "for by the successful requests",
            )
        )
        rows.append(
            self._unit_formula(
                "Cost per successful request",
                "hourly price ÷ (successful requests/s × 3600 × serving share)",
                self.requests_per_s,
                self.per_request,
            )
        )
        rows.append(
            self._unit_formula(
                "Cost per 1M output tokens",
                "hourly price ÷ (output tokens/s × 3600 × serving share) × 1,000,000 "
                "(the whole hourly price charged to output tokens)",
                self.output_tokens_per_s,
                self.per_million_output,
                MILLION,
            )
        )
        rows.append(
            self._unit_formula(
                "Cost per 1M input tokens",
                "hourly price ÷ (input tokens/s × 3600 × serving share) × 1,000,000 "
                "(the whole hourly price charged to input tokens: not to be added to the "
                "output figure)",
                self.input_tokens_per_s,
                self.per_million_input,
                MILLION,
            )
        )
        rows.append(
            self._unit_formula(
                "Cost per 1M tokens (input + output)",
                "hourly price ÷ ((input + output tokens/s) × 3600 × serving share) × 1,000,000",
                self.total_tokens_per_s,
                self.per_million_total,
                MILLION,
            )
        )
        rows.append(
            self._unit_formula(
                "Cost per request meeting the profile's SLOs",
                "hourly price ÷ (goodput requests/s × 3600 × serving share)",
                self.goodput_rps,
                self.per_slo_request,
            )
        )
        return rows

    def _unit_formula(
        self, what: str, rule: str, rate: float | None, result: float | None, per: int = 1
    ) -> Formula:
        c = self.currency
        price = money(self.hourly_price, c, EXACT)
        if not rate:
            return Formula(what, rule, "not measured" if rate is None else "nothing produced")
        per_hour = rate * SECONDS_PER_HOUR * self.serving_share
        scale = f" × {number(per)}" if per != 1 else ""
        worked = (
            f"{price} ÷ ({number(rate, EXACT)} × {SECONDS_PER_HOUR:,} × "
            f"{number(self.serving_share, EXACT)}){scale} = {price} ÷ "
            f"{number(per_hour, EXACT)}{scale} = {money(result, c, EXACT)}"
        )
        return Formula(what, rule, worked)

    def formulas(self) -> list[str]:
        """The worked calculation as text lines (see ``formula_table``)."""
        return [str(row) for row in self.formula_table()]
