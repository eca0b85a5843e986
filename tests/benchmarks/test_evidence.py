"""Whether a run may be evidence (issue 37, finding 3): the one rule, pure and table-driven,
and the health a run's stored results are judged by (a run whose chunks coalesced is
client-limited, never "ITL 0.0 ms" accepted)."""

from __future__ import annotations

import pytest

from benchmarks import evidence
from benchmarks.evidence import (
    CLIENT_LIMITED,
    UNKNOWN,
    USABLE,
    health_from_document,
    judge,
    usable_as_evidence,
)
from benchmarks.loadgen.stats import RequestRecord, chunk_health, summarize


def healthy(**parts) -> dict:
    """The health of a run whose client kept up; ``parts`` replace or extend its parts."""
    health = {
        "loop_lag_ms": {"p50": 0.2, "p99": 1.5, "max": 4.0, "samples": 3000},
        "cpu": {"loop_thread_share": 0.35, "process_share": 0.4, "wall_s": 60.0},
        "sends": {"scheduled": 600, "late": 0, "late_p99_ms": 0.6, "late_max_ms": 2.0},
        "chunks": {
            "token_chunks": 76800,
            "multi_token_chunks": 80,
            "multi_token_chunk_share": 80 / 76800,
        },
        "client": {"ttft_mean_ms": 35.0, "itl_mean_ms": 12.4, "itl_p50_ms": 12.1},
        "engine": {"engine": "vllm", "ttft_mean_ms": 30.0, "itl_mean_ms": 12.0},
        "errors": {"client_error": 0, "measured": 600},
    }
    for name, value in parts.items():
        health[name] = value if value is None else {**health.get(name, {}), **value}
    return {k: v for k, v in health.items() if v is not None}


@pytest.mark.parametrize(
    ("health", "state", "words"),
    [
        (healthy(), USABLE, None),
        # Each tolerance, just over and just within.
        (
            healthy(loop_lag_ms={"p99": 48.0, "max": 210.0}),
            CLIENT_LIMITED,
            "event-loop lag p99 48 ms (max 210 ms) > 20 ms",
        ),
        (healthy(loop_lag_ms={"p99": 19.0}), USABLE, None),
        (
            healthy(cpu={"loop_thread_share": 0.97}),
            CLIENT_LIMITED,
            "event loop used 97% of one core (≥ 90%)",
        ),
        (healthy(cpu={"loop_thread_share": 0.85}), USABLE, None),
        (
            healthy(
                chunks={
                    "token_chunks": 6400,
                    "multi_token_chunks": 4096,
                    "multi_token_chunk_share": 0.64,
                }
            ),
            CLIENT_LIMITED,
            "ITL not measurable: 64% of chunks carried several tokens (4096 of 6400; limit 20%)",
        ),
        (healthy(chunks={"multi_token_chunk_share": 0.19}), USABLE, None),
        (
            healthy(
                sends={"scheduled": 600, "late": 140, "late_p99_ms": 830.0, "late_max_ms": 1200.0}
            ),
            CLIENT_LIMITED,
            "sends fell behind the schedule: 140 of 600 started late, p99 830 ms, up to 1200 ms",
        ),
        (healthy(sends={"late_p99_ms": 40.0}), USABLE, None),
        # The numbers: client TTFT 353 ms against the engine's 30 ms.
        (
            healthy(client={"ttft_mean_ms": 353.0}),
            CLIENT_LIMITED,
            "client TTFT mean 353.0 ms vs the engine's own 30.0 ms (tolerance max(50%, 20 ms))",
        ),
        # Within max(50 %, 20 ms): 30 ms + 20 ms floor.
        (healthy(client={"ttft_mean_ms": 49.0}), USABLE, None),
        # Within 50 % of a slow engine's 400 ms.
        (healthy(client={"ttft_mean_ms": 590.0}, engine={"ttft_mean_ms": 400.0}), USABLE, None),
        (
            healthy(client={"itl_mean_ms": 40.0}),
            CLIENT_LIMITED,
            "client ITL mean 40.0 ms vs the engine's own 12.0 ms",
        ),
        # A client faster than the engine's window is not a client limit.
        (healthy(client={"ttft_mean_ms": 5.0}), USABLE, None),
        (
            healthy(errors={"client_error": 12, "measured": 400}),
            CLIENT_LIMITED,
            "12 of 400 requests failed in the load generator itself (client_error",
        ),
        # Nothing measured: an old or imported run is unknown, not client-limited.
        ({}, UNKNOWN, None),
        ({"client": {"ttft_mean_ms": 353.0}}, UNKNOWN, None),
        (None, UNKNOWN, None),
        # Garbage in a stored health is not a crash.
        ({"loop_lag_ms": "x", "cpu": {"loop_thread_share": "nan"}}, UNKNOWN, None),
    ],
)
def test_the_rule(health, state, words):
    found = judge(health)
    assert found.state == state, found
    assert found.usable is (state != CLIENT_LIMITED)
    if words is None:
        assert found.reasons == () and found.refusal is None
    else:
        assert any(words in reason for reason in found.reasons), found.reasons
        assert found.refusal.startswith("client-limited: ")


