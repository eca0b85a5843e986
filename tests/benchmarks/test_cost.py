"""The cost arithmetic (benchmarks.cost), checked against numbers worked out by hand."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import pytest

from benchmarks.cost import (
    METRICS,
    RunCost,
    cost_per_million,
    cost_per_request,
    money,
    number,
    serving_share,
)
from benchmarks.cost_ranking import Option, Slo, cheapest, rank

# $2.50 an hour, 1280 output tokens/s: 2.50 / (1280 × 3600) × 1e6 = 2.50 / 4,608,000 × 1e6.
BASE = 0.542534722222222
# 50 % utilisation and 10 % restart overhead: serving share 0.5 × 0.9 = 0.45.
SHARED = 1.205632716049383


def test_cost_per_million_at_full_utilisation():
    assert cost_per_million(2.50, 1280) == pytest.approx(BASE, rel=1e-12)


def test_cost_per_million_takes_decimal_prices():
    assert cost_per_million(Decimal("2.50"), 1280) == pytest.approx(BASE, rel=1e-12)


def test_idle_time_and_restarts_raise_the_cost():
    assert serving_share(0.5, 0.1) == pytest.approx(0.45)
    assert cost_per_million(2.50, 1280, 0.5, 0.1) == pytest.approx(SHARED, rel=1e-12)
    assert cost_per_million(2.50, 1280, utilisation=0.5) == pytest.approx(2 * BASE, rel=1e-12)


@pytest.mark.parametrize("rate", [None, 0, 0.0])
def test_nothing_produced_has_no_cost_per_token(rate):
    assert cost_per_million(2.50, rate) is None
    assert cost_per_request(2.50, rate) is None


def test_no_price_known_has_no_cost():
    assert cost_per_million(None, 1280) is None


def test_cost_per_successful_request():
    # 10 req/s → 36,000 a fully used hour: 2.50 / 36,000 = 0.0000694444…
    assert cost_per_request(2.50, 10) == pytest.approx(6.944444444444444e-05, rel=1e-12)
    # 30 % idle, 20 % of the rest restarting: 10 × 3600 × 0.7 × 0.8 = 20,160 an hour.
    assert cost_per_request(2.50, 10, 0.7, 0.2) == pytest.approx(2.50 / 20160, rel=1e-12)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"utilisation": 0}, "utilisation must be more than 0 and at most 1"),
        ({"utilisation": 1.5}, "utilisation must be more than 0 and at most 1"),
        ({"utilisation": -0.2}, "utilisation"),
        ({"restart_overhead": 1}, "restart overhead must be at least 0 and less than 1"),
        ({"restart_overhead": -0.01}, "restart overhead"),
        ({"hourly_price": -1}, "hourly price must be 0 or more"),
        ({"hourly_price": float("nan")}, "hourly price must be a finite number"),
        ({"hourly_price": "2.50"}, "hourly price must be a number"),
        ({"tokens_per_s": -5}, "throughput must be 0 or more"),
        ({"utilisation": True}, "utilisation must be a number"),
    ],
)
def test_bad_inputs_say_what_is_wrong(kwargs, message):
    arguments = {"hourly_price": 2.50, "tokens_per_s": 1280, **kwargs}
    with pytest.raises(ValueError, match=message):
        cost_per_million(**arguments)


def test_upper_and_lower_bounds_that_are_allowed():
    assert cost_per_million(2.50, 1280, utilisation=1) == pytest.approx(BASE)
    assert cost_per_million(0, 1280) == 0
    assert cost_per_million(2.50, 1280, restart_overhead=0) == pytest.approx(BASE)


def run_like(**kw):
    data = dict(
        request_throughput=10.0,
        output_tokens_per_s=1280.0,
        input_tokens_total=307_200,
        duration_s=60.0,
        goodput_rps=8.0,
        error_rate=0.0,
        completed=600,
        failed=0,
    )
    data.update(kw)
    return SimpleNamespace(**data)


def test_run_cost_from_a_run_prices_every_unit():
    cost = RunCost.from_run(run_like(), Decimal("2.50"), "USD")
    assert cost.input_tokens_per_s == pytest.approx(5120)  # 307,200 tokens / 60 s
    assert cost.per_request == pytest.approx(2.50 / 36_000)
    assert cost.per_million_output == pytest.approx(BASE)
    # 2.50 / (5120 × 3600) × 1e6 = 2.50 / 18,432,000 × 1e6
    assert cost.per_million_input == pytest.approx(0.1356336805555556)
    # (5120 + 1280) tok/s: 2.50 / 23,040,000 × 1e6
    assert cost.per_million_total == pytest.approx(0.1085069444444444)
    # 8 req/s meet the profile's SLOs: 2.50 / 28,800
    assert cost.per_slo_request == pytest.approx(8.680555555555556e-05)


def test_paid_hours_do_not_shrink_with_idle_time():
    cost = RunCost(hourly_price=2.50, currency="USD", utilisation=0.5, restart_overhead=0.1)
    assert cost.paid_hours_per_day == 24 and cost.paid_hours_per_month == 730
    assert cost.cost_per_day == pytest.approx(60.0)
    assert cost.cost_per_month == pytest.approx(1825.0)
    assert cost.serving_hours_per_day == pytest.approx(10.8)
    assert cost.serving_hours_per_month == pytest.approx(328.5)


def test_failed_requests_earn_nothing():
    # 600 sent in 60 s, 60 failed: 9 successful req/s, not 10. The hour costs the same, so
    # each success carries the failures' share: 2.50 / (9 × 3600) instead of 2.50 / 36,000.
    run = run_like(request_throughput=9.0, completed=540, failed=60, error_rate=None)
    cost = RunCost.from_run(run, 2.50, "USD")
    assert cost.error_rate == pytest.approx(0.1)
    assert cost.per_request == pytest.approx(2.50 / 32_400)
    assert cost.per_request > RunCost.from_run(run_like(), 2.50, "USD").per_request


def test_a_run_without_results_has_no_costs():
    run = SimpleNamespace()  # an imported file that said nothing
    cost = RunCost.from_run(run, 2.50, "USD")
    assert all(cost.value(metric) is None for metric in METRICS)
    assert cost.error_rate is None


def test_run_cost_validates_its_inputs():
    with pytest.raises(ValueError, match="utilisation"):
        RunCost(hourly_price=2.50, utilisation=0)
    with pytest.raises(ValueError, match="error rate must be between 0 and 1"):
        RunCost(hourly_price=2.50, error_rate=5)
    with pytest.raises(ValueError, match="output tokens per second must be 0 or more"):
        RunCost(hourly_price=2.50, output_tokens_per_s=-1)
    with pytest.raises(ValueError, match="unknown cost metric"):
        RunCost(hourly_price=2.50).value("per_banana")


def test_formulas_show_the_numbers_substituted():
    cost = RunCost.from_run(run_like(), Decimal("2.50"), "USD", 0.5, 0.1)
    lines = cost.formulas()
    text = "\n".join(lines)
    assert "Serving share = utilisation × (1 − restart overhead) = 0.5 × (1 − 0.1) = 0.45" in text
    output = next(line for line in lines if line.startswith("Cost per 1M output tokens"))
    assert "the whole hourly price charged to output tokens" in output
    # 1280 × 3600 × 0.45 = 2,073,600 output tokens a paid hour
    assert "2.50 USD ÷ (1,280 × 3,600 × 0.45) × 1,000,000" in output
    assert "2.50 USD ÷ 2,073,600 × 1,000,000 = 1.2056327 USD" in output
    request = next(line for line in lines if line.startswith("Cost per successful request"))
    assert request.endswith("2.50 USD ÷ 16,200 = 0.00015432099 USD")
    assert "2.50 USD/h × 730 = 1,825.00 USD a month" in text
    assert "earn nothing" in text


def test_formulas_say_when_nothing_was_measured():
    cost = RunCost(hourly_price=2.50, currency="USD", requests_per_s=0)
    table = {row.what: row for row in cost.formula_table()}
    assert table["Cost per successful request"].worked == "nothing produced"
    assert table["Cost per 1M output tokens"].worked == "not measured"


def test_number_and_money_formatting():
    assert number(1280.0) == "1,280"
    assert number(0.45) == "0.45"
    assert number(None) == "—"
    assert money(0.542534722) == "0.5425"
    assert money(2.5, "USD") == "2.50 USD"
    assert money(0.000154320987) == "0.0001543"
    assert money(1825) == "1,825.00"


# --- choosing the cheapest ----------------------------------------------------------------


def option(key, price, rps, ttft, currency="USD", error_rate=0.0, out=None):
    cost = RunCost(
        hourly_price=price,
        currency=currency,
        requests_per_s=rps,
        output_tokens_per_s=out,
        error_rate=error_rate,
    )
    return Option(key=key, cost=cost, ttft_p95_ms=ttft, label=f"run {key}")


def test_cheapest_meeting_the_slo_skips_a_cheaper_but_slow_option():
    slow = option("slow", 1.00, 10, ttft=800)  # 1.00 / 36,000 per request
    fast = option("fast", 2.50, 10, ttft=300)  # 2.50 / 36,000
    dear = option("dear", 3.00, 10, ttft=200)  # 3.00 / 36,000
    options = [dear, slow, fast]
    assert cheapest(options, Slo(ttft_p95_ms=500)).key == "fast"
    assert cheapest(options).key == "slow"  # no SLO: the slow one is the cheapest
    ranking = rank(options, Slo(ttft_p95_ms=500), currency="USD")
    assert [o.key for o in ranking.ranked] == ["fast", "dear"]
    assert ranking.missed == {"slow": ["p95 TTFT 800 ms > 500 ms"]}
    assert ranking.status(slow) == "misses the SLO: p95 TTFT 800 ms > 500 ms"
    assert ranking.status(fast) == "cheapest meeting the SLO"
    assert ranking.status(dear) == "meets the SLO (#2)"


def test_the_slo_limit_itself_is_met():
    assert cheapest([option("edge", 1.0, 10, ttft=500)], Slo(ttft_p95_ms=500)).key == "edge"


def test_error_rate_limit_excludes_a_flaky_option():
    flaky = option("flaky", 1.00, 10, ttft=300, error_rate=0.05)
    steady = option("steady", 2.00, 10, ttft=300, error_rate=0.005)
    slo = Slo(ttft_p95_ms=500, max_error_rate=0.01)
    assert cheapest([flaky, steady], slo).key == "steady"
    assert slo.misses(300, 0.05) == ["error rate 5 % > 1 %"]
    assert slo.describe() == "p95 TTFT ≤ 500 ms and error rate ≤ 1 %"


def test_no_option_meets_the_slo():
    assert cheapest([option("a", 1.0, 10, ttft=900)], Slo(ttft_p95_ms=500)) is None
    assert cheapest([], Slo(ttft_p95_ms=500)) is None


def test_missing_latency_does_not_meet_a_latency_slo():
    assert Slo(ttft_p95_ms=500).misses(None, 0.0) == ["no p95 TTFT measured"]
    assert Slo(max_error_rate=0.01).misses(100, None) == ["no error rate measured"]
    assert Slo().meets(None, None)


def test_cheapest_by_tokens_can_differ_from_by_request():
    # a: 2.00/h, 10 req/s, 500 tok/s → 5.56e-5 per request, 1.111 per 1M output tokens
    # b: 3.00/h, 10 req/s, 2000 tok/s → 8.33e-5 per request, 0.4167 per 1M output tokens
    a = option("a", 2.00, 10, ttft=100, out=500)
    b = option("b", 3.00, 10, ttft=100, out=2000)
    assert cheapest([a, b]).key == "a"
    assert cheapest([a, b], metric="per_million_output").key == "b"


def test_currencies_are_never_compared():
    usd = option("usd", 2.50, 10, ttft=300, currency="USD")
    eur = option("eur", 0.50, 10, ttft=300, currency="EUR")  # lower number, other money
    with pytest.raises(ValueError, match=r"several currencies \(EUR, USD\)"):
        cheapest([usd, eur], Slo(ttft_p95_ms=500))
    assert cheapest([usd, eur], Slo(ttft_p95_ms=500), currency="USD").key == "usd"
    assert cheapest([usd, eur], Slo(ttft_p95_ms=500), currency="EUR").key == "eur"
    ranking = rank([usd, eur], currency="USD")
    assert [o.key for o in ranking.other_currency] == ["eur"]
    assert ranking.status(eur) == "priced in EUR: not ranked against USD"


def test_unpriced_and_unmeasured_options_are_not_ranked():
    free = option("free", 0, 10, ttft=100)  # no price set: unknown, not free
    idle = option("idle", 1.0, None, ttft=100)
    paid = option("paid", 2.0, 10, ttft=100)
    ranking = rank([free, idle, paid], currency="USD")
    assert ranking.cheapest.key == "paid"
    assert set(ranking.unpriced) == {"free", "idle"}
    assert "no price set" in ranking.status(free)


def test_ties_keep_the_order_given():
    first, second = option("first", 2.0, 10, ttft=100), option("second", 2.0, 10, ttft=100)
    assert cheapest([first, second]).key == "first"
    assert cheapest([second, first]).key == "second"


def test_slo_validates_its_limits():
    with pytest.raises(ValueError, match="error rate limit must be between 0 and 1"):
        Slo(max_error_rate=2)
    with pytest.raises(ValueError, match="p95 TTFT limit must be 0 or more"):
        Slo(ttft_p95_ms=-1)
    with pytest.raises(ValueError, match="unknown cost metric"):
        rank([], currency="USD", metric="per_banana")
