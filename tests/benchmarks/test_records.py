"""The compact per-request log and the latency distributions of the CDF charts."""

from __future__ import annotations

import csv
import io
import math
import random
import zlib

import pytest

from benchmarks import records


def record(index, *, sent=1.0, ttft=0.1, gaps=(0.01, 0.01), **kw):
    """A RequestRecord.to_dict()-shaped request: first token ``ttft`` s after ``sent``, one
    chunk per token after it, ``gaps`` apart."""
    first = sent + ttft if ttft is not None else None
    chunks = [] if first is None else [first]
    for gap in gaps if first is not None else ():
        chunks.append(chunks[-1] + gap)
    data = {
        "index": index,
        "stage": "main",
        "warmup": False,
        "input_len": 512,
        "max_tokens": 128,
        "prompt_tokens": 510,
        "output_tokens": len(chunks),
        "token_source": "usage",
        "scheduled": sent - 0.002,
        "sent": sent,
        "first_token": first,
        "end": chunks[-1] if chunks else sent + 0.5,
        "chunk_times": chunks,
        "status": 200,
        "error_class": None,
        "error": "",
        "prefix_id": None,
    }
    data.update(kw)
    return data


def failed(index, **kw):
    data = {
        "ttft": None,
        "status": 503,
        "error_class": "http_5xx",
        "error": "Service Unavailable",
        "output_tokens": 0,
    }
    return record(index, **{**data, **kw})


def test_round_trip_keeps_what_a_csv_needs_and_drops_warmups():
    rows = [
        record(0, sent=1.0, ttft=0.25, gaps=(0.02, 0.04), stage="low", prefix_id=3),
        record(-1, warmup=True),
        failed(7, sent=2.0, stage="peak", prompt_tokens=None),
        record(3, sent=3.0, ttft=0.1, gaps=(), stage="low"),
    ]
    decoded = records.decode(records.encode(rows))
    assert [r["index"] for r in decoded] == [0, 7, 3]  # order kept, warm-up gone
    first, bad, short = decoded
    assert first["stage"] == "low" and first["prefix_id"] == 3
    assert first["sent_s"] == 1.0 and first["scheduled_s"] == pytest.approx(0.998, abs=1e-4)
    assert first["ttft_ms"] == pytest.approx(250.0, abs=1e-3)
    assert first["e2el_ms"] == pytest.approx(310.0, abs=1e-3)  # 0.25 + 0.02 + 0.04
    assert first["itl_mean_ms"] == pytest.approx(30.0, abs=1e-3)
    assert first["itl_max_ms"] == pytest.approx(40.0, abs=1e-3)
    assert first["tpot_ms"] == pytest.approx(30.0, abs=1e-3)  # (0.31 - 0.25) / (3 - 1)
    assert first["output_tokens"] == 3 and first["prompt_tokens"] == 510
    assert first["status"] == 200 and first["error_class"] is None and first["error"] == ""
    assert bad["error_class"] == "http_5xx" and bad["error"] == "Service Unavailable"
    assert bad["status"] == 503 and bad["ttft_ms"] is None and bad["prompt_tokens"] is None
    assert bad["e2el_ms"] == pytest.approx(500.0, abs=1e-3) and bad["stage"] == "peak"
    # One chunk: no gaps, no TPOT.
    assert short["itl_mean_ms"] is None and short["tpot_ms"] is None
    assert records.count(records.encode(rows)) == 3


def test_failures_keep_a_class_and_a_truncated_message():
    rows = [failed(0, error="x" * 500), failed(1, error_class="", error="")]
    bad, anonymous = records.decode(records.encode(rows))
    assert bad["error"] == "x" * 200
    # A failure without a class name is still a failure.
    assert anonymous["error_class"] == "error"


def test_unknown_send_times_stay_unknown_but_latencies_are_kept():
    row = record(0, sent=0.0, ttft=0.2, gaps=(0.05,), relative_times=True)
    (decoded,) = records.decode(records.encode([row]))
    assert decoded["sent_s"] is None and decoded["scheduled_s"] is None
    assert decoded["ttft_ms"] == pytest.approx(200.0, abs=1e-3)
    assert decoded["e2el_ms"] == pytest.approx(250.0, abs=1e-3)


def test_nan_and_null_times_from_json_are_unknown():
    row = record(0, ttft=None, end=None, scheduled=math.nan)
    row["sent"] = None
    (decoded,) = records.decode(records.encode([row]))
    assert decoded["sent_s"] is None and decoded["e2el_ms"] is None
    assert decoded["scheduled_s"] is None


def test_header_names_a_format_version_and_garbage_is_refused():
    blob = records.encode([record(0)])
    assert blob[:4] == b"RQLG" and blob[4] == records.FORMAT_VERSION
    with pytest.raises(records.RecordLogError, match="magic"):
        records.decode(b"nope" + blob[4:])
    with pytest.raises(records.RecordLogError, match="not supported"):
        records.decode(blob[:4] + bytes([99]) + blob[5:])
    with pytest.raises(records.RecordLogError, match="corrupt"):
        records.decode(blob[:5] + zlib.compress(b"\x00"))


