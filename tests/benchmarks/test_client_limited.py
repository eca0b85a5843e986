"""Client-limited runs (issue 37, finding 3) in the benchmarks app: stored results carry the
client's health, the run page and the API say client-limited with the reasons and numbers, and
the benchmarks-side consumers (baseline choice, the CI gate, the cost ranking) refuse such a
run in words. Client-side protocol errors read as the load generator's, not the engine's."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from benchmarks import cost, cost_ranking, gate
from benchmarks.evidence import usable_as_evidence
from benchmarks.loadgen.stats import RequestRecord, summarize
from benchmarks.services.results import error_threshold_problem, store_results
from tests.benchmarks.test_gate import TOKEN, FakePanel, run_gate
from tests.factories import make_deployment, make_finished_run, make_host, make_run

# A starved client: the loop lagged and chunks came in pairs (ITL p50 0.0 ms).
LIMITED = {
    "loop_lag_ms": {"p50": 6.0, "p99": 48.0, "max": 210.0, "samples": 2900},
    "cpu": {"loop_thread_share": 0.62, "process_share": 1.4, "wall_s": 60.0},
    "chunks": {"token_chunks": 6400, "multi_token_chunks": 4096, "multi_token_chunk_share": 0.64},
    "client": {"ttft_mean_ms": 353.0, "itl_mean_ms": 12.0, "itl_p50_ms": 0.0},
    "engine": {"engine": "vllm", "ttft_mean_ms": 30.0, "itl_mean_ms": 11.5},
}
HEALTHY = {
    "loop_lag_ms": {"p50": 0.2, "p99": 1.1, "max": 3.0, "samples": 2900},
    "chunks": {"token_chunks": 6400, "multi_token_chunks": 3, "multi_token_chunk_share": 0.0005},
    "client": {"ttft_mean_ms": 34.0, "itl_mean_ms": 12.0},
    "engine": {"engine": "vllm", "ttft_mean_ms": 30.0, "itl_mean_ms": 11.5},
}


def record(index: int, times: list[float]) -> RequestRecord:
    r = RequestRecord(index, "main", False, 8, len(times), float(index), sent=float(index))
    r.first_token, r.chunk_times, r.end = times[0], list(times), times[-1]
    r.output_tokens, r.token_source = len(times), "usage"
    return r


@pytest.mark.django_db
def test_stored_results_whose_chunks_coalesced_make_a_client_limited_run():
    """ITL p50 0.0 ms from chunks read in pairs is refused, not accepted as a measurement."""
    records = [record(i, [i + 0.03 + 0.02 * (k // 2) for k in range(16)]) for i in range(20)]
    document = {
        **summarize(records),
        "server": {"available": True, "engine": "vllm", "server_mean_ttft_ms": 30.0},
        "client_health": {"loop_lag_ms": {"p50": 1.0, "p99": 4.0, "max": 9.0, "samples": 50}},
    }
    run = make_run(status="succeeded")
    store_results(run, document)
    run.refresh_from_db()
    assert run.itl_p50_ms == 0.0
    found = usable_as_evidence(run)
    assert found.limited
    assert "ITL not measurable: 100% of chunks carried several tokens" in found.refusal
    assert run.client_health["loop_lag_ms"]["p99"] == 4.0  # the client's own health is kept
    # The one rule every verdict uses refuses it as a baseline, with the words.
    problem = error_threshold_problem(run)
    assert problem.startswith(f"{run.numbered_name} is client-limited: ITL not measurable")


@pytest.mark.django_db
def test_a_run_recorded_before_is_unknown_and_still_usable():
    run = make_finished_run()
    assert run.client_health == {}
    assert usable_as_evidence(run).state == "unknown"
    assert error_threshold_problem(run) is None


@pytest.mark.django_db
def test_the_run_page_says_client_limited_with_the_numbers(client, viewer):
    run = make_finished_run(client_health=LIMITED, itl_p50_ms=0.0)
    client.force_login(viewer)
    page = client.get(reverse("benchmarks:detail", args=[run.pk])).content.decode()
    assert 'data-testid="client-limited"' in page
    assert "Client-limited run: not evidence." in page
    assert "event-loop lag p99 48 ms (max 210 ms) &gt; 20 ms" in page
    assert "ITL not measurable: 64% of chunks carried several tokens" in page
    assert "client TTFT mean 353.0 ms vs the engine&#x27;s own 30.0 ms" in page
    fine = make_finished_run(client_health=HEALTHY)
    page = client.get(reverse("benchmarks:detail", args=[fine.pk])).content.decode()
    assert 'data-testid="client-limited"' not in page
    old = make_finished_run()
    page = client.get(reverse("benchmarks:detail", args=[old.pk])).content.decode()
    assert 'data-testid="client-health-unknown"' in page


@pytest.mark.django_db
def test_a_client_error_cause_is_not_worded_as_the_engines_answer(client, viewer):
    cause = {
        "error_class": "client_error",
        "cause": "RemoteProtocolError: malformed HTTP response: Invalid character in chunk size",
        "count": 3,
        "example": "RemoteProtocolError: malformed HTTP response: Invalid character in chunk size",
    }
    run = make_finished_run(failed=3, error_rate=3 / 603, summary={"errors_by_cause": [cause]})
    client.force_login(viewer)
    page = client.get(reverse("benchmarks:detail", args=[run.pk])).content.decode()
    assert 'data-testid="client-error-cause"' in page
    assert "the load generator's own failure, not the engine's answer" in page


# --- the CI gate ----------------------------------------------------------------------------
@pytest.fixture
def fake():
    return FakePanel()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def test_the_gate_refuses_a_client_limited_new_run_in_words(fake, token_file):
    fake.final = "succeeded"
    original = fake._run

    def limited(pk, status, **kw):
        row = original(pk, status, **kw)
        if pk == 7:
            row["client_limited"] = {
                "limited": True,
                "reasons": ["event-loop lag p99 48 ms (max 210 ms) > 20 ms"],
            }
        return row

    fake._run = limited
    code, out, err = run_gate(fake, token_file, "--allow-inconclusive")
    assert code == gate.EXIT_COULD_NOT_RUN, out + err
    assert "run 7 is client-limited: event-loop lag p99 48 ms" in err
    assert "verified" not in out


def test_the_gate_skips_a_client_limited_baseline_and_refuses_one_named(fake, token_file):
    fake.runs[5]["client_limited"] = {"limited": True, "reasons": ["ITL not measurable"]}
    fake.runs[4] = fake._run(4, "succeeded", deployment=1, profile=11)
    code, out, err = run_gate(fake, token_file)
    assert code == 0, out + err
    assert "baseline run 4" in err
    code, out, err = run_gate(fake, token_file, "--baseline", "5")
    assert code == gate.EXIT_COULD_NOT_RUN
    assert "baseline run 5 is client-limited: ITL not measurable" in err
    fresh = FakePanel()
    fresh.runs[5]["client_limited"] = {"limited": True, "reasons": ["ITL not measurable"]}
    code, out, err = run_gate(fresh, token_file)
    assert code == gate.EXIT_COULD_NOT_RUN
    assert "no usable baseline: the newest succeeded run 5 is client-limited" in err


# --- the cost ranking -------------------------------------------------------------------------
def test_the_cost_ranking_refuses_a_client_limited_run_in_words():
    def option(key, refused=None):
        run_cost = cost.RunCost(hourly_price=2.0, currency="USD", requests_per_s=10.0)
        return cost_ranking.Option(key, run_cost, 100.0, key, refused=refused)

    cheap = option("cheap", refused="client-limited: event-loop lag p99 48 ms > 20 ms")
    honest = option("honest")
    ranking = cost_ranking.rank([cheap, honest], currency="USD")
    assert ranking.cheapest.key == "honest"
    assert ranking.status(cheap) == "not ranked: client-limited: event-loop lag p99 48 ms > 20 ms"


@pytest.mark.django_db
def test_the_cost_page_does_not_rank_a_client_limited_run(client, viewer):
    host = make_host(hourly_price=Decimal("2.00"))
    limited = make_finished_run(make_deployment(host), client_health=LIMITED)
    fine = make_finished_run(make_deployment(host), client_health=HEALTHY)
    client.force_login(viewer)
    page = client.get(reverse("cost"), {"runs": [limited.pk, fine.pk]})
    assert page.status_code == 200
    report = page.context["report"]
    assert report.ranking.cheapest.key.startswith(f"{fine.pk}-")
    assert "not ranked: client-limited: event-loop lag p99 48 ms" in page.content.decode()


@pytest.mark.django_db
def test_a_run_on_a_time_scaled_simulator_is_checked_against_its_engine_in_wall_time():
    from tests.factories import make_sim_deployment

    document = {
        **summarize([record(i, [i + 0.06 + 0.002 * k for k in range(16)]) for i in range(20)]),
        "server": {"available": True, "engine": "vllm", "server_mean_ttft_ms": 600.0},
        "client_health": {"loop_lag_ms": {"p50": 1.0, "p99": 4.0, "max": 9.0, "samples": 50}},
    }
    fast = make_sim_deployment(
        make_host(), simulator={"gpu": "h100-sxm", "startup_seconds": 0.3, "time_scale": 0.05}
    )
    run = make_run(fast, status="succeeded")
    store_results(run, document)
    run.refresh_from_db()
    engine = run.client_health["engine"]
    assert (engine["ttft_mean_ms"], engine["time_scale"]) == (30.0, 0.05)
    assert "vs the engine's own 30.0 ms" in usable_as_evidence(run).refusal
    # The same numbers from a real engine (or a simulator at real time): taken as they are.
    plain = make_run(make_deployment(), status="succeeded")
    store_results(plain, document)
    plain.refresh_from_db()
    assert plain.client_health["engine"]["ttft_mean_ms"] == 600.0
    assert usable_as_evidence(plain).usable
