"""A day's hourly rates from a traffic sample: the seconds of each UTC hour the sample covers,
partial hours and several days, the fallback for hours it does not measure, relative times,
and samples that cannot give a day."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from benchmarks.loadgen import traffic
from benchmarks.loadgen.traffic import TrafficRow
from scaling.planning.dayshape import (
    FROM_MIDNIGHT,
    UTC_CLOCK,
    DayShapeError,
    coverage,
    hour_ranges,
    hourly_from_sample,
    rows_from_replay,
)

FALLBACK = [float(h) / 10 for h in range(24)]


def at(day: int, hour: int, minute: int = 0, second: float = 0) -> float:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC).timestamp() + second


def rows(times, input_tokens: int = 100, output_tokens: int = 20) -> list[TrafficRow]:
    return [TrafficRow(t, input_tokens, output_tokens, line=i) for i, t in enumerate(times, 1)]


def evenly(start: float, end: float, count: int) -> list[float]:
    """``count`` arrivals from ``start`` to ``end`` inclusive."""
    step = (end - start) / (count - 1)
    return [start + i * step for i in range(count)]


def test_partial_hours_count_only_the_seconds_covered():
    covered = coverage(at(2, 9, 10), at(2, 11, 40))
    assert covered[9] == 50 * 60 and covered[10] == 3600 and covered[11] == 40 * 60
    assert sum(covered) == 150 * 60


def test_several_days_add_up_per_hour_of_day():
    # Monday 22:30 to Wednesday 01:15: hour 23 twice, hour 22 1.5 times, hour 1 1.25 times,
    # the hours between once.
    covered = coverage(at(2, 22, 30), at(4, 1, 15))
    assert covered[22] == 1800 + 3600
    assert covered[23] == 2 * 3600
    assert covered[0] == 2 * 3600
    assert covered[1] == 3600 + 900
    assert covered[12] == 3600
    assert sum(covered) == at(4, 1, 15) - at(2, 22, 30)


def test_rates_are_requests_over_covered_seconds():
    # 09:10–11:40 on two days: 300 requests in hour 9 (2 × 50 min), 720 in hour 10,
    # 480 in hour 11 (2 × 40 min): 0.05, 0.1 and 0.1 req/s.
    times = []
    for day in (2, 3):
        times += evenly(at(day, 9, 10), at(day, 9, 59, 59.5), 150)
        times += evenly(at(day, 10), at(day, 10, 59, 59.5), 360)
        times += evenly(at(day, 11), at(day, 11, 40), 240)
    shape = hourly_from_sample(rows(times), FALLBACK)
    # The sample runs from day 2 09:10 to day 3 11:40: the night between is covered (and
    # measures 0), and so are day 2's 11:40–12:00 and day 3's 09:00–09:10.
    assert shape.covered_s[9] == 3000 + 3600 and shape.covered_s[10] == 2 * 3600
    assert shape.covered_s[11] == 3600 + 2400  # day 2's 11:40 to 12:00 is covered too
    assert shape.hourly[9] == pytest.approx(300 / 6600, rel=1e-5)
    assert shape.hourly[10] == pytest.approx(720 / 7200, rel=1e-5)
    assert shape.hourly[11] == pytest.approx(480 / 6000, rel=1e-5)
    assert shape.hourly[3] == 0.0  # covered overnight, no requests
    assert shape.placement == UTC_CLOCK and shape.requests == len(times)
    assert shape.covered_hours == list(range(24)) and shape.fallback_hours == []


def test_hours_covered_briefly_take_the_fallback():
    # 08:58 to 11:03: hours 8 and 11 have 2 and 3 minutes, under the 5-minute minimum.
    times = evenly(at(2, 8, 58), at(2, 11, 3), 751)
    shape = hourly_from_sample(rows(times), FALLBACK)
    assert shape.covered_hours == [9, 10]
    assert shape.fallback_hours == [h for h in range(24) if h not in (9, 10)]
    assert shape.hourly[9] == pytest.approx(0.1, rel=0.01)
    assert shape.hourly[10] == pytest.approx(0.1, rel=0.01)
    for hour in shape.fallback_hours:
        assert shape.hourly[hour] == FALLBACK[hour]  # hour 8's two minutes are not a rate


def test_uncovered_hours_without_a_fallback_are_named():
    times = evenly(at(2, 8), at(2, 19), 100)
    with pytest.raises(DayShapeError, match=r"hours 00–07, 19–23 \(UTC\)"):
        hourly_from_sample(rows(times), None)


def test_a_full_day_needs_no_fallback():
    shape = hourly_from_sample(rows(evenly(at(2, 0), at(3, 0), 8641)), None)
    assert shape.fallback_hours == [] and len(shape.hourly) == 24
    assert all(rate == pytest.approx(0.1, rel=0.01) for rate in shape.hourly)


def test_relative_times_are_placed_from_midnight():
    # Seconds from some start (a replay's rows): 100 s in, two hours and a half long.
    times = evenly(100.0, 100.0 + 2.5 * 3600, 901)
    shape = hourly_from_sample(rows(times), FALLBACK)
    assert shape.placement == FROM_MIDNIGHT
    assert shape.covered_hours == [0, 1, 2]
    assert shape.covered_s[2] == 1800
    assert shape.hourly[0] == pytest.approx(0.1, rel=0.01)


def test_a_sample_without_times_gives_sizes_not_a_day():
    sample = rows([None, None, None])
    with pytest.raises(DayShapeError, match="no arrival times: it gives request sizes"):
        hourly_from_sample(sample, FALLBACK)


def test_a_sample_of_a_minute_measures_no_hour():
    with pytest.raises(DayShapeError, match="measures no hour"):
        hourly_from_sample(rows(evenly(at(2, 9), at(2, 9, 1), 60)), FALLBACK)


def test_epoch_milliseconds_are_refused():
    with pytest.raises(DayShapeError, match="milliseconds"):
        hourly_from_sample(rows([at(2, 9) * 1000, at(2, 10) * 1000]), FALLBACK)


def test_iso_times_through_the_projects_reader_and_mean_sizes():
    lines = [
        {"timestamp": f"2026-03-02T14:{m:02d}:00Z", "prompt_tokens": 300 + m, "output_tokens": 50}
        for m in range(0, 60, 2)
    ] + [{"timestamp": "2026-03-02 15:30:00", "input_tokens": 330, "output_tokens": 80}]
    parsed = traffic.parse("\n".join(json.dumps(x) for x in lines), filename="day.jsonl")
    shape = hourly_from_sample(parsed, FALLBACK)
    assert shape.placement == UTC_CLOCK  # a time without a zone is read as UTC
    assert shape.covered_hours == [14, 15]
    assert shape.hourly[14] == pytest.approx(30 / 3600, rel=1e-5)
    assert shape.hourly[15] == pytest.approx(1 / 1800, rel=1e-5)
    mean_input = (sum(300 + m for m in range(0, 60, 2)) + 330) / 31
    assert shape.mean_input_tokens == pytest.approx(mean_input, abs=0.05)
    assert shape.mean_output_tokens == pytest.approx((30 * 50 + 80) / 31, abs=0.05)


def test_csv_epoch_times_through_the_projects_reader():
    text = "ts,input_tokens,output_tokens\n" + "\n".join(
        f"{at(2, 6) + i * 20},{100},{10}" for i in range(181)
    )
    shape = hourly_from_sample(traffic.parse(text, filename="x.csv"), FALLBACK)
    assert shape.covered_hours == [6] and shape.hourly[6] == pytest.approx(180 / 3600, rel=1e-5)


def test_a_replay_profiles_rows_at_its_time_scale():
    replay = {"rows": [[i * 10.0, 100, 20, None] for i in range(361)], "time_scale": 2.0}
    sample = rows_from_replay(replay)
    assert sample[-1].timestamp == 7200.0
    shape = hourly_from_sample(sample, FALLBACK)
    assert shape.placement == FROM_MIDNIGHT and shape.covered_hours == [0, 1]
    assert shape.hourly[0] == pytest.approx(180 / 3600, rel=1e-5)


def test_hour_ranges_read_as_spans():
    assert hour_ranges([8, 9, 10, 11, 14, 22, 23]) == "08–11, 14, 22–23"
