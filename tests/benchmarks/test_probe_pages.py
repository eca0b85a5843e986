"""The quality probe pages: who may see and do what, uploads refused line by line, starting a
probe, a run's page in every state, comparisons made row by row, the quality chart.

``make_probe_set`` and ``make_probe_run`` build sets and finished runs row by row (no engine):
the API tests and the schema walk use them too."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.urls import reverse
from django.utils import timezone

from benchmarks.models_quality import ProbeResult, ProbeRun, ProbeSet
from benchmarks.quality import ItemResult, parse_jsonl
from benchmarks.services.probes import summarize
from tests.factories import make_config, make_deployment, make_finished_run

pytestmark = pytest.mark.django_db


def item(item_id: str, category: str = "factual", language: str = "en", expected="Paris"):
    return {
        "id": item_id,
        "category": category,
        "language": language,
        "messages": [{"role": "user", "content": f"Question {item_id}?"}],
        "answer": {"scorer": "exact", "expected": expected},
        "reference": expected,
    }


def json_item(item_id: str) -> dict:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    return {
        "id": item_id,
        "category": "json",
        "language": "en",
        "messages": [{"role": "user", "content": 'Reply {"a": 1}'}],
        "answer": {"scorer": "json", "schema": schema, "fields": {"a": 1}},
        "reference": '{"a": 1}',
    }


def default_items() -> list[dict]:
    """20 factual items in English, 20 in Korean, 4 JSON items."""
    rows = [item(f"en-{i}") for i in range(20)]
    rows += [item(f"ko-{i}", language="ko", expected="서울") for i in range(20)]
    rows += [json_item(f"json-{i}") for i in range(4)]
    return rows


def make_probe_set(name: str = "panel-core", rows: list[dict] | None = None) -> ProbeSet:
    rows = rows or default_items()
    coverage: dict[str, int] = {}
    for row in rows:
        key = f"{row['category']}/{row['language']}"
        coverage[key] = coverage.get(key, 0) + 1
    return ProbeSet.objects.create_next(
        name, rows, source="builtin", item_count=len(rows), coverage=coverage
    )


def make_probe_run(deployment, probe_set, wrong=(), status="succeeded", **kw) -> ProbeRun:
    """A run whose answers are right except the ids in ``wrong``, stored row by row with its
    summary (as the worker would); ``status`` other than succeeded stores no answers."""
    now = timezone.now()
    run = ProbeRun.objects.create(
        deployment=deployment,
        probe_set=probe_set,
        status=status,
        total=probe_set.item_count,
        started_at=now if status != "queued" else None,
        finished_at=now if status in ("succeeded", "failed", "cancelled") else None,
        **kw,
    )
    if status != "succeeded":
        return run
    items = parse_jsonl("\n".join(json.dumps(r) for r in probe_set.items)).items
    results = []
    for it in items:
        ok = it.id not in wrong
        is_json = it.answer.scorer == "json"
        results.append(
            ItemResult(
                id=it.id,
                answer=(it.reference if ok else "wrong answer") or "",
                correct=ok,
                json_valid=ok if is_json else None,
                schema_ok=ok if is_json else None,
                latency_ms=12.0,
            )
        )
    ProbeResult.objects.bulk_create(
        ProbeResult(
            run=run,
            item_id=r.id,
            category=it.category,
            language=it.language,
            answer=r.answer,
            correct=r.correct,
            json_valid=r.json_valid,
            schema_ok=r.schema_ok,
            latency_ms=r.latency_ms,
        )
        for r, it in zip(results, items, strict=True)
    )
    run.summary = summarize(items, results)
    run.done, run.duration_s = len(results), 12.5
    run.save(update_fields=["summary", "done", "duration_s"])
    return run


@pytest.fixture
def deployment():
    return make_deployment()


@pytest.fixture
def probe_set():
    return make_probe_set()


# --- permissions -------------------------------------------------------------------------------
def _urls(deployment, probe_set):
    run = make_probe_run(deployment, probe_set)
    other = make_probe_run(deployment, probe_set)
    reads = [
        reverse("benchmarks:probe_sets"),
        reverse("benchmarks:probe_set", args=[probe_set.pk]),
        reverse("benchmarks:probe_run", args=[run.pk]),
        reverse("benchmarks:probe_run_part", args=[run.pk]),
        reverse("benchmarks:probe_compare", args=[run.pk, other.pk]),
        reverse("benchmarks:quality") + f"?deployment={deployment.pk}",
    ]
    acts = [reverse("benchmarks:probe_new"), reverse("benchmarks:probe_set_upload")]
    return run, reads, acts


def test_anonymous_goes_to_login(client, deployment, probe_set):
    run, reads, acts = _urls(deployment, probe_set)
    for url in [*reads, *acts]:
        response = client.get(url)
        assert response.status_code == 302 and reverse("login") in response["Location"], url
    response = client.post(reverse("benchmarks:probe_cancel", args=[run.pk]))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_viewer_reads_but_does_not_act(client, viewer, deployment, probe_set):
    run, reads, acts = _urls(deployment, probe_set)
    client.force_login(viewer)
    for url in reads:
        assert client.get(url).status_code == 200, url
    for url in acts:
        assert client.get(url).status_code == 403, url
        assert client.post(url, {}).status_code == 403, url
    queued = make_probe_run(make_deployment(), probe_set, status="queued")
    assert client.post(reverse("benchmarks:probe_cancel", args=[queued.pk])).status_code == 403
    queued.refresh_from_db()
    assert queued.status == "queued"
    page = client.get(reverse("benchmarks:probe_run", args=[queued.pk])).content.decode()
    assert "Cancel probe" not in page


def test_nobody_is_refused(client, nobody, deployment, probe_set):
    _, reads, acts = _urls(deployment, probe_set)
    client.force_login(nobody)
    for url in [*reads, *acts]:
        assert client.get(url).status_code == 403, url


def test_operator_cancels_a_queued_probe(client, operator, probe_set):
    queued = make_probe_run(make_deployment(), probe_set, status="queued")
    client.force_login(operator)
    response = client.post(reverse("benchmarks:probe_cancel", args=[queued.pk]))
    assert response.status_code == 302
    queued.refresh_from_db()
    assert queued.status == "cancelled"
    # A finished one: refused with a message, not an error page.
    response = client.post(reverse("benchmarks:probe_cancel", args=[queued.pk]), follow=True)
    assert response.status_code == 200 and "nothing to cancel" in response.content.decode()


def test_cancel_needs_post_and_csrf(operator, probe_set):
    from django.test import Client

    queued = make_probe_run(make_deployment(), probe_set, status="queued")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    url = reverse("benchmarks:probe_cancel", args=[queued.pk])
    assert strict.get(url).status_code == 405
    assert strict.post(url).status_code == 403
    queued.refresh_from_db()
    assert queued.status == "queued"


# --- probe sets --------------------------------------------------------------------------------
BAD = (
    json.dumps(item("ok-1"))
    + "\n{not json\n"
    + json.dumps({**item("ok-2"), "answer": {"scorer": "telepathy"}})
    + "\n"
)


def test_upload_with_bad_lines_lists_each_and_stores_nothing(client, operator):
    client.force_login(operator)
    response = client.post(reverse("benchmarks:probe_set_upload"), {"name": "mine", "jsonl": BAD})
    assert response.status_code == 200
    page = response.content.decode()
    assert 'data-line="2"' in page and 'data-line="3"' in page
    assert 'data-line="1"' not in page
    assert "telepathy" in page
    assert not ProbeSet.objects.filter(name="mine").exists()


def test_good_upload_makes_the_next_version(client, operator):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.force_login(operator)
    make_probe_set("mine", [item("a-1")])
    lines = "\n".join(json.dumps(item(f"b-{i}", language="ko", expected="서울")) for i in range(3))
    upload = SimpleUploadedFile("set.jsonl", lines.encode(), content_type="application/x-ndjson")
    response = client.post(
        reverse("benchmarks:probe_set_upload"),
        {"name": "mine", "description": "Korean", "file": upload},
    )
    newest = ProbeSet.objects.get(name="mine", version=2)
    assert response.status_code == 302 and response["Location"] == newest.get_absolute_url()
    assert newest.item_count == 3 and newest.coverage == {"factual/ko": 3}
    assert ProbeSet.objects.filter(name="mine").count() == 2


def test_a_fresh_install_lists_the_built_in_sets(client, viewer, settings):
    client.force_login(viewer)
    page = client.get(reverse("benchmarks:probe_sets")).content.decode()
    assert f'data-set="{settings.QUALITY_PROBE_SET}"' in page
    assert ProbeSet.objects.filter(source="builtin").exists()


def test_empty_upload_is_a_form_error(client, operator):
    client.force_login(operator)
    response = client.post(reverse("benchmarks:probe_set_upload"), {"name": "x"})
    assert response.status_code == 200 and "Choose a JSONL file" in response.content.decode()


def test_set_page_filters_items_and_downloads_jsonl(client, viewer, probe_set):
    client.force_login(viewer)
    url = reverse("benchmarks:probe_set", args=[probe_set.pk])
    page = client.get(url, {"language": "ko"}).content.decode()
    assert 'data-item="ko-0"' in page and 'data-item="en-0"' not in page
    assert 'data-testid="coverage"' in page
    page = client.get(url, {"category": "json"}).content.decode()
    assert 'data-item="json-0"' in page and 'data-item="ko-0"' not in page
    download = client.get(url, {"download": "jsonl"})
    assert download["Content-Disposition"].endswith('.jsonl"')
    lines = download.content.decode().splitlines()
    assert len(lines) == probe_set.item_count and json.loads(lines[20])["id"] == "ko-0"
    assert client.get(url, {"page": "x'"}).status_code == 200


# --- starting and watching a probe -------------------------------------------------------------
def test_start_probe_queues_the_task(
    client, operator, deployment, probe_set, django_capture_on_commit_callbacks
):
    client.force_login(operator)
    body = {
        "deployment": deployment.pk,
        "probe_set": probe_set.pk,
        "structured_output": "on",
        "concurrency": 4,
        "label": "before awq",
    }
    with mock.patch("benchmarks.tasks.run_probe.apply_async") as apply_async:
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(reverse("benchmarks:probe_new"), body)
    run = ProbeRun.objects.get()
    assert response.status_code == 302 and response["Location"] == run.get_absolute_url()
    assert run.structured_output and run.concurrency == 4 and run.label == "before awq"
    assert run.status == "queued" and run.total == probe_set.item_count
    apply_async.assert_called_once()
    assert apply_async.call_args.args[0] == (run.pk,)


def test_start_probe_on_a_busy_deployment_says_why(client, operator, deployment, probe_set):
    make_probe_run(deployment, probe_set, status="running")
    client.force_login(operator)
    with mock.patch("benchmarks.tasks.run_probe.apply_async") as apply_async:
        response = client.post(
            reverse("benchmarks:probe_new"),
            {"deployment": deployment.pk, "probe_set": probe_set.pk, "concurrency": 8},
        )
    assert response.status_code == 200
    assert 'data-testid="probe-refused"' in response.content.decode()
    apply_async.assert_not_called()
    assert ProbeRun.objects.count() == 1


def test_bad_concurrency_is_a_field_error(client, operator, deployment, probe_set):
    client.force_login(operator)
    response = client.post(
        reverse("benchmarks:probe_new"),
        {"deployment": deployment.pk, "probe_set": probe_set.pk, "concurrency": 1000},
    )
    assert response.status_code == 200 and not ProbeRun.objects.exists()


@pytest.mark.parametrize("status", ["queued", "running"])
def test_run_page_while_it_runs_is_live(client, viewer, deployment, probe_set, status):
    run = make_probe_run(deployment, probe_set, status=status, simulated=True)
    ProbeRun.objects.filter(pk=run.pk).update(done=11)
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    assert f'data-live-socket="/ws/probes/{run.pk}/"' in page
    assert f'data-probe-status="{status}"' in page
    assert 'data-testid="simulated-badge"' in page
    assert "11 of 44 answered" in page and 'aria-valuenow="25"' in page
    part = client.get(reverse("benchmarks:probe_run_part", args=[run.pk])).content.decode()
    assert "11 of 44 answered" in part and "<html" not in part


def test_run_page_when_done_shows_accuracy_json_and_answers(client, viewer, deployment, probe_set):
    run = make_probe_run(deployment, probe_set, wrong={"ko-1", "ko-2", "json-0"}, simulated=True)
    client.force_login(viewer)
    page = client.get(run.get_absolute_url()).content.decode()
    assert "data-live-socket" not in page
    assert 'data-testid="simulated-badge"' in page
    assert 'data-testid="accuracy-table"' in page
    assert "90.0 %" in page  # Korean factual: 18 of 20
    assert 'data-testid="json-rates"' in page and "75.0 %" in page
    assert page.count("data-item=") == 44
    wrong = client.get(run.get_absolute_url(), {"wrong": "1"}).content.decode()
    assert wrong.count("data-item=") == 3 and 'data-item="ko-1"' in wrong
    real = make_probe_run(make_deployment(), probe_set)
    assert (
        'data-testid="simulated-badge"' not in client.get(real.get_absolute_url()).content.decode()
    )


def test_missing_run_is_404(client, viewer):
    client.force_login(viewer)
    assert client.get(reverse("benchmarks:probe_run", args=[999999])).status_code == 404


# --- comparing ---------------------------------------------------------------------------------
def test_compare_shows_a_loss_on_one_group(client, viewer, deployment, probe_set):
    before = make_probe_run(deployment, probe_set)
    after = make_probe_run(deployment, probe_set, wrong={f"ko-{i}" for i in range(10)})
    client.force_login(viewer)
    response = client.get(reverse("benchmarks:probe_compare", args=[before.pk, after.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert 'data-group="language:ko"' in page
    ko = page.split('data-group="language:ko"')[1].split("</tr>")[0]
    assert 'data-verdict="loss"' in ko
    en = page.split('data-group="language:en"')[1].split("</tr>")[0]
    assert 'data-verdict="loss"' not in en
    assert page.count('<tr data-item="ko-') == 10  # the changed items, side by side


def test_compare_refuses_different_set_versions(client, viewer, deployment, probe_set):
    newer = make_probe_set(probe_set.name)
    a, b = make_probe_run(deployment, probe_set), make_probe_run(deployment, newer)
    client.force_login(viewer)
    response = client.get(reverse("benchmarks:probe_compare", args=[a.pk, b.pk]))
    assert response.status_code == 400
    assert "only runs of the same set version compare" in response.content.decode()


def test_compare_bad_max_loss_is_400(client, viewer, deployment, probe_set):
    a, b = make_probe_run(deployment, probe_set), make_probe_run(deployment, probe_set)
    client.force_login(viewer)
    url = reverse("benchmarks:probe_compare", args=[a.pk, b.pk])
    assert client.get(url, {"max_loss": "nan"}).status_code == 400
    assert client.get(url, {"max_loss": "0.05"}).status_code == 200


# --- quality against throughput ----------------------------------------------------------------
def test_quality_chart_with_one_config_measured_both_ways(client, viewer, deployment, probe_set):
    v1 = make_config(deployment, {"max_num_seqs": 128})
    v2 = make_config(deployment, {"max_num_seqs": 256})
    make_finished_run(deployment, engine_config=v1, output_tokens_per_s=2100.0)
    make_probe_run(deployment, probe_set, engine_config=v1, wrong={"en-1"}, simulated=True)
    make_finished_run(deployment, engine_config=v2)  # no probe: listed, not plotted
    client.force_login(viewer)
    page = client.get(reverse("benchmarks:quality"), {"deployment": deployment.pk})
    assert page.status_code == 200
    figure = page.context["figure"]
    (trace,) = figure["data"]
    assert trace["x"] == [2100.0] and trace["text"] == ["v1"]
    assert "simulated" in trace["hovertext"][0] and "probe #" in trace["hovertext"][0]
    html = page.content.decode()
    assert 'data-testid="quality-chart"' in html and 'data-config="2"' in html


def test_quality_page_without_or_with_a_bad_deployment(client, viewer, deployment):
    client.force_login(viewer)
    url = reverse("benchmarks:quality")
    assert client.get(url).status_code == 200
    assert client.get(url, {"deployment": "abc"}).status_code == 200
    assert client.get(url, {"deployment": "987654"}).status_code == 404
    page = client.get(url, {"deployment": deployment.pk}).content.decode()
    assert 'data-testid="quality-empty"' in page


def test_probe_pages_are_linked_from_the_benchmarks_list(client, viewer):
    client.force_login(viewer)
    page = client.get(reverse("benchmarks:list")).content.decode()
    assert reverse("benchmarks:probe_sets") in page


# --- a change's quality probe ------------------------------------------------------------------
def test_change_page_links_both_probes_and_shows_the_verdicts(
    client, viewer, deployment, probe_set
):
    from benchmarks.services.probes import compare_runs
    from changes.models import ChangeRequest

    before = make_probe_run(deployment, probe_set, simulated=True)
    after = make_probe_run(deployment, probe_set, wrong={f"ko-{i}" for i in range(10)})
    change = ChangeRequest.objects.create(
        deployment=deployment,
        title="AWQ",
        rationale="Half the memory.",
        state="failed",
        settings={"quantization": "awq"},
        probe_set=probe_set,
        quality_baseline=before,
        quality_run=after,
        quality_comparison=compare_runs(before, after),
    )
    client.force_login(viewer)
    page = client.get(change.get_absolute_url()).content.decode()
    assert 'data-testid="change-quality"' in page
    assert reverse("benchmarks:probe_run", args=[before.pk]) in page
    assert reverse("benchmarks:probe_compare", args=[before.pk, after.pk]) in page
    assert 'data-group="language:ko"' in page and 'data-verdict="loss"' in page
    assert 'data-testid="simulated-badge"' in page


def test_proposal_preview_says_the_probe_will_run(probe_set):
    from django.template.loader import render_to_string

    quality = {
        "why": ["quantization changes what the model answers"],
        "set": probe_set.pk,
        "set_name": str(probe_set),
        "items": 44,
        "estimate_s": 300.0,
        "estimate_basis": "a guess: this deployment was never probed",
    }
    facts = {"diff": {}, "warnings": [], "prediction": None, "quality": quality}
    html = render_to_string("changes/_preview.html", {"facts": facts, "problems": []})
    assert f'A quality probe (<a href="{probe_set.get_absolute_url()}">{probe_set}</a>' in html
    assert "44 items) runs before and after the apply: about 5 min each" in html
    assert "never probed" in html and "quantization changes" in html
    without = render_to_string("changes/_preview.html", {"facts": {**facts, "quality": {}}})
    assert "quality-facts" not in without


# --- the live socket ---------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_probe_socket_streams_progress_to_readers_only(viewer, nobody):
    import asyncio

    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import AnonymousUser

    from benchmarks.services.probes import publish_probe
    from home.routing import websocket_urlpatterns

    run = make_probe_run(make_deployment(), make_probe_set(), status="running")
    app = URLRouter(websocket_urlpatterns)
    path = f"/ws/probes/{run.pk}/"

    async def connect(user):
        communicator = WebsocketCommunicator(app, path)
        communicator.scope["user"] = user
        connected, code = await communicator.connect()
        return communicator, connected, code

    async def scenario():
        for user in (AnonymousUser(), nobody):
            communicator, connected, code = await connect(user)
            assert not connected and code == 4403
            await communicator.disconnect()
        watcher, connected, _ = await connect(viewer)
        assert connected
        run.done = 7
        await asyncio.get_running_loop().run_in_executor(None, publish_probe, run)
        event = await watcher.receive_json_from(timeout=5)
        assert event["event"] == "probe.updated"
        assert event["data"]["id"] == run.pk and event["data"]["done"] == 7
        await watcher.disconnect()

    asyncio.run(scenario())
