"""Traffic samples: reading JSONL/CSV, the summary, fitting distributions, replay documents."""

import json
import math
import random

import pytest

from benchmarks.loadgen import traffic
from benchmarks.loadgen.profile import plan, validate
from benchmarks.loadgen.traffic import TrafficError, TrafficRow


def jsonl(*records) -> str:
    return "\n".join(json.dumps(r) for r in records) + "\n"


def rows_at(times, lengths=None) -> list[TrafficRow]:
    lengths = lengths or [100] * len(times)
    return [
        TrafficRow(t, n, 50, line=i)
        for i, (t, n) in enumerate(zip(times, lengths, strict=True), start=1)
    ]


# -- reading --------------------------------------------------------------------------------


def test_jsonl_reads_common_names_nested_usage_and_sorts_by_time():
    text = jsonl(
        {"timestamp": 12.5, "input_tokens": 300, "output_tokens": 40, "prefix_id": 7},
        {"time": 10, "prompt_tokens": 100, "completion_tokens": 20},
        {"ts": "11", "usage": {"prompt_tokens": 200, "completion_tokens": 30}},
    )
    text = text.replace("\n", "\n\n", 1)  # a blank line is skipped, numbering goes on
    rows = traffic.parse(text)
    assert [(r.timestamp, r.input_tokens, r.output_tokens) for r in rows] == [
        (10.0, 100, 20),
        (11.0, 200, 30),
        (12.5, 300, 40),
    ]
    assert [r.line for r in rows] == [3, 4, 1]
    assert rows[2].prefix_id == "7" and rows[0].prefix_id is None


def test_csv_with_header_aliases_and_iso_timestamps():
    text = (
        "Time,Input_Len,output_len,prefix_id\n"
        "2024-01-01T00:00:02.5+00:00,20,5,sys\n"
        "2024-01-01T00:00:00Z,10,4,\n"
        "2024-01-01T01:00:00+01:00,30,6,sys\n"  # the same instant as 00:00:00Z
        "2024-01-01 00:00:10,40,7,\n"  # no zone: read as UTC
    )
    rows = traffic.parse(text, filename="sample.CSV")
    # 2024-01-01T00:00:00Z is 1704067200 s after the epoch.
    assert [r.timestamp - 1704067200 for r in rows] == [0.0, 0.0, 2.5, 10.0]
    assert sorted(r.input_tokens for r in rows[:2]) == [10, 30]
    assert rows[2].input_tokens == 20 and rows[2].prefix_id == "sys"
    assert rows[3].line == 5  # the header is line 1


def test_format_is_guessed_from_the_first_character():
    assert traffic.parse('{"input_tokens": 5, "output_tokens": 6}')[0].input_tokens == 5
    assert traffic.parse("input_tokens,output_tokens\n5,6\n")[0].output_tokens == 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("input_tokens,output_tokens\n1,2\n3,4\n5\n", "line 4: no output_tokens"),
        ("input_tokens,output_tokens\n1,2\nx,3\n", "line 3: input_tokens 'x' is not a number"),
        (
            "prompt_tokens,completion_tokens\n1,2.5\n",
            "line 2: completion_tokens '2.5' is not a whole",
        ),
        ("input_tokens,output_tokens\n1,0\n", "line 2: output_tokens must be >= 1"),
        ("input_tokens,output_tokens\n1,2,3\n", "line 2: 3 values for 2 columns"),
        (jsonl({"input_tokens": 1, "output_tokens": 2}) + "{oops\n", "line 2: not JSON"),
        ("[1, 2]\n", "line 1: expected a JSON object"),
        (jsonl({"output_tokens": 2}), "line 1: no input_tokens"),
        (
            jsonl({"ts": "yesterday", "input_tokens": 1, "output_tokens": 2}),
            "line 1: ts 'yesterday' is neither seconds nor an ISO-8601 time",
        ),
        (
            jsonl(
                {"ts": 1, "input_tokens": 1, "output_tokens": 2},
                {"input_tokens": 1, "output_tokens": 2},
            ),
            "line 2: no timestamp, but line 1 has one",
        ),
        ("input_tokens,output_tokens\n", "sample: no rows"),
    ],
)
def test_bad_rows_are_named_by_line(text, message):
    with pytest.raises(TrafficError) as info:
        traffic.parse(text)
    assert message in str(info.value)


def test_too_many_rows_and_too_many_bytes_are_refused():
    text = "input_tokens,output_tokens\n" + "1,1\n" * (traffic.MAX_ROWS + 1)
    with pytest.raises(TrafficError, match="more than 100,000 rows"):
        traffic.parse(text)
    assert len(traffic.parse("input_tokens,output_tokens\n" + "1,1\n" * 1000)) == 1000
    with pytest.raises(TrafficError, match="larger than 20 MB"):
        traffic.parse(b" " * (traffic.MAX_BYTES + 1))


