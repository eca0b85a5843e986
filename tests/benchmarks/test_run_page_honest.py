"""The run page says what happened: a success with failed requests is not a clean success,
failures are grouped by cause, the latencies, durations and config read as people read them,
a simulated host says so, and the ETA follows the plan and the observed rate (issue 21)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse

from benchmarks.loadgen.stats import (
    MAX_CAUSES,
    RequestRecord,
    error_cause,
    errors_by_cause,
    summarize,
)
from benchmarks.services.environment import environment
from benchmarks.services.progress import Progress, estimate
from benchmarks.services.results import status_badge
from benchmarks.templatetags.run_format import duration
from tests.factories import make_config, make_deployment, make_finished_run, make_host

CONTEXT = (
    "This model's maximum context length is 8192 tokens. However, you requested {n} tokens "
    "({p} in the messages, 128 in the completion). Please reduce the length of the messages."
)


def http_400(n: int) -> str:
    body = {"object": "error", "message": CONTEXT.format(n=n, p=n - 128), "code": 400}
    return "HTTP 400: " + json.dumps(body)


def failed(index: int, error_class: str, error: str) -> RequestRecord:
    return RequestRecord(
        index=index,
        stage="m",
        warmup=False,
        input_len=100,
        max_tokens=128,
        scheduled=0.0,
        sent=0.0,
        end=1.0,
        status=400,
        error_class=error_class,
        error=error,
    )


def ok(index: int) -> RequestRecord:
    return RequestRecord(
        index=index,
        stage="m",
        warmup=False,
        input_len=100,
        max_tokens=128,
        scheduled=0.0,
        sent=0.1,
        first_token=0.3,
        chunk_times=[0.3, 0.4],
        end=0.5,
        output_tokens=2,
    )


# --- errors by cause ----------------------------------------------------------------------------


def test_failures_group_by_class_and_message_with_the_numbers_taken_out():
    records = [failed(i, "http_4xx", http_400(9000 + 40 * i)) for i in range(30)]
    records += [failed(100 + i, "timeout", "ReadTimeout: timed out after 30.0 s") for i in range(3)]
    causes = errors_by_cause(records)
    assert [(c["error_class"], c["count"]) for c in causes] == [("http_4xx", 30), ("timeout", 3)]
    context = causes[0]
    # The engine's JSON message, not its envelope; 9000 and 9040 tokens are one cause.
    assert context["cause"].startswith("HTTP N: This model's maximum context length is N tokens.")
    assert "However, you requested N tokens" in context["cause"]
    # One member's message verbatim, numbers and all.
    assert context["example"] == http_400(9000)
    assert causes[1]["cause"] == "ReadTimeout: timed out after N s"


def test_a_cut_json_body_still_gives_its_message_and_a_plain_one_stays_as_it_is():
    cut = http_400(9120)[:120]  # the client keeps 300 bytes of a body: JSON may be cut
    assert error_cause(cut).startswith("HTTP N: This model's maximum context length is N tokens")
    assert error_cause("ConnectError: [Errno 111] Connection refused") == (
        "ConnectError: [Errno N] Connection refused"
    )


def test_many_causes_keep_the_most_common_and_count_the_rest():
    records = [failed(i, "http_5xx", f"HTTP 500: boom {chr(97 + i % 26) * 3}") for i in range(26)]
    records += [failed(99, "http_5xx", "HTTP 500: boom aaa")]
    causes = errors_by_cause(records)
    assert len(causes) == MAX_CAUSES
    assert causes[0]["cause"] == "HTTP N: boom aaa" and causes[0]["count"] == 2
    assert causes[-1]["error_class"] == "other"
    assert sum(c["count"] for c in causes) == 27  # the table's total stays true


def test_the_summary_carries_the_causes_beside_the_classes():
    summary = summarize([ok(0), failed(1, "http_4xx", http_400(9120))])
    assert summary["errors_by_class"] == {"http_4xx": 1}
    assert summary["errors_by_cause"][0]["count"] == 1
    assert summarize([ok(0)])["errors_by_cause"] == []


# --- the badge --------------------------------------------------------------------------------


def with_errors(**kw):
    return make_finished_run(completed=87, failed=33, error_rate=33 / 120, **kw)


@pytest.mark.django_db
def test_a_success_with_failed_requests_says_so_on_the_run_page_and_the_history(client, viewer):
    run = with_errors()
    clean = make_finished_run()
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    badge = re.search(r'<span class="badge (\w+)" data-run-status="succeeded"[^>]*>([^<]*)<', page)
    assert badge.groups() == ("amber", "Succeeded with errors: 27.5 % failed")
    assert 'title="33 of 120 requests failed"' in page

    history = client.get(reverse("benchmarks:list")).content.decode()
    assert "Succeeded with errors: 27.5 % failed" in history
    # A clean run still reads as a clean success, in green.
    assert status_badge(clean).label == "Succeeded" and status_badge(clean).colour == "green"

    # The live page's status (the backfill's reply) says the same.
    reply = client.get(reverse("benchmarks:timeline", args=[run.pk])).json()
    assert (reply["label"], reply["colour"]) == ("Succeeded with errors: 27.5 % failed", "amber")


@pytest.mark.django_db
def test_one_failure_in_ten_thousand_is_not_rounded_away():
    run = make_finished_run(completed=9999, failed=1, error_rate=1e-4)
    assert status_badge(run).label == "Succeeded with errors: 0.01 % failed"
    assert status_badge(run).title == "1 of 10,000 requests failed"
    # A failed run keeps its own badge.
    assert status_badge(make_finished_run(status="failed", failed=5)).label == "Failed"


# --- the results card ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_run_page_shows_errors_by_cause_with_share_and_example(client, viewer):
    records = [ok(i) for i in range(87)] + [
        failed(100 + i, "http_4xx", http_400(9000 + i)) for i in range(33)
    ]
    summary = summarize(records)
    run = with_errors(summary=summary)
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    table = page[page.index('data-testid="error-causes"') :]
    table = table[: table.index("</section>")]
    assert "maximum context length is N tokens" in table
    assert ">33<" in table and "27.5 %" in table
    assert "However, you requested 9000 tokens" in table  # the example, verbatim
    assert "Errors by class" not in page


@pytest.mark.django_db
def test_an_old_run_without_causes_still_shows_its_classes(client, viewer):
    run = with_errors(summary={"errors_by_class": {"http_4xx": 33}})
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    assert page.count("Errors by class") == 1 and "http_4xx" in page
    assert 'data-testid="error-causes"' not in page


@pytest.mark.django_db
def test_the_run_page_shows_every_latency_the_summary_has(client, viewer):
    summary = summarize([ok(i) for i in range(50)])
    summary["mean_ttft_ms"] = 123.4
    summary["p99_9_ttft_ms"] = 987.6
    summary["mean_ttft_from_scheduled_ms"] = 456.7
    summary["p99_client_queue_ms"] = 42.5
    summary["p99_9_e2el_ms"] = 5432.1
    run = make_finished_run(summary=summary)
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    table = page[page.index('data-testid="run-latencies"') :]
    table = table[: table.index("</section>")]
    for label in ("TTFT", "TTFT from the scheduled send", "Client-side queueing", "E2E latency"):
        assert f">{label} <small" in table
    assert '<th class="num">mean</th>' in table and '<th class="num">p99.9</th>' in table
    for value in ("123.4", "987.6", "456.7", "42.5", "5,432.1"):
        assert f">{value}<" in table


@pytest.mark.django_db
def test_durations_read_as_minutes_and_seconds_and_the_config_as_a_table(client, viewer):
    deployment = make_deployment()
    config = make_config(deployment, {"max_num_seqs": 128, "enable_prefix_caching": True})
    run = make_finished_run(deployment, engine_config=config)
    run.finished_at = run.started_at + timedelta(seconds=73.980053)
    run.environment = {"config": {"version": config.version, "settings": config.settings}}
    run.save()
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "took 1 min 14 s" in page and "(1 min 14 s)" in page
    assert "0:01:13" not in page
    assert "<td><code>max_num_seqs</code></td><td><code>128</code></td>" in page
    assert "<td><code>enable_prefix_caching</code></td><td><code>true</code></td>" in page
    assert "{&#x27;" not in page and "{'max_num_seqs'" not in page  # no Python dict


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(seconds=73.980053), "1 min 14 s"),
        (74.0, "1 min 14 s"),
        (120, "2 min"),
        (3 * 3600 + 300, "3 h 5 min"),
        (12.4, "12 s"),
        (2.345, "2.3 s"),
        (0.85, "850 ms"),
        (None, "—"),
        ("", "—"),
    ],
)
def test_the_duration_filter(value, text):
    assert duration(value) == text


# --- reproducibility on a simulated host ---------------------------------------------------------


@pytest.mark.django_db
def test_a_simulated_host_shows_what_the_simulator_reports_not_question_marks(
    client, viewer, monkeypatch
):
    note = "simulated GPUs (2 × NVIDIA H100 80GB HBM3, --simulate); NVML is not available: x"
    host = make_host(telemetry_source="simulator", telemetry_note=note, agent_version="0.9")
    deployment = make_deployment(host, runner="simulator")
    run = make_finished_run(deployment)
    monkeypatch.setattr(
        "benchmarks.services.environment.engine_report", lambda d: {"version": "0.8.5-sim"}
    )

    class Spec:
        def to_dict(self):
            return {}

    run.environment = environment(run, Spec())
    run.save()
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    software = page[page.index('data-testid="run-host-software"') :]
    software = software[: software.index("</dd>")]
    assert "simulated" in software and "2 × NVIDIA H100 80GB HBM3" in software
    assert "?" not in software
    assert "no vLLM, SGLang or torch is installed" in software
    assert "reporting version 0.8.5-sim" in software


# --- ETA -----------------------------------------------------------------------------------------


def test_an_open_loop_run_ends_on_its_schedule_not_on_the_slow_first_completions():
    # 140 requests at 2 req/s: 70 s of schedule. 16 s in, the first seconds returned few.
    tracker = Progress(140, 70.0)
    done = 0
    for t in range(1, 17):
        done += 0 if t < 4 else 2  # nothing finishes before a request's ~3 s latency
        fraction, eta = tracker.update(
            {"t": float(t), "stage": "m", "completed": done, "failed": 0, "in_flight": 6}
        )
    # 54 s of schedule left, then the 6 in flight drain at the 2/s observed: 57 s, not 6 min.
    assert eta == pytest.approx(57.0)
    assert fraction == pytest.approx(16 / 70, abs=1e-4)


def test_the_warm_up_is_not_part_of_the_plan():
    tracker = Progress(None, 60.0)
    for t in range(1, 11):
        assert tracker.update({"t": float(t), "stage": "warmup", "completed": 0}) == (0.0, None)
    # 5 s past a 10-s warm-up: 55 s of the 60-s schedule left, not 45.
    for t in range(11, 16):
        fraction, eta = tracker.update({"t": float(t), "stage": "m", "completed": 0})
    assert (fraction, eta) == (round(5 / 60, 4), 55.0)


def test_a_closed_loop_count_follows_the_recent_rate_not_the_run_long_average():
    # 300 requests at a steady 3/s once the first answers came back (after 6 s).
    tracker = Progress(300, None)
    done = 0
    for t in range(1, 31):
        done += 0 if t <= 6 else 3
        fraction, eta = tracker.update({"t": float(t), "stage": "m", "completed": done})
    assert done == 72
    # (300 - 72) / 3 = 76 s; the run-long average (72 in 30 s) would say 95 s.
    assert eta == pytest.approx(76.0)
    assert fraction == 0.24


def test_no_count_based_eta_before_a_rate_has_been_seen():
    tracker = Progress(300, None)
    assert tracker.update({"t": 1.0, "stage": "m", "completed": 3}) == (0.01, None)
    # A stalled engine: no completions in the window, so no number is made up.
    tracker = Progress(300, None)
    for t in range(1, 21):
        fraction, eta = tracker.update({"t": float(t), "stage": "m", "completed": 10})
    assert eta is None


@pytest.mark.parametrize(
    ("requests", "seconds", "elapsed", "done", "in_flight", "rate", "expected"),
    [
        (None, None, 10.0, 5, 0, 1.0, (0.0, None)),  # nothing planned
        (None, 60.0, 15.0, 0, 0, None, (0.25, 45.0)),  # schedule only, no rate yet
        (None, 60.0, 15.0, 20, 8, 4.0, (0.25, 47.0)),  # + 8 in flight at 4/s drain in 2 s
        (100, None, 10.0, 40, 4, 4.0, (0.4, 15.0)),  # count at the observed rate
        (100, 50.0, 10.0, 90, 4, 10.0, (0.9, 1.0)),  # the count ends it first
        (100, None, 10.0, 100, 0, 0.0, (1.0, 0.0)),  # all done
    ],
)
def test_estimate(requests, seconds, elapsed, done, in_flight, rate, expected):
    assert estimate(requests, seconds, elapsed, done, in_flight, rate) == expected
