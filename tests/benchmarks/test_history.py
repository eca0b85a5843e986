"""The history list (filters, sorts, pages, constant queries), compare (deltas, warnings, CDFs,
config diff), export (JSON that imports back, CSV of requests) and import (vllm bench serve
files), with the permissions of each page."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from benchmarks import records
from benchmarks.models import BenchmarkRun, RunPoint, RunRequestLog
from benchmarks.services.imports import import_run
from controlpanel.models import AuditEntry
from tests.benchmarks.test_import_streaming import post_import
from tests.benchmarks.test_importers import VLLM_SUMMARY, vllm_detailed
from tests.benchmarks.test_records import failed, record
from tests.factories import (
    make_config,
    make_deployment,
    make_finished_run,
    make_gpu,
    make_host,
    make_profile,
)

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

LIST = reverse("benchmarks:list")
COMPARE = reverse("benchmarks:compare")
IMPORT = reverse("benchmarks:import")


def listed(response) -> list[int]:
    assert response.status_code == 200, response.content[:500]
    return [run.pk for run in response.context["page"].object_list]


def with_log(run, rows):
    RunRequestLog.objects.create(run=run, count=len(rows), data=records.encode(rows))
    return run


def upload(data, name="result.json"):
    handle = io.BytesIO(json.dumps(data).encode())
    handle.name = name
    return handle


# --- permissions ------------------------------------------------------------------------------
def urls(run):
    return {
        "list": LIST,
        "compare": f"{COMPARE}?runs={run.pk}&runs={run.pk + 1}",
        "export_json": reverse("benchmarks:export_json", args=[run.pk]),
        "export_csv": reverse("benchmarks:export_csv", args=[run.pk]),
        "import": IMPORT,
    }


@pytest.fixture
def two_runs():
    first = with_log(make_finished_run(), [record(0)])
    second = make_finished_run(first.deployment, load_profile=first.load_profile)
    assert second.pk == first.pk + 1
    return first, second


@pytest.mark.parametrize("name", ["list", "compare", "export_json", "export_csv", "import"])
def test_anonymous_is_sent_to_log_in(client, two_runs, name):
    response = client.get(urls(two_runs[0])[name])
    assert response.status_code == 302 and reverse("login") in response["Location"]


@pytest.mark.parametrize("name", ["list", "compare", "export_json", "export_csv", "import"])
def test_no_role_is_forbidden(client, nobody, two_runs, name):
    client.force_login(nobody)
    assert client.get(urls(two_runs[0])[name]).status_code == 403


@pytest.mark.parametrize("name", ["list", "compare", "export_json", "export_csv"])
def test_viewer_reads_and_exports(client, viewer, two_runs, name):
    client.force_login(viewer)
    assert client.get(urls(two_runs[0])[name]).status_code == 200


def test_viewer_cannot_import_but_an_operator_can(client, viewer, operator, two_runs):
    client.force_login(viewer)
    assert client.get(IMPORT).status_code == 403
    assert client.post(IMPORT, {"file": upload(VLLM_SUMMARY), "deployment": 1}).status_code == 403
    client.force_login(operator)
    response = client.get(IMPORT)
    assert response.status_code == 200 and b'enctype="multipart/form-data"' in response.content


# --- the list ---------------------------------------------------------------------------------
def test_filters_narrow_the_list(client, viewer, operator):
    h100 = make_deployment()
    sglang = make_deployment(engine="sglang", model="Qwen/Qwen2.5-7B-Instruct")
    v1 = make_config(h100)
    v2 = make_config(h100, {"max_num_seqs": 512})
    chat = make_profile("Chat")
    batch = make_profile("Batch")
    base = make_finished_run(h100, engine_config=v1, load_profile=chat, label="baseline")
    bigger = make_finished_run(
        h100, engine_config=v2, load_profile=chat, label="max-num-seqs 512", requested_by=operator
    )
    other = make_finished_run(
        sglang, load_profile=batch, gpu_model="NVIDIA A100-SXM4-80GB", source="vllm-bench"
    )
    broken = make_finished_run(h100, load_profile=batch, status="failed", label="oops")
    old = make_finished_run(h100, load_profile=chat, label="old")
    BenchmarkRun.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=30))
    client.force_login(viewer)

    def get(**params):
        return set(listed(client.get(LIST, params)))

    assert get() == {base.pk, bigger.pk, other.pk, broken.pk, old.pk}
    assert get(host=sglang.host_id) == {other.pk}
    assert get(gpu="NVIDIA A100-SXM4-80GB") == {other.pk}
    assert get(engine="sglang") == {other.pk}
    assert get(model="Qwen/Qwen2.5-7B-Instruct") == {other.pk}
    assert get(config=2) == {bigger.pk}
    assert get(profile="Batch") == {other.pk, broken.pk}
    assert get(status="failed") == {broken.pk}
    assert get(requested_by=operator.pk) == {bigger.pk}
    assert get(source="vllm-bench") == {other.pk}
    assert get(q="SEQS") == {bigger.pk}
    today = timezone.localdate()
    assert old.pk not in get(date_from=(today - timedelta(days=1)).isoformat())
    assert get(date_to=(today - timedelta(days=29)).isoformat()) == {old.pk}
    assert get(profile="Chat", config=1) == {base.pk}
    # The text boxes suggest what the fleet has.
    page = client.get(LIST).content.decode()
    assert '<datalist id="model-names"><option value="Qwen/Qwen2.5-7B-Instruct">' in page


def test_sorts_by_a_key_number_with_unknowns_last_and_refuses_others(client, viewer):
    deployment = make_deployment()
    fast = make_finished_run(deployment, ttft_p95_ms=100.0, output_tokens_per_s=900.0)
    slow = make_finished_run(deployment, ttft_p95_ms=400.0, output_tokens_per_s=2000.0)
    mid = make_finished_run(deployment, ttft_p95_ms=250.0, output_tokens_per_s=1500.0)
    unknown = make_finished_run(deployment, ttft_p95_ms=None, output_tokens_per_s=None)
    client.force_login(viewer)
    assert listed(client.get(LIST, {"sort": "ttft_p95_ms"})) == [
        fast.pk,
        mid.pk,
        slow.pk,
        unknown.pk,
    ]
    assert listed(client.get(LIST, {"sort": "-ttft_p95_ms"})) == [
        slow.pk,
        mid.pk,
        fast.pk,
        unknown.pk,
    ]
    assert listed(client.get(LIST, {"sort": "-output_tokens_per_s"}))[:3] == [
        slow.pk,
        mid.pk,
        fast.pk,
    ]
    # Newest first by default.
    assert listed(client.get(LIST)) == [unknown.pk, mid.pk, slow.pk, fast.pk]
    # Only whitelisted columns: no sorting on arbitrary fields (or on secrets).
    for bad in ("summary", "-deployment__host__agent_token", "ttft_p95_ms; DROP"):
        response = client.get(LIST, {"sort": bad})
        assert response.status_code == 400
        assert response.context["page"] is None
    # The header links flip the direction of the current sort and keep the filters.
    response = client.get(LIST, {"sort": "ttft_p95_ms", "engine": "vllm"})
    link = response.context["sorts"]["ttft_p95_ms"]
    assert "sort=-ttft_p95_ms" in link["url"] and "engine=vllm" in link["url"]
    assert link["arrow"] == "▲"


def test_pages_of_25_50_or_100(client, viewer):
    deployment = make_deployment()
    profile = make_profile()
    for _ in range(30):
        make_finished_run(deployment, load_profile=profile)
    client.force_login(viewer)
    first = client.get(LIST)
    assert len(listed(first)) == 25 and first.context["page"].paginator.num_pages == 2
    second = client.get(LIST, {"page": 2})
    assert len(listed(second)) == 5
    assert not set(listed(first)) & set(listed(second))
    assert len(listed(client.get(LIST, {"per_page": 50}))) == 30
    assert client.get(LIST, {"per_page": 30}).status_code == 400
    # Beyond the last page: the last page.
    assert listed(client.get(LIST, {"page": 99})) == listed(second)


def _runs(count):
    """``count`` runs over several hosts, configs, profiles and people (N+1 bait)."""
    from django.contrib.auth import get_user_model

    users = [
        get_user_model().objects.create_user(f"user-{count}-{i}", password="x") for i in range(3)
    ]
    deployments = [make_deployment() for _ in range(3)]
    configs = [make_config(d) for d in deployments]
    profiles = [make_profile() for _ in range(3)]
    for i in range(count):
        n = i % 3
        make_finished_run(
            deployments[n],
            engine_config=configs[n],
            load_profile=profiles[(i // 3) % 3],
            requested_by=users[n],
            summary={"mean_ttft_ms": 1.0, "padding": "x" * 5000},
            distributions={"q": list(records.QUANTILES), "ttft_ms": list(range(104))},
        )


def test_the_list_costs_the_same_queries_for_10_or_60_runs_and_reads_no_json(client, viewer):
    client.force_login(viewer)
    _runs(10)
    with CaptureQueriesContext(connection) as ten:
        assert len(listed(client.get(LIST, {"per_page": 100}))) == 10
    _runs(50)
    with CaptureQueriesContext(connection) as sixty:
        assert len(listed(client.get(LIST, {"per_page": 100}))) == 60
    assert len(ten) == len(sixty), [q["sql"][:120] for q in sixty.captured_queries]
    runs_sql = [
        q["sql"] for q in sixty.captured_queries if 'FROM "benchmarks_benchmarkrun"' in q["sql"]
    ]
    page_query = max(runs_sql, key=len)
    for column in ("summary", "distributions", "environment", "server", "stages", "log"):
        assert f'"benchmarks_benchmarkrun"."{column}"' not in page_query
    assert '"hosts_host"."agent_token"' not in page_query


def test_the_list_shows_the_key_numbers_and_links(client, operator):
    run = make_finished_run(
        ttft_p50_ms=111.0,
        ttft_p95_ms=222.0,
        ttft_p99_ms=333.0,
        itl_p95_ms=21.5,
        error_rate=0.02,
        goodput_share=0.95,
        cost_per_million_output=0.543,
        currency="EUR",
        label="tp2",
    )
    client.force_login(operator)
    page = client.get(LIST).content.decode()
    for text in ("111", "222", "333", "21.5", "2.0 %", "95.0 %", "0.543 EUR", "tp2"):
        assert text in page
    assert f'name="runs" value="{run.pk}"' in page and reverse("benchmarks:import") in page


# --- compare ----------------------------------------------------------------------------------
def test_compare_deltas_are_coloured_by_better_and_worse(client, viewer):
    deployment = make_deployment()
    profile = make_profile()
    base = make_finished_run(deployment, load_profile=profile)
    other = make_finished_run(
        deployment,
        load_profile=profile,
        ttft_p95_ms=240.0,  # from 300: 20 % lower, better
        output_tokens_per_s=1000.0,  # from 1280: lower, worse
        itl_p50_ms=12.06,  # from 12: +0.5 %, within noise
        error_rate=0.02,  # from 0: worse
        tpot_p50_ms=None,  # unknown: no delta
    )
    client.force_login(viewer)
    response = client.get(COMPARE, {"runs": [base.pk, other.pk]})
    assert response.status_code == 200
    rows = {row["key"]: row for row in response.context["rows"]}
    ttft = rows["ttft_p95_ms"]["cells"]
    assert ttft[0]["verdict"] == "" and ttft[0]["text"] == "300"
    assert ttft[1]["verdict"] == "better" and ttft[1]["delta"] == "-60 (-20.0 %)"
    tokens = rows["output_tokens_per_s"]["cells"][1]
    assert tokens["verdict"] == "worse" and tokens["delta"] == "-280 (-21.9 %)"
    assert rows["itl_p50_ms"]["cells"][1]["verdict"] == "same"
    errors = rows["error_rate"]["cells"][1]
    assert errors["verdict"] == "worse" and errors["delta"] == "+2.0 pp"
    # The same hourly price over fewer tokens: 2.50 / (1000 × 3600) × 1e6 = 0.694, from 0.543.
    cost = rows["cost_per_million_output"]["cells"][1]
    assert cost["text"] == "0.694" and cost["verdict"] == "worse"
    assert rows["cost_per_million_output"]["unit"] == "USD"
    tpot = rows["tpot_p50_ms"]["cells"][1]
    assert tpot["text"] == "—" and tpot["verdict"] == "" and tpot["delta"] == ""
    assert response.context["warnings"] == []
    html = response.content.decode()
    assert 'class="num better"' in html and 'class="num worse"' in html


def test_compare_warns_about_different_profiles_gpus_and_engines(client, viewer):
    chat = make_profile("Chat")
    chat_v2 = make_profile("Chat", spec={"stages": [{"name": "x", "concurrency": 2}]})
    batch = make_profile("Batch")
    a = make_finished_run(load_profile=chat)
    b = make_finished_run(load_profile=chat_v2)
    c = make_finished_run(load_profile=batch, gpu_model="NVIDIA L40S", engine="sglang")
    client.force_login(viewer)
    versions = client.get(COMPARE, {"runs": [a.pk, b.pk]}).context["warnings"]
    assert len(versions) == 1 and "different versions of the load profile 'Chat'" in versions[0]
    assert "v1, v2" in versions[0]
    mixed = client.get(COMPARE, {"runs": [a.pk, c.pk]}).context["warnings"]
    text = " ".join(mixed)
    assert "different load profiles (Batch v1, Chat v1)" in text
    assert "Different GPU models: NVIDIA H100 80GB HBM3, NVIDIA L40S." in text
    assert "Different engines: sglang, vllm." in text
    page = client.get(COMPARE, {"runs": [a.pk, c.pk]}).content.decode()
    assert page.count('data-testid="compare-warning"') == len(mixed)


def test_compare_refuses_one_or_five_runs_and_unknown_ones(client, viewer):
    runs = [make_finished_run() for _ in range(5)]
    client.force_login(viewer)
    for chosen in ([runs[0].pk], [r.pk for r in runs], [runs[0].pk, runs[0].pk]):
        response = client.get(COMPARE, {"runs": chosen})
        assert response.status_code == 400
        assert "Pick 2 to 4 runs" in response.context["refused"]
    response = client.get(COMPARE, {"runs": [runs[0].pk, 99999]})
    assert response.status_code == 400 and "No run #99999" in response.context["refused"]
    assert client.get(COMPARE, {"runs": ["1", "x"]}).status_code == 400
    # Comma-separated works too; the columns go oldest first whatever the order given.
    response = client.get(COMPARE, {"runs": f"{runs[2].pk},{runs[0].pk}"})
    assert [r.pk for r in response.context["runs"]] == [runs[0].pk, runs[2].pk]


def test_compare_defaults_to_the_oldest_run_as_reference_whatever_the_tick_order(client, viewer):
    """The history lists the newest first; a before/after must not come out inverted."""
    profile = make_profile()
    before = make_finished_run(load_profile=profile, ttft_p95_ms=300.0)
    after = make_finished_run(load_profile=profile, ttft_p95_ms=240.0)
    client.force_login(viewer)
    response = client.get(COMPARE, {"runs": [after.pk, before.pk]})
    assert response.context["reference"] == before
    assert [r.pk for r in response.context["runs"]] == [before.pk, after.pk]
    ttft = {row["key"]: row for row in response.context["rows"]}["ttft_p95_ms"]["cells"]
    assert ttft[0]["delta"] == "" and ttft[1]["delta"] == "-60 (-20.0 %)"
    assert ttft[1]["verdict"] == "better"
    html = response.content.decode()
    assert f'name="ref" value="{before.pk}" form="compare-reference" checked' in html
    assert f'name="ref" value="{after.pk}" form="compare-reference">' in html


def test_compare_against_the_reference_the_url_names(client, viewer):
    profile = make_profile()
    runs = [
        make_finished_run(load_profile=profile, ttft_p95_ms=ttft, label=f"r{ttft:.0f}")
        for ttft in (300.0, 240.0, 360.0)
    ]
    client.force_login(viewer)
    response = client.get(COMPARE, {"runs": [r.pk for r in runs], "ref": runs[1].pk})
    assert response.status_code == 200 and response.context["reference"] == runs[1]
    ttft = {row["key"]: row for row in response.context["rows"]}["ttft_p95_ms"]["cells"]
    assert [c["delta"] for c in ttft] == ["+60 (+25.0 %)", "", "+120 (+50.0 %)"]
    assert [c["verdict"] for c in ttft] == ["worse", "", "worse"]
    html = response.content.decode()
    assert f"deltas against {runs[1].numbered_name} (reference)" in html
    assert f'name="ref" value="{runs[1].pk}" form="compare-reference" checked' in html
    # The form keeps the runs, so choosing another reference keeps the comparison.
    assert html.count('type="hidden" name="runs"') == 3
    refused = client.get(COMPARE, {"runs": [runs[0].pk, runs[1].pk], "ref": runs[2].pk})
    assert (
        refused.status_code == 400
        and "not one of the compared runs" in (refused.context["refused"])
    )


def test_cdf_figures_overlay_each_run_from_its_distributions(client, viewer):
    fast_rows = [record(i, sent=float(i), ttft=0.01 * (i + 1), gaps=(0.002,)) for i in range(5)]
    slow_rows = [record(i, sent=float(i), ttft=0.1 * (i + 1), gaps=(0.02,)) for i in range(5)]
    a = make_finished_run(distributions=records.distributions(fast_rows))
    b = make_finished_run(distributions=records.distributions(slow_rows), label="slow")
    c = make_finished_run(distributions={})  # imported without per-request data
    client.force_login(viewer)
    response = client.get(COMPARE, {"runs": [a.pk, b.pk, c.pk]})
    figure = response.context["figures"]["ttft_cdf"]
    assert [t["name"] for t in figure["data"]] == [f"#{a.pk}", f"#{b.pk} slow"]
    slow = figure["data"][1]
    q = dict(zip(slow["y"], slow["x"], strict=True))
    assert q[0.0] == 100.0 and q[0.5] == 300.0 and q[1.0] == 500.0
    assert len(slow["x"]) == len(records.QUANTILES)
    itl = response.context["figures"]["itl_cdf"]["data"]
    assert itl[0]["x"][0] == 2.0 and itl[1]["x"][-1] == 20.0
    assert b'data-chart="fig-ttft-cdf"' in response.content
    assert b'id="fig-ttft-cdf"' in response.content  # the figure's JSON for charts.js


def test_throughput_latency_and_timeline_figures(client, viewer):
    a = make_finished_run(
        stages={
            "low": {"p95_ttft_ms": 80.0, "output_throughput": 400.0},
            "peak": {"p95_ttft_ms": 600.0, "output_throughput": 1900.0},
        }
    )
    b = make_finished_run()
    for t, ttft in ((1.0, 90.0), (2.0, 110.0)):
        RunPoint.objects.create(
            run=a,
            t=t,
            data={"t": t, "ttft_p95_ms": ttft, "output_tokens_per_s": 10 * t, "ttfts": [[t, 1]]},
        )
    client.force_login(viewer)
    figures = client.get(COMPARE, {"runs": [a.pk, b.pk]}).context["figures"]
    traces = figures["throughput_latency"]["data"]
    stages = traces[0]
    assert stages["x"] == [80.0, 600.0] and stages["y"] == [400.0, 1900.0]
    assert stages["text"] == ["low", "peak"]
    assert [t["x"] for t in traces[1:]] == [[300.0], [300.0]]  # each run's whole-run point
    timeline = figures["timeline_ttft"]["data"]
    assert len(timeline) == 1 and timeline[0]["x"] == [1.0, 2.0]
    assert timeline[0]["y"] == [90.0, 110.0]
    assert figures["timeline_tokens"]["data"][0]["y"] == [10.0, 20.0]


def test_config_diff_shows_what_changed_and_hides_secrets(client, viewer):
    host = make_host()
    make_gpu(host)
    deployment = make_deployment(host)
    v1 = make_config(
        deployment,
        {"max_num_seqs": 256, "enable_prefix_caching": True, "dtype": "bfloat16"},
        env={"HF_TOKEN": "hf_secret_1"},
    )
    v2 = make_config(
        deployment,
        {"max_num_seqs": 512, "enable_prefix_caching": True, "dtype": "bfloat16"},
        env={"HF_TOKEN": "hf_secret_2"},
    )
    v3 = make_config(deployment, {"max_num_seqs": 256, "dtype": "bfloat16"}, env={})
    profile = make_profile()
    runs = [
        make_finished_run(deployment, engine_config=c, load_profile=profile) for c in (v1, v2, v3)
    ]
    client.force_login(viewer)
    response = client.get(COMPARE, {"runs": [r.pk for r in runs]})
    diff = response.context["diff"]
    rows = {row["label"]: row for row in diff["settings"]}
    assert set(rows) == {"max_num_seqs", "enable_prefix_caching", "env.HF_TOKEN"}
    assert [c["text"] for c in rows["max_num_seqs"]["cells"]] == ["256", "512", "256"]
    assert [c["changed"] for c in rows["max_num_seqs"]["cells"]] == [False, True, False]
    assert [c["text"] for c in rows["enable_prefix_caching"]["cells"]] == ["true", "true", "—"]
    assert [c["changed"] for c in rows["env.HF_TOKEN"]["cells"]] == [False, True, True]
    assert diff["same_settings"] == 2  # dtype and the model each version pins
    facts = {row["label"]: row for row in diff["facts"]}
    assert [c["text"] for c in facts["Config version"]["cells"]] == ["v1", "v2", "v3"]
    assert not facts["Load profile"]["changed"] and not facts["GPUs"]["changed"]
    assert diff["changes"] == 3
    assert b"hf_secret" not in response.content
    assert b"change one thing at a time" in response.content


# --- export and import ------------------------------------------------------------------------
def test_export_json_imports_back_as_the_same_run(client, viewer, operator):
    host = make_host()
    make_gpu(host)
    deployment = make_deployment(host)
    config = make_config(deployment, {"max_num_seqs": 128}, env={"VLLM_API_KEY": "sk-hidden"})
    profile = make_profile("Chat")
    rows = [record(i, sent=float(i), ttft=0.1 + 0.01 * i, gaps=(0.01, 0.02)) for i in range(9)]
    rows.append(failed(9))
    run = make_finished_run(
        deployment,
        engine_config=config,
        load_profile=profile,
        label="baseline",
        summary={"mean_ttft_ms": 140.0, "median_ttft_ms": 120.0, "p95_ttft_ms": 300.0},
        stages={"main": {"completed": 600, "p95_ttft_ms": 300.0, "output_throughput": 1280.0}},
        distributions=records.distributions(rows),
        notes=["a note"],
        goodput_share=0.97,
    )
    with_log(run, rows)
    for t in (1.0, 2.0, 3.0):
        RunPoint.objects.create(
            run=run, t=t, data={"t": t, "ttft_p95_ms": 100.0 * t, "ttfts": [[t, 5.0]]}
        )
    client.force_login(viewer)
    response = client.get(reverse("benchmarks:export_json", args=[run.pk]))
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-baseline.json"'
    assert b"sk-hidden" not in response.content
    data = json.loads(response.content)
    # The load generator's shape: header and summary at the top level, then its parts.
    assert data["completed"] == 600 and data["p95_ttft_ms"] == 300.0
    assert data["model_id"] == deployment.model and data["num_prompts"] == 600
    assert [p["t"] for p in data["timeline"]] == [1.0, 2.0, 3.0]
    assert "ttfts" not in data["timeline"][0]
    assert data["spec"]["stages"][0]["concurrency"] == 8  # rebuilt from the profile
    assert data["panel"]["config"]["settings"] == {"max_num_seqs": 128}
    assert data["panel"]["profile"]["name"] == "Chat"

    client.force_login(operator)
    response = post_import(
        client, {"file": upload(data), "deployment": deployment.pk, "engine_config": config.pk}
    )
    copy = BenchmarkRun.objects.exclude(pk=run.pk).get()
    assert (
        response.status_code == 302 and copy.import_job.get_absolute_url() == response["Location"]
    )
    assert copy.source == "loadgen" and copy.status == "succeeded"
    assert copy.label == "baseline" and copy.requested_by == operator
    assert copy.load_profile == profile  # the same load: the same profile version
    assert copy.engine_config == config
    for column in (
        "completed",
        "failed",
        "ttft_p50_ms",
        "ttft_p95_ms",
        "ttft_p99_ms",
        "itl_p95_ms",
        "output_tokens_per_s",
        "goodput_share",
        "error_rate",
    ):
        assert getattr(copy, column) == getattr(run, column), column
    assert copy.distributions == run.distributions
    assert copy.stages == run.stages
    assert list(copy.points.values_list("t", flat=True)) == [1.0, 2.0, 3.0]
    assert "a note" in copy.notes
    assert AuditEntry.objects.filter(action="run.import", object_id=str(copy.pk)).exists()


def test_export_csv_streams_one_row_per_request(client, viewer):
    rows = [record(0, ttft=0.25), failed(1), record(2, warmup=True)]
    run = with_log(make_finished_run(label="csv me"), rows)
    client.force_login(viewer)
    response = client.get(reverse("benchmarks:export_csv", args=[run.pk]))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert (
        "run-" in response["Content-Disposition"]
        and "csv-me-requests.csv" in (response["Content-Disposition"])
    )
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert lines[0] == ",".join(records.CSV_FIELDS)
    assert len(lines) == 3 and ",http_5xx," in lines[2]
    bare = make_finished_run()
    response = client.get(reverse("benchmarks:export_csv", args=[bare.pk]))
    assert response.status_code == 404 and b"No per-request log" in response.content
    assert client.get(reverse("benchmarks:export_csv", args=[99999])).status_code == 404


def test_importing_a_vllm_bench_file_sets_the_columns(client, operator):
    host = make_host()
    make_gpu(host, name="NVIDIA H200")
    deployment = make_deployment(host)  # serves Llama; the file measured Qwen
    client.force_login(operator)
    response = post_import(
        client, {"file": upload(vllm_detailed()), "deployment": deployment.pk, "label": ""}
    )
    run = BenchmarkRun.objects.get()
    assert response.status_code == 302 and response["Location"] == run.import_job.get_absolute_url()
    assert run.get_absolute_url() in client.get(response["Location"]).content.decode()
    assert run.source == "vllm-bench" and run.load_profile is None
    assert run.label == "tp2-bench" and run.model_name == "Qwen/Qwen2.5-7B-Instruct"
    assert run.gpu_model == "NVIDIA H200" and run.gpu_count == 1
    assert run.completed == 4 and run.failed == 1 and run.error_rate == pytest.approx(0.2)
    assert run.ttft_p50_ms == 250.0  # the file's median
    assert run.ttft_p95_ms == pytest.approx(385.0)  # computed from its lists
    assert run.ttft_p99_ms == 397.0
    assert run.output_tokens_per_s == pytest.approx(10 / 3)
    assert run.created_at.isoformat().startswith("2025-06-12T15:00:00")
    assert run.distributions["n"]["succeeded"] == 4
    assert RunRequestLog.objects.get(run=run).count == 5
    assert any("the file measured Qwen/Qwen2.5-7B-Instruct" in n for n in run.notes)
    assert any("no per-second timeline" in n for n in run.notes)
    assert run.cost_per_million_output is not None  # the host's price
    entry = AuditEntry.objects.get(action="run.import")
    assert entry.object_id == str(run.pk) and entry.after["source"] == "vllm-bench"
    # It then sits in the history with its source.
    page = client.get(LIST, {"source": "vllm-bench"})
    assert listed(page) == [run.pk]


def test_import_errors_are_shown_on_the_form(client, operator):
    deployment = make_deployment()
    elsewhere = make_config(make_deployment())
    client.force_login(operator)
    not_an_object = io.BytesIO(b"not json")
    not_an_object.name = "x.json"
    response = client.post(IMPORT, {"file": not_an_object, "deployment": deployment.pk})
    assert response.status_code == 400 and "not a JSON result" in response.content.decode()
    response = client.post(
        IMPORT,
        {"file": upload(VLLM_SUMMARY), "deployment": deployment.pk, "engine_config": elsewhere.pk},
    )
    assert response.status_code == 400 and "is a config of" in response.content.decode()
    # What only reading the whole file tells is said on the job's page.
    bad_json = io.BytesIO(b"{not json")
    bad_json.name = "x.json"
    for file, message in ((bad_json, "not valid JSON"), (upload({"a": 1}), "not a result")):
        response = post_import(client, {"file": file, "deployment": deployment.pk})
        page = client.get(response["Location"]).content.decode()
        assert "Failed" in page and message in page
    assert not BenchmarkRun.objects.exists()


def test_import_service_refuses_a_config_of_another_deployment_and_links_no_new_profile():
    deployment = make_deployment()
    with pytest.raises(ValueError, match="another deployment"):
        import_run(None, deployment, dict(VLLM_SUMMARY), make_config(make_deployment()))
    profiles = set(BenchmarkRun.objects.values_list("load_profile", flat=True))
    run = import_run(None, deployment, dict(VLLM_SUMMARY), label="from a laptop")
    assert run.label == "from a laptop" and run.requested_by is None
    assert run.ttft_p95_ms is None and run.ttft_p99_ms == 480.0  # not in the file: unknown
    assert run.distributions == {} and not RunRequestLog.objects.filter(run=run).exists()
    assert set(BenchmarkRun.objects.values_list("load_profile", flat=True)) - profiles == {None}


def test_gpu_filter_finds_runs_on_hosts_with_mixed_gpus(client, viewer):
    h100 = "NVIDIA H100 80GB HBM3"
    a100, a100_80 = "NVIDIA A100", "NVIDIA A100-SXM4-80GB"
    only_h100 = make_finished_run(gpu_model=h100)
    mixed = make_finished_run(gpu_model=f"{a100}, {h100}")  # sorted names, as runs record them
    three = make_finished_run(gpu_model=f"{a100}, {h100}, NVIDIA L40S")
    only_a100_80 = make_finished_run(gpu_model=a100_80)
    a100_80_and_l4 = make_finished_run(gpu_model=f"{a100_80}, NVIDIA L4")
    client.force_login(viewer)

    def get(gpu):
        return set(listed(client.get(LIST, {"gpu": gpu})))

    assert get(h100) == {only_h100.pk, mixed.pk, three.pk}
    assert get(h100.lower()) == {only_h100.pk, mixed.pk, three.pk}
    # A name is a whole item of the list, never the start of a longer one.
    assert get(a100) == {mixed.pk, three.pk}
    assert get(a100_80) == {only_a100_80.pk, a100_80_and_l4.pk}
    assert get("NVIDIA L4") == {a100_80_and_l4.pk}
    assert get("NVIDIA L40S") == {three.pk}
    assert get("H100") == set()
    # The whole recorded value still finds its run, as before.
    assert mixed.pk in get(f"{a100}, {h100}")