def test_not_utf8_is_refused():
    with pytest.raises(TrafficError, match="not UTF-8"):
        traffic.parse(b"input_tokens,output_tokens\n\xff\xfe,1\n")


# -- summary --------------------------------------------------------------------------------


def test_stats_of_a_small_sample_by_hand():
    rows = rows_at([0, 1, 3, 6], [10, 20, 30, 40])
    s = traffic.stats(rows)
    # Gaps 1, 2, 3: mean 2, population variance 2/3, CV² = (2/3)/4 = 1/6 → burstiness 6.
    assert s["count"] == 4 and s["span_s"] == 6
    assert s["rate"] == pytest.approx(0.5)
    assert s["cv"] == pytest.approx(math.sqrt(1 / 6))
    assert s["burstiness"] == pytest.approx(6.0)
    # Lengths 10..40: mean 25, p50 between 20 and 30, p95 at rank 2.85 → 30 + 0.85 * 10.
    assert s["input"] == {"mean": 25, "p50": 25, "p95": pytest.approx(38.5), "min": 10, "max": 40}
    assert s["notes"] == []


def test_stats_without_timestamps_says_so():
    s = traffic.stats([TrafficRow(None, 10, 5)])
    assert s["rate"] is None and s["span_s"] is None and not s["has_timestamps"]
    assert "closed loop" in s["notes"][0]


# -- fitting --------------------------------------------------------------------------------


def poisson_rows(n: int, rate: float, seed: int = 7) -> list[TrafficRow]:
    rng = random.Random(seed)
    t, rows = 1_700_000_000.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        rows.append(TrafficRow(t, rng.randint(50, 3000), rng.randint(10, 500), line=i + 1))
    return rows


def test_fit_of_a_poisson_sample_finds_its_rate_and_burstiness_one():
    rows = poisson_rows(20_000, rate=5.0)
    doc = traffic.fit(rows)
    (stage,) = doc["stages"]
    assert stage["request_rate"] == pytest.approx(5.0, rel=0.03)
    assert stage["burstiness"] == pytest.approx(1.0, abs=0.08)
    assert stage["num_requests"] == 20_000 and "concurrency" not in stage
    assert validate(doc) == doc


def test_fit_of_bursty_gamma_gaps_finds_their_shape():
    rng = random.Random(3)
    t, times = 0.0, []
    for _ in range(20_000):
        t += rng.gammavariate(0.25, 1 / (0.25 * 2.0))  # shape 0.25, mean gap 0.5 s
        times.append(t)
    stage = traffic.fit(rows_at(times))["stages"][0]
    assert stage["burstiness"] == pytest.approx(0.25, rel=0.15)
    assert stage["request_rate"] == pytest.approx(2.0, rel=0.05)


def test_burstiness_is_clamped():
    regular = traffic.fit(rows_at([0, 1, 2, 3, 4]))["stages"][0]
    assert regular["burstiness"] == 20.0  # CV 0: perfectly regular
    # One long pause among instant bursts: CV² = 99 → 1/99 → clamped to 0.05.
    bursty = traffic.fit(rows_at([0] * 99 + [100]))["stages"][0]
    assert bursty["burstiness"] == 0.05


def test_a_fixed_size_sample_gives_one_bucket():
    rows = [TrafficRow(float(i), 128, 64) for i in range(50)]
    doc = traffic.fit(rows)
    assert doc["input_len"] == {
        "kind": "empirical",
        "values": [[128, 1.0]],
        "low": 128,
        "high": 128,
    }
    assert doc["output_len"]["values"] == [[64, 1.0]]


def test_empirical_buckets_keep_range_mean_and_sum_to_one():
    rows = poisson_rows(5000, rate=2.0, seed=11)
    dist = traffic.fit(rows)["input_len"]
    values = dist["values"]
    lengths = [r.input_tokens for r in rows]
    assert 2 <= len(values) <= 64
    assert sum(w for _, w in values) == pytest.approx(1.0, abs=1e-4)
    assert dist["low"] == min(lengths) and dist["high"] == max(lengths)
    assert all(min(lengths) <= n <= max(lengths) for n, _ in values)
    mean = sum(n * w for n, w in values)
    assert mean == pytest.approx(sum(lengths) / len(lengths), rel=0.01)


def test_few_distinct_lengths_are_kept_exactly():
    rows = [TrafficRow(None, n, 5) for n in (100, 100, 100, 200)]
    assert traffic.histogram([r.input_tokens for r in rows])["values"] == [[100, 0.75], [200, 0.25]]


