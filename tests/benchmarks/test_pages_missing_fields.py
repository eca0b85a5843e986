"""Issue 14 item 12: every page that shows a run renders a finished run of each engine kind
and a run whose results are missing, showing "—" for what is not there (SGLang has no
prefix-cache hit rate; an imported or failed run may have no numbers at all).

The run page 500'd on a finished SGLang run: a missing key of ``run.server`` reaches a filter
as ``''`` and ``pct`` did ``float('')``.
"""

from __future__ import annotations

import math

import pytest
from django.urls import get_resolver, reverse

from benchmarks.models import RunPoint
from benchmarks.templatetags import run_format
from changes.models import ChangeRequest
from tests.factories import make_config, make_deployment, make_finished_run, make_host, make_run

pytestmark = pytest.mark.django_db

VLLM_SERVER = {
    "available": True,
    "engine": "vllm",
    "server_mean_queue_ms": 4.2,
    "server_mean_prefill_ms": 80.0,
    "server_mean_decode_ms": 900.0,
    "server_mean_ttft_ms": 110.0,
    "prefix_cache_queries": 120000,
    "prefix_cache_hits": 60000,
    "prefix_cache_hit_rate": 0.5,
    "kv_cache_usage_max": 0.61,
    "preemptions": 0,
    "timeline": [],
}
# What an SGLang engine's /metrics gives: no prefix-cache queries/hits, so no hit rate.
SGLANG_SERVER = {
    "available": True,
    "engine": "sglang",
    "server_mean_ttft_ms": 120.0,
    "kv_cache_usage_max": 0.4,
    "preemptions": 0,
    "timeline": [],
}
STAGES = {"main": {"completed": 600, "failed": 0, "median_ttft_ms": 120.0, "p95_ttft_ms": 300.0}}

# Every column of results a run may lack.
NO_RESULTS = {
    key: None
    for key in (
        "duration_s completed failed error_rate ttft_p50_ms ttft_p95_ms ttft_p99_ms itl_p50_ms "
        "itl_p95_ms itl_p99_ms tpot_p50_ms e2el_p99_ms request_throughput output_tokens_per_s "
        "input_tokens_total output_tokens_total goodput_rps goodput_share hourly_price "
        "cost_per_million_output"
    ).split()
}


def vllm_run():
    deployment = make_deployment(make_host(), engine="vllm")
    return make_finished_run(deployment, server=VLLM_SERVER, stages=STAGES, label="vllm")


def sglang_run():
    deployment = make_deployment(make_host(), engine="sglang")
    return make_finished_run(deployment, server=SGLANG_SERVER, stages=STAGES, label="sglang")


def empty_run():
    """Finished, but its results dicts are empty and every result column is unset."""
    return make_finished_run(
        make_deployment(make_host()),
        server={},
        stages={},
        summary={},
        distributions={},
        currency="",
        **NO_RESULTS,
    )


def sparse_run():
    """Has results (a count), but every other number missing, an engine breakdown that is
    'available' with no keys, a stage without numbers and NaN where a number would be."""
    return make_finished_run(
        make_deployment(make_host(), engine="sglang"),
        server={"available": True},
        stages={"main": {}, "odd": {"median_ttft_ms": "", "p95_ttft_ms": None}},
        summary={"errors_by_class": {"timeout": 3}},
        **{**NO_RESULTS, "completed": 10, "ttft_p95_ms": math.nan},
    )


def failed_run():
    return make_run(
        make_deployment(make_host()), status="failed", error="engine gone", server={}, stages={}
    )


KINDS = {
    "vllm": vllm_run,
    "sglang": sglang_run,
    "empty": empty_run,
    "sparse": sparse_run,
    "failed": failed_run,
}


def _with_points(run):
    RunPoint.objects.create(run=run, t=1.0, data={"t": 1.0, "ttft_p95_ms": None})
    return run


def _change_with(run) -> ChangeRequest:
    """A finished change whose baseline and verification are ``run`` and a full vLLM run."""
    deployment = run.deployment
    config = make_config(deployment)
    other = vllm_run()
    return ChangeRequest.objects.create(
        deployment=deployment,
        title="More sequences",
        base_config=config,
        settings={"max_num_seqs": 128},
        state="applied",
        outcome="applied",
        baseline_run=run,
        verification_run=other,
        comparison={},
    )


