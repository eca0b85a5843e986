"""The rules on how the deployment was measured (changes/advisor/rules_runs.py), each both
ways."""

from __future__ import annotations

from dataclasses import replace

import pytest

from changes.advisor.findings import CRITICAL, INFO, WARNING
from tests.changes.advisor import builders as b
from tests.changes.advisor.builders import none, one


# --- errors-behind-speed -----------------------------------------------------------------------
def faster(failed=50, base_failed=0, base_in_snapshot=True):
    done = 1000 - failed
    new = b.run(
        13,
        completed=done,
        failed=failed,
        error_rate=failed / 1000,
        errors_by_class={"TIMEOUT": failed},
        faster_than=12,
        output_tokens_per_s=3600.0,
    )
    base = b.run(
        12, config_current=False, completed=1000 - base_failed, failed=base_failed, error_rate=None
    )
    runs = (new, base) if base_in_snapshot else (new,)
    return replace(b.healthy(), runs=runs)


def test_errors_behind_speed():
    f = one(faster(), "errors-behind-speed")
    assert f.severity == CRITICAL and not f.suggestion.settings
    assert "Run 13, reported faster than run 12, failed 50 of 1,000 requests (5 %)" in f.seen
    assert "against 0 % in run 12" in f.seen and "TIMEOUT 50" in f.seen
    assert f.evidence["compared_error_rate"] == 0.0


def test_errors_behind_speed_without_the_compared_run():
    f = one(faster(failed=20, base_in_snapshot=False), "errors-behind-speed")
    assert "(2 %)" in f.seen and f.evidence["compared_error_rate"] is None


def test_high_error_rate_of_the_running_config():
    s = b.with_run(b.healthy(), completed=940, failed=60, error_rate=0.06)
    f = one(s, "errors-behind-speed")
    assert f.severity == CRITICAL and "failed 60 of 1,000 requests (6 %)" in f.seen


@pytest.mark.parametrize(
    "s",
    [
        faster(failed=15, base_failed=10),  # +0.5 point: under ERROR_RATE_RISE
        faster(failed=9, base_in_snapshot=False),  # 0.9 %
        b.with_run(b.healthy(), completed=951, failed=49, error_rate=0.049),
        b.with_run(b.healthy(), completed=0, failed=0, error_rate=None),  # nothing to rate
    ],
)
def test_errors_behind_speed_near_misses_and_missing(s):
    assert none(s, "errors-behind-speed")


# --- warmup-included ---------------------------------------------------------------------------
def test_warmup_included_info():
    f = one(b.with_run(b.healthy(), warmup_requests=0), "warmup-included")
    assert f.severity == INFO
    assert "Run 12 (chat v3) sent no warm-up requests" in f.seen
    assert "warmup_requests: 10" in f.suggestion.action  # max(10, 2 × concurrency 1)


def test_warmup_included_warning_when_the_first_stage_shows_it():
    stages = (b.stage("low", 16, ttft_p50_ms=100.0, ttft_p99_ms=600.0), *b.STAGES[1:])
    f = one(b.with_run(b.healthy(), warmup_requests=0, stages=stages), "warmup-included")
    assert f.severity == WARNING
    assert "TTFT p99 600 ms, 6.0× its p50 of 100 ms" in f.seen
    assert "warmup_requests: 32" in f.suggestion.action  # 2 × concurrency 16


def test_warmup_included_near_misses_and_missing():
    assert none(b.healthy(), "warmup-included")  # 20 warm-up requests
    assert none(replace(b.healthy(), runs=()), "warmup-included")
    assert none(b.with_run(b.healthy(), warmup_requests=0, completed=0), "warmup-included")


# --- profile-unlike-traffic --------------------------------------------------------------------
def unlike(**traffic):
    s = b.healthy()
    return replace(s, traffic=replace(s.traffic, **traffic))


def test_profile_unlike_traffic():
    f = one(unlike(input_p50=4000.0), "profile-unlike-traffic")
    assert f.severity == WARNING
    assert "prompt p50 1,000 tokens in the run vs 4,000 tokens in the traffic" in f.seen
    assert "Run 12 (chat v3)" in f.seen and "prompt p50 4,000 tokens" in f.suggestion.action


def test_profile_unlike_traffic_prefix_share():
    f = one(unlike(shared_prefix_share=0.7), "profile-unlike-traffic")
    assert "shared-prefix share 30 % in the run vs 70 % in the traffic" in f.seen


@pytest.mark.parametrize(
    "s",
    [
        unlike(input_p50=1990.0, output_p99=301.0),  # under 2× either way
        unlike(shared_prefix_share=0.59),
        replace(b.healthy(), traffic=None),
        b.with_run(b.healthy(), lengths=None),
    ],
)
def test_profile_unlike_traffic_near_misses_and_missing(s):
    assert none(s, "profile-unlike-traffic")


# --- client-limited-run (issue 37, finding 3) --------------------------------------------------
def test_client_limited_run_is_said_not_silently_dropped():
    why = "client-limited: event-loop lag p99 48 ms (max 210 ms) > 20 ms"
    s = replace(b.healthy(), refused_runs=((13, why), (11, "client-limited: ITL not measurable")))
    f = one(s, "client-limited-run")
    assert f.severity == INFO
    assert f.title == "Run 13 not used as evidence (and 1 more)"
    assert f"Run 13 is {why}" in f.seen and "Run 11 is client-limited" in f.seen
    assert f.evidence == {"runs": [13, 11]}


def test_client_limited_run_quiet_without_refused_runs():
    assert none(b.healthy(), "client-limited-run")