def test_several_reasons_are_all_said_and_unchecked_parts_listed():
    found = judge(
        healthy(
            loop_lag_ms={"p99": 30.0},
            chunks={"multi_token_chunk_share": 0.5},
            engine=None,
        )
    )
    assert found.limited and len(found.reasons) == 2
    assert "TTFT against the engine's" in found.unchecked
    assert found.to_dict()["limited"] is True and found.to_dict()["checked"] is True
    usable = judge(healthy(engine=None))
    assert usable.state == USABLE and "not checked: TTFT against the engine's" in usable.summary


def test_unknown_is_allowed_and_flagged_not_checked():
    found = usable_as_evidence(type("OldRun", (), {"client_health": {}})())
    assert found.state == UNKNOWN and found.usable and not found.limited
    assert found.to_dict()["checked"] is False
    assert "not checked" in found.summary


def test_the_tolerances_are_named():
    assert evidence.LOOP_LAG_P99_MS == 20.0
    assert evidence.MULTI_TOKEN_SHARE_MAX == 0.20
    assert evidence.CPU_SHARE_MAX == 0.90
    assert (evidence.TTFT_TOLERANCE_SHARE, evidence.TTFT_TOLERANCE_MS) == (0.5, 20.0)


# --- tokens per chunk, from stored chunk times ----------------------------------------------------
def record(chunk_times, output_tokens=None, source="usage") -> RequestRecord:
    r = RequestRecord(
        index=0,
        stage="s",
        warmup=False,
        input_len=10,
        max_tokens=len(chunk_times),
        scheduled=0.0,
        sent=0.0,
    )
    r.first_token, r.chunk_times = chunk_times[0], list(chunk_times)
    r.end = chunk_times[-1]
    r.output_tokens = len(chunk_times) if output_tokens is None else output_tokens
    r.token_source = source
    return r


def test_chunks_read_together_count_as_one_chunk_of_several_tokens():
    # 8 tokens in 4 reads of 2: every chunk carried several tokens.
    times = [0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4]
    assert chunk_health([record(times)]) == {
        "token_chunks": 4,
        "multi_token_chunks": 4,
        "multi_token_chunk_share": 1.0,
        "coalesced_chunks": 4,
        "coalesced_chunk_share": 1.0,
        "multi_token_events": 0,
        "multi_token_event_share": 0.0,
    }
    # Apart: none did.
    spread = [0.1, 0.11, 0.12, 0.13]
    assert chunk_health([record(spread)])["multi_token_chunk_share"] == 0.0
    # Usage counted more tokens than events came: the engine put several in one event.
    engine = chunk_health([record(spread, output_tokens=8)])
    assert engine["multi_token_chunks"] == engine["multi_token_events"] == 4
    assert engine["coalesced_chunks"] == 0