# Every page that shows one run, by URL name (and how to reach it for a run).
RUN_PAGES = {
    "benchmarks:detail": lambda run: reverse("benchmarks:detail", args=[run.pk]),
    "benchmarks:part/results": lambda run: reverse("benchmarks:part", args=[run.pk, "results"]),
    "benchmarks:part/facts": lambda run: reverse("benchmarks:part", args=[run.pk, "facts"]),
    "benchmarks:timeline": lambda run: reverse("benchmarks:timeline", args=[run.pk]),
    "benchmarks:export_json": lambda run: reverse("benchmarks:export_json", args=[run.pk]),
    "benchmarks:export_csv": lambda run: reverse("benchmarks:export_csv", args=[run.pk]),
    "benchmarks:list": lambda run: reverse("benchmarks:list"),
    "benchmarks:list/sorted": lambda run: reverse("benchmarks:list") + "?sort=-ttft_p95_ms",
    "benchmarks:compare": lambda run: (
        f"{reverse('benchmarks:compare')}?runs={vllm_run().pk}&runs={run.pk}"
    ),
    "benchmarks:compare/first": lambda run: (
        f"{reverse('benchmarks:compare')}?runs={run.pk}&runs={sglang_run().pk}"
    ),
    "benchmarks:profile": lambda run: reverse("benchmarks:profile", args=[run.load_profile_id]),
    "cost": lambda run: f"{reverse('cost')}?runs={run.pk}",
    "cost/focus": lambda run: f"{reverse('cost')}?runs={run.pk}&focus={run.pk}",
    "dashboard": lambda run: reverse("dashboard"),
    "hosts:detail": lambda run: reverse("hosts:detail", args=[run.deployment.host_id]),
    "changes:detail": lambda run: reverse("changes:detail", args=[_change_with(run).pk]),
    "changes:part/status": lambda run: reverse(
        "changes:part", args=[_change_with(run).pk, "status"]
    ),
    "changes:part/facts": lambda run: reverse("changes:part", args=[_change_with(run).pk, "facts"]),
    "changes:configs": lambda run: reverse("changes:configs", args=[run.deployment_id]),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("page", sorted(RUN_PAGES))
def test_every_page_showing_a_run_renders_each_engine_kind_and_missing_results(
    client, viewer, page, kind
):
    run = _with_points(KINDS[kind]())
    client.force_login(viewer)
    response = client.get(RUN_PAGES[page](run))
    # The request log export of a run without one says so (404), never a 500.
    allowed = {200, 404} if page == "benchmarks:export_csv" else {200}
    assert response.status_code in allowed, response.content[:2000]


def test_the_run_page_shows_a_dash_for_sglangs_missing_prefix_cache_hit_rate(client, viewer):
    run = sglang_run()
    client.force_login(viewer)
    html = client.get(reverse("benchmarks:part", args=[run.pk, "results"])).content.decode()
    row = html.split("Prefix-cache hit rate", 1)[1].split("</tr>", 1)[0]
    assert "—" in row
    vllm = client.get(reverse("benchmarks:part", args=[vllm_run().pk, "results"])).content
    assert "50.0 %" in vllm.decode().split("Prefix-cache hit rate", 1)[1].split("</tr>", 1)[0]


def test_empty_results_show_dashes_not_blanks_or_none(client, viewer):
    run = sparse_run()
    client.force_login(viewer)
    html = client.get(reverse("benchmarks:part", args=[run.pk, "results"])).content.decode()
    assert "None" not in html
    assert "nan" not in html.lower()
    assert "— / — / —" in html  # TTFT p50 / p95 / p99, NaN included


def test_every_url_that_takes_a_run_is_covered():
    """A new page about one run must join RUN_PAGES (so it is tested with each kind)."""
    run_urls = set()
    benchmarks = get_resolver().namespace_dict["benchmarks"][1]
    for pattern in benchmarks.url_patterns:
        route = str(pattern.pattern)
        # Profiles, prices, imports and quality probes have pages of their own objects.
        if "<int:pk>" in route and not route.startswith(
            ("profiles/", "prices/", "import/", "probes/")
        ):
            run_urls.add(f"benchmarks:{pattern.name}")
    covered = {name.split("/")[0] for name in RUN_PAGES}
    # Cancelling is a POST action, not a page.
    assert run_urls - {"benchmarks:cancel"} <= covered


@pytest.mark.parametrize(
    "value", [None, "", "  ", "n/a", math.nan, math.inf, -math.inf, [], {}, object(), True]
)
@pytest.mark.parametrize("name", ["pct", "num", "ms", "money"])
def test_every_number_filter_is_total(name, value):
    assert getattr(run_format, name)(value) == "—"


def test_number_filters_still_format_numbers():
    assert run_format.pct(0.0123) == "1.2 %"
    assert run_format.pct("0.5", 0) == "50 %"
    assert run_format.num(12345.678, 1) == "12,345.7"
    assert run_format.ms(411.6) == "412 ms"
    assert run_format.total(3, 7) == "10"
    assert run_format.total(3, None) == "—"
    assert run_format.num(5, "x") == "5"  # a bad digits argument is not a 500 either