def test_no_timestamps_fit_a_closed_loop():
    rows = [TrafficRow(None, 100 + i, 20) for i in range(30)]
    (stage,) = traffic.fit(rows, concurrency=12, num_requests=500)["stages"]
    assert stage == {"name": "traffic", "concurrency": 12, "num_requests": 500}
    same_time = [TrafficRow(5.0, 100, 20) for _ in range(10)]
    assert "concurrency" in traffic.fit(same_time)["stages"][0]


def test_fit_options_and_extra_fields():
    doc = traffic.fit(
        poisson_rows(100, 1.0),
        duration_s=60,
        max_concurrency=32,
        warmup_requests=3,
        slo={"ttft": 500},
    )
    stage = doc["stages"][0]
    assert stage["duration_s"] == 60 and stage["max_concurrency"] == 32
    assert "num_requests" not in stage
    assert doc["warmup_requests"] == 3 and doc["slo"] == {"ttft": 500}


def test_shared_prefix_share_from_prefix_ids():
    ids = ["a", "a", "a", "b", "b", "c", None, None, None, None]
    rows = [TrafficRow(float(i), 500, 50, pid) for i, pid in enumerate(ids)]
    # "a" and "b" are shared (seen twice or more); "c" once is not: 5 of 10 requests share.
    doc = traffic.fit(rows, prefix_len=300)
    assert (doc["prefix_len"], doc["prefix_groups"], doc["prefix_share"]) == (300, 2, 0.5)
    s = traffic.stats(rows)
    assert s["prefix_groups"] == 2 and s["prefix_share"] == 0.5
    assert "prefix length" in " ".join(s["notes"])
    # Without a length (no column, none given) the prefix cannot be simulated.
    assert traffic.fit(rows)["prefix_len"] == 0


def test_prefix_length_column_is_used():
    text = jsonl(
        *[
            {
                "ts": i,
                "input_tokens": 900,
                "output_tokens": 9,
                "prefix_id": "sys",
                "prefix_tokens": 400,
            }
            for i in range(4)
        ]
    )
    doc = traffic.fit(traffic.parse(text))
    assert (doc["prefix_len"], doc["prefix_groups"], doc["prefix_share"]) == (400, 1, 1.0)


# -- replay ---------------------------------------------------------------------------------


def test_replay_document_validates_and_plan_gives_its_span():
    rows = rows_at([100.0, 100.5, 103.0, 110.0], [10, 20, 30, 40])
    doc = traffic.replay(rows, time_scale=0.5)
    assert validate(doc) == doc
    assert doc["replay"] == {
        "rows": [[0.0, 10, 50], [0.5, 20, 50], [3.0, 30, 50], [10.0, 40, 50]],
        "time_scale": 0.5,
    }
    assert plan(doc) == (4, 5.0)  # 10 s of traffic at twice the speed
    assert doc["input_len"]["kind"] == "empirical"  # the warm-up looks like the traffic


def test_replay_numbers_prefix_ids_as_first_seen():
    rows = [
        TrafficRow(0.0, 10, 5, "sys-b"),
        TrafficRow(1.0, 10, 5, None),
        TrafficRow(2.0, 10, 5, "sys-a"),
        TrafficRow(3.0, 10, 5, "sys-b"),
    ]
    doc = traffic.replay(rows, prefix_len=8)
    assert [r[3] for r in doc["replay"]["rows"]] == [0, None, 1, 0]
    assert doc["prefix_len"] == 8


def test_replay_needs_timestamps_and_a_positive_scale():
    with pytest.raises(TrafficError, match="no timestamps"):
        traffic.replay([TrafficRow(None, 10, 5)])
    with pytest.raises(TrafficError, match="time_scale must be > 0"):
        traffic.replay(rows_at([0, 1]), time_scale=0)


def test_columns_round_trip_and_are_checked_again():
    rows = traffic.parse(
        jsonl(
            {"ts": 1000.25, "input_tokens": 10, "output_tokens": 5, "prefix_id": "p"},
            {"ts": 1002.0, "input_tokens": 20, "output_tokens": 6},
        )
    )
    back = traffic.from_columns(json.loads(json.dumps(traffic.to_columns(rows))))
    assert [(r.timestamp, r.input_tokens, r.output_tokens, r.prefix_id) for r in back] == [
        (0.0, 10, 5, "p"),
        (1.75, 20, 6, None),
    ]
    bad = traffic.to_columns(rows)
    bad["in"][1] = 0
    with pytest.raises(TrafficError, match="line 2: input_tokens must be >= 1"):
        traffic.from_columns(bad)
    with pytest.raises(TrafficError, match="not a parsed sample"):
        traffic.from_columns({"t": None})