def test_an_engine_that_streams_several_tokens_an_event_is_not_client_limited():
    """SGLang's --stream-interval 4 (or speculative decoding): four tokens an event, each event
    read on its own. ITL is per event, which the run says; the client kept up."""
    records = [record([i + 0.03 + 0.08 * k for k in range(8)], output_tokens=32) for i in range(20)]
    document = {
        **summarize(records),
        "client_health": {"loop_lag_ms": {"p50": 0.5, "p99": 3.0, "max": 9.0, "samples": 10}},
    }
    found = judge(health_from_document(document))
    assert found.state == USABLE and not found.reasons, found
    assert found.caveats == (
        "ITL is per event, not per token: the engine sent several tokens in up to 100% of its "
        "events (160 of 160), as it streams (e.g. --stream-interval, speculative decoding)",
    )
    assert found.caveats[0] in found.summary and found.to_dict()["caveats"] == list(found.caveats)
    # The same events read two at a time by a busy client: that is the client's.
    paired = [
        record([i + 0.03 + 0.08 * (k // 2) for k in range(8)], output_tokens=32) for i in range(20)
    ]
    limited = judge(
        health_from_document({**summarize(paired), "client_health": document["client_health"]})
    )
    assert limited.limited
    assert any("carried several tokens read at once" in r for r in limited.reasons), limited


def test_a_run_whose_stored_chunks_coalesced_is_client_limited_not_itl_zero():
    """The issue's symptom: ITL p50 0.0 ms because a busy client read chunks in pairs. Today
    that is accepted; now the run is client-limited with the words."""
    records = []
    for i in range(20):
        start = i * 1.0
        times = [start + 0.03 + 0.02 * (k // 2) for k in range(16)]  # pairs share a stamp
        records.append(record(times))
    summary = summarize(records)
    assert summary["median_itl_ms"] == 0.0  # what the run page used to show as measured
    document = {
        **summary,
        "client_health": {"loop_lag_ms": {"p50": 0.5, "p99": 3.0, "max": 9.0, "samples": 10}},
        "server": {"available": True, "engine": "vllm", "server_mean_ttft_ms": 29.0},
    }
    found = judge(health_from_document(document))
    assert found.limited
    assert any(
        r.startswith("ITL not measurable: 100% of chunks carried several tokens read at once")
        for r in found.reasons
    ), found.reasons


def test_health_from_an_imported_document_is_unknown():
    # A `vllm bench serve` file: means and percentiles, no chunk times, no client health.
    document = {"mean_ttft_ms": 80.0, "median_itl_ms": 0.0, "completed": 100, "failed": 0}
    assert judge(health_from_document(document)).state == UNKNOWN


def test_report_mode_judges_and_shows_but_refuses_nothing(monkeypatch):
    run = type("Run", (), {"client_health": healthy(loop_lag_ms={"p99": 48.0})})()
    assert usable_as_evidence(run).limited
    monkeypatch.setenv(evidence.MODE_ENV, "report")
    found = usable_as_evidence(run)
    assert found.usable and not found.limited and found.refusal is None
    assert found.reported and "event-loop lag p99 48 ms" in found.reported[0]
    assert found.to_dict()["reported"] == list(found.reported)


def test_a_time_scaled_simulators_histograms_are_put_in_wall_time():
    """A simulator 20x faster than real time reports its TTFT in its own seconds (20x the wall
    time a client sees): compared as is, the client always looked far faster than the engine
    and the check could never fire. In wall milliseconds, a starved client shows."""
    document = {
        "mean_ttft_ms": 60.0,  # the client: 60 ms of wall time
        "mean_itl_ms": 2.0,
        "server": {
            "available": True,
            "engine": "vllm",
            "server_mean_ttft_ms": 600.0,  # the simulator's 600 simulated ms = 30 wall ms
            "server_mean_itl_ms": 20.0,
        },
    }
    assert judge(health_from_document(document)).state == USABLE  # blind: 60 < 600
    health = health_from_document(document, engine_time_scale=0.05)
    assert health["engine"]["ttft_mean_ms"] == 30.0 and health["engine"]["time_scale"] == 0.05
    found = judge(health)
    assert found.limited
    assert "client TTFT mean 60.0 ms vs the engine's own 30.0 ms" in found.refusal
    # As fast as possible: no wall meaning, not checked (rather than judged on nonsense).
    fastest = judge(health_from_document(document, engine_time_scale=0))
    assert "TTFT against the engine's" in fastest.unchecked and not fastest.limited
    assert health_from_document(document, engine_time_scale=1.0) == health_from_document(document)