def synthetic(n: int, seed: int = 7) -> list[dict]:
    """A realistic-looking open-loop run: Poisson sends, lognormal TTFTs and lengths, three
    stages, 1 % failures, shared prefixes on some requests."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(30)
        sent = t + rng.random() * 0.003
        ttft = rng.lognormvariate(math.log(0.15), 0.6)
        tokens = rng.randint(16, 600)
        itl = rng.lognormvariate(math.log(0.012), 0.2)
        worst = itl * rng.uniform(1, 4)
        first = sent + ttft
        end = first + itl * (tokens - 1)
        chunks = [first, first + worst, end]  # what matters to the log: first, worst, last
        if rng.random() < 0.01:
            out.append(failed(i, sent=sent, stage=rng.choice(["low", "normal", "peak"])))
            continue
        out.append(
            record(
                i,
                sent=sent,
                ttft=ttft,
                gaps=(),
                stage=rng.choice(["low", "normal", "peak"]),
                input_len=rng.randint(64, 8000),
                max_tokens=tokens,
                prompt_tokens=rng.randint(64, 8000),
                output_tokens=tokens,
                first_token=first,
                end=end,
                chunk_times=chunks,
                prefix_id=rng.choice([None, None, 0, 1, 2, 3]),
            )
        )
    return out


def test_a_100k_request_run_stays_under_40_bytes_a_request():
    rows = synthetic(100_000)
    blob = records.encode(rows)
    per_request = len(blob) / len(rows)
    # Measured: ~24 bytes a request (2.4 MB for 100,000), against ~60 raw.
    assert len(blob) < 4_000_000, f"{per_request:.1f} bytes a request"
    assert per_request < 30
    decoded = records.decode(blob)
    assert len(decoded) == 100_000
    assert decoded[-1]["index"] == 99_999
    sample = rows[12345]
    got = decoded[12345]
    if sample["error_class"] is None:
        ttft = (sample["first_token"] - sample["sent"]) * 1000
        assert got["ttft_ms"] == pytest.approx(ttft, rel=1e-5)
        assert got["output_tokens"] == sample["output_tokens"]


def test_quantiles_are_the_hand_computed_ones():
    rows = [
        record(i, sent=float(i), ttft=ms / 1000, gaps=gaps)
        for i, (ms, gaps) in enumerate(
            [(10, (0.001, 0.002)), (20, (0.004,)), (30, ()), (40, ()), (50, ())]
        )
    ]
    dist = records.distributions(rows)
    q = dist["q"]
    assert q == list(records.QUANTILES) and q[0] == 0 and q[-1] == 100
    ttft = dict(zip(q, dist["ttft_ms"], strict=True))
    # Linear interpolation between ranks: p50 = 30, p95 = 40 + 0.8 × 10, p0/p100 the ends.
    assert ttft[0.0] == 10.0 and ttft[100.0] == 50.0
    assert ttft[50.0] == 30.0 and ttft[95.0] == 48.0 and ttft[25.0] == 20.0
    # ITL pools every gap of every request: 1, 2, 4 ms → median 2, p75 = 2 + 0.5 × 2.
    itl = dict(zip(q, dist["itl_ms"], strict=True))
    assert itl[50.0] == 2.0 and itl[75.0] == 3.0 and itl[100.0] == 4.0
    # TPOT only where there are >= 2 tokens: (3 ms / 2) and (4 ms / 1).
    tpot = dict(zip(q, dist["tpot_ms"], strict=True))
    assert tpot[0.0] == 1.5 and tpot[100.0] == 4.0
    assert dist["n"] == {
        "requests": 5,
        "succeeded": 5,
        "ttft": 5,
        "itl": 3,
        "tpot": 2,
        "e2el": 5,
    }


def test_failed_and_warmup_requests_are_not_in_the_distributions():
    rows = [record(0, ttft=0.1), record(1, ttft=0.2)]
    slow_failure = failed(2)
    slow_failure["first_token"] = slow_failure["sent"] + 60.0  # a token, then an error
    warm = record(3, ttft=9.0, warmup=True)
    dist = records.distributions([*rows, slow_failure, warm])
    assert dist["ttft_ms"][-1] == 200.0 and dist["ttft_ms"][0] == 100.0
    assert dist["n"]["requests"] == 3 and dist["n"]["succeeded"] == 2


def test_a_metric_without_values_is_none():
    dist = records.distributions([record(0, gaps=())])  # one token: no ITL, no TPOT
    assert dist["itl_ms"] is None and dist["tpot_ms"] is None
    assert dist["ttft_ms"] is not None
    assert records.distributions([])["ttft_ms"] is None


def test_many_gaps_are_thinned_evenly(monkeypatch):
    monkeypatch.setattr(records, "MAX_POOLED_GAPS", 10)
    rows = [record(i, gaps=[0.001 * (j + 1) for j in range(9)]) for i in range(4)]  # 36 gaps
    dist = records.distributions(rows)
    assert dist["n"]["itl"] == 36 and dist["itl_sampled"] == 9  # every 4th gap
    assert dist["itl_ms"][0] >= 1.0 and dist["itl_ms"][-1] <= 9.0


def test_csv_has_a_header_and_one_row_per_request():
    rows = [record(0, ttft=0.25, gaps=(0.02,)), failed(1, error='quote " and, comma')]
    lines = list(records.csv_lines(records.encode(rows)))
    assert lines[0].strip() == ",".join(records.CSV_FIELDS)
    parsed = list(csv.DictReader(io.StringIO("".join(lines))))
    assert len(parsed) == 2
    assert parsed[0]["ttft_ms"] == "250.0" and parsed[0]["error_class"] == ""
    assert parsed[1]["error"] == 'quote " and, comma' and parsed[1]["ttft_ms"] == ""
    assert records.csv_text(records.encode(rows)) == "".join(lines)
