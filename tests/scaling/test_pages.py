"""The scaling pages: a deployment's page (no samples, samples, capacity evidence), the
policy form, the fleet view (counts, filter, sort, query bound) and the charts' JSON."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from benchmarks.models import RunPoint
from controlpanel.models import AuditEntry
from hosts.choices import DeploymentStatus
from scaling.models import EngineSample, ScalingPolicy
from scaling.planning.types import Signals, Window
from tests.factories import make_config, make_deployment, make_finished_run, make_profile

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def running(**kw):
    kw.setdefault("model", MODEL)
    deployment = make_deployment(status=DeploymentStatus.RUNNING, **kw)
    deployment.active_config = make_config(deployment)
    deployment.save(update_fields=["active_config"])
    return deployment


def signals(waiting=3.0, ttft_1m=0.42, kv=0.5, arrival=4.0, at=None) -> dict:
    return Signals(
        at=at or timezone.now().timestamp(),
        engine="vllm",
        requests_waiting=waiting,
        requests_running=8.0,
        pending_prompt_tokens=waiting * 512,
        pending_basis="3 waiting x 512 tokens, the mean prompt of the last 5 minutes",
        kv_cache_usage_ratio=kv,
        preemptions_per_s=0.0,
        output_tokens_per_s=1234.0,
        finished_rps=arrival,
        arrival_rps=arrival,
        ttft={"1m": Window(60, 100, 0.2, ttft_1m), "5m": Window(300, 500, 0.2, 0.3)},
        itl={"1m": Window(60, 100, 0.01, 0.02)},
    ).as_dict()


def sample(deployment, seconds_ago=0.0, **kw) -> EngineSample:
    at = timezone.now() - timedelta(seconds=seconds_ago)
    return EngineSample.objects.create(
        deployment=deployment, time=at, signals=signals(at=at.timestamp(), **kw)
    )


def staged_run(deployment):
    """A finished run of a rate-staged profile on the running config: 2 req/s meets a
    500 ms SLO, 6 req/s breaks it with 12 waiting."""
    profile = make_profile(
        spec={
            "stages": [
                {"name": "low", "request_rate": 2, "num_requests": 60},
                {"name": "high", "request_rate": 6, "num_requests": 60},
            ],
            "input_len": {"kind": "fixed", "mean": 512},
            "output_len": {"kind": "fixed", "mean": 64},
        }
    )
    stage = dict(completed=60, error_rate=0.0, total_input_tokens=60 * 512)
    run = make_finished_run(
        deployment,
        load_profile=profile,
        engine_config=deployment.active_config,
        stages={
            "low": {**stage, "request_throughput": 2.0, "p95_ttft_ms": 180.0, "p95_itl_ms": 15},
            "high": {**stage, "request_throughput": 4.5, "p95_ttft_ms": 1900.0, "p95_itl_ms": 30},
        },
    )
    for t, stage_name, waiting, kv in ((1, "low", 0, 0.2), (2, "high", 12, 0.8)):
        RunPoint.objects.create(
            run=run,
            t=t,
            data={"stage": stage_name, "server_waiting": waiting, "kv_cache_usage": kv},
        )
    return run


def page(client, user, deployment):
    client.force_login(user)
    return client.get(reverse("scaling:deployment", args=[deployment.pk]))


# --- the deployment page ------------------------------------------------------------------------
def test_page_without_samples_or_evidence_shows_the_way_forward(client, operator):
    deployment = running()
    response = page(client, operator, deployment)
    assert response.status_code == 200
    html = response.content.decode()
    assert "No signals yet" in html
    assert 'data-status="no_evidence"' in html
    assert reverse("benchmarks:new") + f"?deployment={deployment.pk}" in html
    assert reverse("changes:sweep_new") + f"?deployment={deployment.pk}" in html
    assert 'data-status="unknown"' in html  # desired replicas cannot be judged
    for kind in ("keda.yaml", "alerts.yaml", "grafana.json"):
        assert reverse("scaling:export", args=[deployment.pk, kind]) in html
    assert reverse("scaling:whatif_new", args=[deployment.pk]) in html
    assert f"/ws/hosts/{deployment.host_id}/" in html
    assert "job_name: llm-control-panel" in html


def test_page_with_samples_embeds_the_charts_and_the_signals_now(client, viewer):
    deployment = running()
    for ago in (30, 20, 10, 1):
        sample(deployment, ago, waiting=ago / 10)
    response = page(client, viewer, deployment)
    assert response.status_code == 200
    charts = response.context["charts"]
    keys = [c["key"] for c in charts]
    assert keys == ["queue", "pending", "kv", "ttft", "itl", "output", "preemptions"]
    queue = charts[0]["figure"]["data"]
    assert queue[0]["y"] == [3.0, 2.0, 1.0, 0.1]  # waiting, oldest first
    assert queue[0]["meta"] == {"path": "requests_waiting", "scale": 1.0}
    ttft = charts[3]["figure"]
    assert ttft["data"][0]["y"][-1] == pytest.approx(420.0)  # seconds drawn as ms
    assert ttft["layout"]["shapes"][0]["y0"] == 500.0  # the SLO line
    html = response.content.decode()
    assert "the mean prompt of the last 5 minutes" in html  # the pending-tokens basis
    assert "420 ms" in html
    assert 'id="scaling-charts"' in html
    # A viewer sees the policy but gets no form.
    assert 'data-testid="policy-form"' not in html


def test_page_with_capacity_evidence_links_the_run(client, viewer):
    deployment = running()
    run = staged_run(deployment)
    sample(deployment, 1, arrival=5.0, waiting=10)
    html = page(client, viewer, deployment).content.decode()
    assert 'data-status="measured"' in html
    assert reverse("benchmarks:detail", args=[run.pk]) in html
    assert "stage “low”" in html and "stage “high”" in html
    # Thresholds come from the run and name the series a scaler compares them with.
    assert "llmpanel_deployment_requests_waiting" in html
    assert f"#{run.pk}" in html


def test_unknown_deployment_is_404_and_anonymous_is_sent_to_log_in(client, viewer):
    deployment = running()
    assert client.get(reverse("scaling:deployment", args=[deployment.pk])).status_code == 302
    client.force_login(viewer)
    assert client.get(reverse("scaling:deployment", args=[999999])).status_code == 404
    assert client.get(reverse("scaling:signals_json", args=[999999])).status_code == 404


def test_a_user_without_a_role_is_refused(client, nobody):
    deployment = running()
    assert page(client, nobody, deployment).status_code == 403
    assert client.get(reverse("scaling:fleet")).status_code == 403


def test_navigation_and_the_host_page_lead_to_scaling(client, viewer):
    deployment = running()
    client.force_login(viewer)
    html = client.get(reverse("hosts:detail", args=[deployment.host_id])).content.decode()
    assert reverse("scaling:deployment", args=[deployment.pk]) in html
    nav = client.get(reverse("scaling:fleet")).context["nav"]
    assert {"label": "Scaling", "url": reverse("scaling:fleet"), "active": True} in nav


# --- the policy form ----------------------------------------------------------------------------
POLICY = {
    "slo_ttft_p95_ms": "800",
    "slo_itl_p95_ms": "",
    "max_error_rate": "0.02",
    "load_profile": "",
    "min_replicas": "2",
    "max_replicas": "6",
    "target": "0.7",
    "stabilisation_s": "600",
    "cooldown_s": "120",
    "polling_interval_s": "10",
}


def test_operator_saves_the_policy_and_it_is_audited(client, operator):
    deployment = running()
    client.force_login(operator)
    url = reverse("scaling:policy", args=[deployment.pk])
    response = client.post(url, POLICY)
    assert response.status_code == 302
    policy = ScalingPolicy.objects.get(deployment=deployment)
    assert (policy.slo_ttft_p95_ms, policy.min_replicas, policy.max_replicas) == (800, 2, 6)
    assert policy.updated_by == operator
    entry = AuditEntry.objects.get(action="scaling.policy.create")
    assert entry.actor == operator and entry.after["slo_ttft_p95_ms"] == 800
    # A second save audits what changed; the page shows the new SLO.
    client.post(url, {**POLICY, "slo_ttft_p95_ms": "300"})
    update = AuditEntry.objects.get(action="scaling.policy.update")
    assert (update.before["slo_ttft_p95_ms"], update.after["slo_ttft_p95_ms"]) == (800, 300)
    assert ScalingPolicy.objects.count() == 1
    html = client.get(reverse("scaling:deployment", args=[deployment.pk])).content.decode()
    assert "p95 TTFT ≤ 300 ms" in html


def test_invalid_policy_rerenders_with_errors(client, operator):
    deployment = running()
    client.force_login(operator)
    url = reverse("scaling:policy", args=[deployment.pk])
    response = client.post(url, {**POLICY, "min_replicas": "9", "max_replicas": "3"})
    assert response.status_code == 200
    assert "Must be at least the minimum." in response.content.decode()
    response = client.post(url, {**POLICY, "target": "7", "slo_ttft_p95_ms": "abc"})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "target" in errors and "slo_ttft_p95_ms" in errors
    assert not ScalingPolicy.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="scaling.policy").exists()


def test_viewer_may_not_change_the_policy(client, viewer):
    deployment = running()
    client.force_login(viewer)
    response = client.post(reverse("scaling:policy", args=[deployment.pk]), POLICY)
    assert response.status_code == 403
    assert not ScalingPolicy.objects.exists()
    assert client.get(reverse("scaling:policy", args=[deployment.pk])).status_code == 405


def test_operator_sees_the_policy_form(client, operator):
    html = page(client, operator, running()).content.decode()
    assert 'data-testid="policy-form"' in html


# --- the fleet view ------------------------------------------------------------------------------
def test_fleet_counts_filters_and_sorts(client, viewer):
    busy = running(name="busy")
    staged_run(busy)
    sample(busy, 1, arrival=30.0, waiting=40, ttft_1m=2.0)  # far above one replica: under
    idle = running(name="idle", model="other/model")
    sample(idle, 1)  # no capacity evidence: unknown
    client.force_login(viewer)
    response = client.get(reverse("scaling:fleet"))
    assert response.status_code == 200
    counts = response.context["counts"]
    assert counts["under"] == 1 and counts["unknown"] == 1
    rows = response.context["rows"]
    assert [r["id"] for r in rows] == [busy.pk, idle.pk]  # worst first
    assert rows[0]["desired"] > rows[0]["current"] == 1
    assert rows[0]["ttft_ms"] == pytest.approx(2000.0)
    html = response.content.decode()
    assert 'data-testid="count-under">1<' in html
    assert reverse("scaling:deployment", args=[busy.pk]) in html
    only = client.get(reverse("scaling:fleet"), {"status": "unknown"}).context["rows"]
    assert [r["id"] for r in only] == [idle.pk]
    by_name = client.get(reverse("scaling:fleet"), {"sort": "name", "status": "nonsense"})
    assert [r["id"] for r in by_name.context["rows"]] == [busy.pk, idle.pk]
    assert by_name.context["status"] == ""


@pytest.mark.parametrize("count", [1, 10])
def test_fleet_query_count_does_not_grow_with_the_fleet(
    client, viewer, django_assert_max_num_queries, count
):
    for n in range(count):
        deployment = running(name=f"d{n}")
        staged_run(deployment)
        sample(deployment, 1)
    client.force_login(viewer)
    client.get(reverse("scaling:fleet"))  # sessions, permissions and the like warmed
    with django_assert_max_num_queries(20):
        response = client.get(reverse("scaling:fleet"))
    assert len(response.context["rows"]) == count


# --- signals_json --------------------------------------------------------------------------------
def test_signals_json_serves_the_chart_columns_since(client, viewer):
    deployment = running()
    old = sample(deployment, 20 * 60)  # beyond the 15 minutes shown
    first = sample(deployment, 30, waiting=1)
    sample(deployment, 5, waiting=2)
    client.force_login(viewer)
    url = reverse("scaling:signals_json", args=[deployment.pk])
    data = client.get(url).json()
    assert data["deployment"] == deployment.pk
    assert data["values"]["requests_waiting"] == [1.0, 2.0]
    assert data["values"]["ttft.1m.p95"] == [420.0, 420.0]
    assert int(old.time.timestamp() * 1000) not in data["t"]
    since = int(first.time.timestamp() * 1000)
    assert client.get(url, {"since": since}).json()["values"]["requests_waiting"] == [2.0]
    assert client.get(url, {"since": "yesterday"}).status_code == 400
    client.logout()
    assert client.get(url).status_code == 302


# --- live: the host's socket carries the signals the page draws -------------------------------
@pytest.mark.django_db(transaction=True)
def test_deployment_signals_reach_the_hosts_socket(viewer):
    """The poller publishes ``deployment.signals`` on the host's group; the host consumer
    forwards it (the scaling page listens on that socket) instead of failing on an event it
    has no handler for."""
    import asyncio

    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator

    from controlpanel.realtime import group_name, publish
    from home.routing import websocket_urlpatterns

    deployment = running()
    event = {"id": deployment.pk, "t": 1_700_000_000_000, "signals": signals()}

    async def scenario():
        comm = WebsocketCommunicator(
            URLRouter(websocket_urlpatterns), f"/ws/hosts/{deployment.host_id}/"
        )
        comm.scope["user"] = viewer
        connected, _ = await comm.connect()
        assert connected
        await asyncio.get_running_loop().run_in_executor(
            None, publish, group_name("host", deployment.host_id), "deployment.signals", event
        )
        message = await comm.receive_json_from(timeout=5)
        assert message["event"] == "deployment.signals"
        assert message["data"]["id"] == deployment.pk
        assert message["data"]["signals"]["requests_waiting"] == 3.0
        await comm.disconnect()

    asyncio.run(scenario())
