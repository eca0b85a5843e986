"""The advisor on the pages: the "Advisor" fragments of a host's deployments and of a run, the
fleet's findings on the dashboard (worst first, constant queries), dismissing with a reason
(Operator and up), and "Propose this change" opening the proposal form pre-filled with exactly
the suggested flags over the running config."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from changes.forms import FLAG_PREFIX
from changes.models import ChangeRequest, Finding
from changes.services import diagnosis
from tests.factories import make_config, make_deployment, make_finished_run, make_host

pytestmark = pytest.mark.django_db

RUNNING = {"max_num_seqs": 4, "gpu_memory_utilization": 0.9, "max_model_len": 32768}


@pytest.fixture
def deployment(db):
    deployment = make_deployment(make_host(name="gpu-a"), name="chat")
    deployment.active_config = make_config(deployment, dict(RUNNING))
    deployment.save()
    return deployment


def finding(deployment, rule="queue-bound", severity="warning", **kw) -> Finding:
    now = timezone.now()
    data = {
        "title": f"{rule}: requests wait",
        "seen": "12 requests waiting on average over the last 60 s while 4 of 4 sequences ran.",
        "why": "Requests queue in front of a full batch while the KV cache has room.",
        "evidence": {"waiting_mean": 12.0, "running_max": 4, "kv_usage": {"mean": 0.31}},
        "suggestion": {"settings": {"max_num_seqs": 16}, "action": ""},
        "source": "live",
        "first_seen_at": now - timedelta(minutes=30),
        "last_seen_at": now,
    }
    data.update(kw)
    return Finding.objects.create(deployment=deployment, rule=rule, severity=severity, **data)


def part(client, deployment):
    return client.get(reverse("changes:advisor_deployment", args=[deployment.pk]))


# --- the fragments -------------------------------------------------------------------------------
def test_host_fragment_shows_the_active_findings_with_their_evidence(client, viewer, deployment):
    shown = finding(deployment)
    finding(deployment, rule="kv-bound", cleared_at=timezone.now())
    finding(deployment, rule="no-headroom", dismissed_at=timezone.now(), dismiss_reason="known")
    client.force_login(viewer)
    response = part(client, deployment)
    assert response.status_code == 200
    page = response.content.decode()
    assert f'data-finding="{shown.pk}"' in page
    assert "kv-bound" not in page and "no-headroom" not in page
    assert shown.seen in page and shown.why in page
    # The suggestion as old → new over the running config, and the evidence numbers.
    assert "<code>max_num_seqs</code> 4 → <strong>16</strong>" in page
    assert "waiting_mean" in page and "kv_usage · mean" in page and "0.31" in page


def test_host_page_holds_a_live_advisor_section_per_deployment(client, viewer, deployment):
    other = make_deployment(deployment.host, name="batch")
    client.force_login(viewer)
    page = client.get(deployment.host.get_absolute_url()).content.decode()
    for d in (deployment, other):
        assert reverse("changes:advisor_deployment", args=[d.pk]) in page
        assert f'id="advisor-{d.pk}" data-live-socket="/ws/deployments/{d.pk}/"' in page
    assert 'hx-trigger="load, live:advisor.findings"' in page


def test_run_fragment_marks_the_findings_this_run_raised(client, viewer, deployment):
    run = make_finished_run(deployment)
    live = finding(deployment)
    from_run = finding(deployment, rule="length-rejected", source=f"run {run.pk}")
    client.force_login(viewer)
    response = client.get(reverse("changes:advisor_run", args=[run.pk]))
    page = response.content.decode()
    assert f'data-finding="{live.pk}"' in page and f'data-finding="{from_run.pk}"' in page
    assert page.count("from this run") == 1
    assert f'href="{run.get_absolute_url()}"' in page
    run_page = client.get(run.get_absolute_url()).content.decode()
    assert reverse("changes:advisor_run", args=[run.pk]) in run_page
    assert f'data-live-socket="/ws/deployments/{deployment.pk}/"' in run_page


def test_no_findings_says_so(client, viewer, deployment):
    finding(deployment, cleared_at=timezone.now())
    client.force_login(viewer)
    assert 'data-testid="no-findings"' in part(client, deployment).content.decode()


def test_fragments_need_a_role(client, nobody, deployment):
    run = make_finished_run(deployment)
    client.force_login(nobody)
    assert part(client, deployment).status_code == 403
    assert client.get(reverse("changes:advisor_run", args=[run.pk])).status_code == 403


# --- buttons by role -----------------------------------------------------------------------------
def test_viewers_get_no_dismiss_or_propose(client, viewer, deployment):
    f = finding(deployment)
    client.force_login(viewer)
    page = part(client, deployment).content.decode()
    assert f"propose-finding-{f.pk}" not in page and f"dismiss-finding-{f.pk}" not in page


def test_operators_get_both_and_an_action_only_finding_has_no_propose(client, operator, deployment):
    config = finding(deployment)
    action = finding(
        deployment,
        rule="gpu-throttled",
        suggestion={"settings": {}, "action": "Check the power cap and the cooling."},
    )
    client.force_login(operator)
    page = part(client, deployment).content.decode()
    assert f"propose-finding-{config.pk}" in page and f"dismiss-finding-{config.pk}" in page
    assert f"dismiss-finding-{action.pk}" in page
    assert f"propose-finding-{action.pk}" not in page
    assert "Check the power cap and the cooling." in page


# --- dismiss ---------------------------------------------------------------------------------
def dismiss(client, f, reason, next_url="/"):
    url = reverse("changes:advisor_dismiss", args=[f.pk])
    return client.post(url, {"reason": reason, "next": next_url})


def test_dismiss_needs_a_reason(client, operator, deployment):
    f = finding(deployment)
    client.force_login(operator)
    response = dismiss(client, f, "   ")
    assert response.status_code == 302
    f.refresh_from_db()
    assert f.dismissed_at is None
    assert any("Say why" in str(m) for m in get_messages(response.wsgi_request))


def test_dismiss_with_a_reason_hides_it(client, operator, deployment):
    f = finding(deployment)
    client.force_login(operator)
    back = deployment.host.get_absolute_url()
    response = dismiss(client, f, "The GPU is shared on purpose.", back)
    assert response.status_code == 302 and response["Location"] == back
    f.refresh_from_db()
    assert f.dismissed_at is not None and f.dismiss_reason == "The GPU is shared on purpose."
    assert f'data-finding="{f.pk}"' not in part(client, deployment).content.decode()


def test_dismiss_goes_back_only_to_this_site(client, operator, deployment):
    f = finding(deployment)
    client.force_login(operator)
    response = dismiss(client, f, "known", "https://evil.example/")
    assert response["Location"] == deployment.host.get_absolute_url()


def test_dismiss_needs_the_role_and_a_post(client, viewer, operator, deployment):
    f = finding(deployment)
    client.force_login(viewer)
    assert dismiss(client, f, "no").status_code == 403
    f.refresh_from_db()
    assert f.dismissed_at is None
    client.force_login(operator)
    assert client.get(reverse("changes:advisor_dismiss", args=[f.pk])).status_code == 405


# --- propose this change -------------------------------------------------------------------------
def test_propose_prefills_exactly_the_suggested_settings(client, operator, deployment):
    f = finding(
        deployment,
        suggestion={"settings": {"max_num_seqs": 16, "enable_prefix_caching": True}, "action": ""},
    )
    client.force_login(operator)
    page = part(client, deployment).content.decode()
    link = f"{reverse('changes:new')}?deployment={deployment.pk}&amp;finding={f.pk}"
    assert f'href="{link}"' in page
    response = client.get(link.replace("&amp;", "&"))
    assert response.status_code == 200
    form = response.context["form"]
    assert form.deployment == deployment
    values = {
        dest: form[FLAG_PREFIX + dest].value()
        for dest, flag in form.flags.items()
        if not flag.secret and form[FLAG_PREFIX + dest].value() not in (None, "")
    }
    # The suggestion over the running config, and nothing else.
    assert values == {
        "max_num_seqs": 16,
        "enable_prefix_caching": "true",
        "gpu_memory_utilization": 0.9,
        "max_model_len": 32768,
    }
    assert form["title"].value() == f.title
    rationale = form["rationale"].value()
    assert f.seen in rationale and f.why in rationale
    assert f"From advisor finding #{f.pk} (queue-bound)." in rationale
    # The live preview (the simulator's predicted impact) is fed by this very form.
    assert reverse("changes:preview") in response.content.decode()


def test_the_prefilled_form_submits_as_a_proposal(client, operator, deployment):
    f = finding(deployment)
    client.force_login(operator)
    url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
    form = client.get(url).context["form"]
    data = {name: form[name].value() for name in form.fields}
    data = {k: "" if v is None else v for k, v in data.items()}
    data["action"] = "draft"
    response = client.post(f"{reverse('changes:new')}?deployment={deployment.pk}", data)
    assert response.status_code == 302
    change = ChangeRequest.objects.get(deployment=deployment)
    assert change.settings == {**RUNNING, "max_num_seqs": 16}
    assert f"From advisor finding #{f.pk}" in change.rationale


def test_propose_refuses_a_finding_of_another_deployment(client, operator, deployment):
    other = make_deployment(deployment.host, name="other")
    f = finding(other)
    client.force_login(operator)
    url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
    assert client.get(url).status_code == 404


def test_propose_needs_the_role(client, viewer, deployment):
    f = finding(deployment)
    client.force_login(viewer)
    url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
    assert client.get(url).status_code == 403


# --- the dashboard -------------------------------------------------------------------------
def test_dashboard_lists_the_fleet_worst_first(client, viewer, deployment):
    other = make_deployment(make_host(name="gpu-b"), name="batch")
    info = finding(deployment, rule="tp-on-one-gpu", severity="info")
    critical = finding(other, rule="kv-bound", severity="critical")
    warning = finding(deployment, rule="queue-bound", severity="warning")
    finding(other, rule="no-headroom", severity="critical", dismissed_at=timezone.now())
    client.force_login(viewer)
    response = client.get(reverse("dashboard"))
    assert [f.pk for f in response.context["findings"]] == [critical.pk, warning.pk, info.pk]
    page = response.content.decode()
    assert f'{other.host.get_absolute_url()}#advisor-{other.pk}"' in page
    assert "no-headroom" not in page


def test_dashboard_without_findings_says_when_the_advisor_ran(client, viewer, deployment):
    client.force_login(viewer)
    page = client.get(reverse("dashboard")).content.decode()
    assert 'data-testid="no-findings"' in page and "The advisor has not run yet." in page
    diagnosis.refresh(deployment, live=False)
    response = client.get(reverse("changes:advisor_fleet"))
    assert "The advisor last ran 0\xa0minutes ago" in response.content.decode()


def test_dashboard_queries_do_not_grow_with_findings(client, viewer, deployment):
    client.force_login(viewer)
    finding(deployment)
    with CaptureQueriesContext(connection) as one:
        client.get(reverse("dashboard"))
    for n in range(12):
        host = make_host()
        d = make_deployment(host)
        d.active_config = make_config(d, dict(RUNNING))
        d.save()
        finding(d, rule=f"rule-{n}", severity=("critical", "warning", "info")[n % 3])
    with CaptureQueriesContext(connection) as many:
        response = client.get(reverse("dashboard"))
    assert len(response.context["findings"]) == 13
    assert len(many.captured_queries) == len(one.captured_queries)


def test_propose_says_where_it_came_from_and_leaves_out_an_unknown_flag(
    client, operator, deployment
):
    f = finding(
        deployment, suggestion={"settings": {"max_num_seqs": 8, "no_such_flag": 1}, "action": ""}
    )
    client.force_login(operator)
    url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
    response = client.get(url)
    assert response.context["form"]["flag_max_num_seqs"].value() == 8
    shown = [str(m) for m in get_messages(response.wsgi_request)]
    assert any(f"Pre-filled from advisor finding #{f.pk} (queue-bound)" in m for m in shown)
    assert any("no field for no_such_flag" in m for m in shown)


def _profile_with_slo(slo):
    from tests.factories import make_profile

    return make_profile(
        "chat-slo",
        {"stages": [{"name": "peak", "concurrency": 48, "num_requests": 96}], "slo": slo},
    )


def test_a_larger_batch_is_verified_under_its_runs_load_with_itl_allowed_to_grow_with_it(
    client, operator, deployment
):
    """Raising max_num_seqs trades ITL for queue wait: the verification uses the run's own
    profile and lets ITL p95 grow as much as the batch does (4 → 16, capped at doubled), and
    the rationale says so (issue 37: a limit from the change, not from a run's ITL)."""
    profile = _profile_with_slo({"ttft": 500, "tpot": 50})
    run = make_finished_run(deployment, load_profile=profile, itl_p95_ms=20.0)
    f = finding(deployment, source=f"run {run.pk}")
    client.force_login(operator)
    url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
    form = client.get(url).context["form"]
    assert form["verify_profile"].value() == profile.pk
    assert form["max_itl_p95_regression"].value() == 100
    rationale = form["rationale"].value()
    assert "+100 %, as much as the batch cap grows" in rationale
    assert "the baseline run the verification compares against" in rationale
    assert "the load it was seen under" in rationale


def test_the_itl_limit_does_not_depend_on_the_run_it_was_proposed_from(
    client, operator, deployment
):
    """The same change proposed from two runs (ITL p95 20 ms and 32 ms) had +150 % or +57 %
    (the profile's 50 ms TPOT SLO over each run's ITL): now one limit from the change."""
    profile = _profile_with_slo({"tpot": 50})
    client.force_login(operator)
    limits = []
    for itl in (20.0, 32.0):
        run = make_finished_run(deployment, load_profile=profile, itl_p95_ms=itl)
        f = finding(deployment, rule=f"queue-bound-{itl:.0f}", source=f"run {run.pk}")
        url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
        limits.append(client.get(url).context["form"]["max_itl_p95_regression"].value())
    assert limits == [100, 100]


def test_a_larger_batch_from_an_unknown_cap_keeps_the_limit_and_tells_the_reviewer(
    client, operator
):
    """Without the running cap (the engine's default) the growth is unknown."""
    deployment = make_deployment(make_host(name="gpu-b"), name="chat")
    deployment.active_config = make_config(deployment, {"gpu_memory_utilization": 0.9})
    deployment.save()
    run = make_finished_run(deployment, load_profile=_profile_with_slo({"tpot": 50}))
    f = finding(deployment, source=f"run {run.pk}")
    client.force_login(operator)
    url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
    form = client.get(url).context["form"]
    assert form["max_itl_p95_regression"].value() == 20
    assert "raise it to what your users accept" in form["rationale"].value()


def test_a_change_that_does_not_grow_the_batch_keeps_the_default_limits(
    client, operator, deployment
):
    profile = _profile_with_slo({"tpot": 50})
    run = make_finished_run(deployment, load_profile=profile, itl_p95_ms=20.0)
    f = finding(
        deployment,
        rule="max-model-len-oversized",
        source=f"run {run.pk}",
        suggestion={"settings": {"max_model_len": 4096}, "action": ""},
    )
    client.force_login(operator)
    url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
    form = client.get(url).context["form"]
    assert form["verify_profile"].value() == profile.pk
    assert form["max_itl_p95_regression"].value() == 20
    assert "inter-token" not in form["rationale"].value()


def test_the_proposal_carries_its_finding_to_the_reviewer(client, operator, deployment):
    f = finding(deployment)
    client.force_login(operator)
    url = f"{reverse('changes:new')}?deployment={deployment.pk}&finding={f.pk}"
    form = client.get(url).context["form"]
    assert form["finding"].value() == f.pk
    data = {name: form[name].value() for name in form.fields}
    data = {k: "" if v is None else v for k, v in data.items()}
    data["action"] = "draft"
    client.post(f"{reverse('changes:new')}?deployment={deployment.pk}", data)
    change = ChangeRequest.objects.get(deployment=deployment)
    assert change.finding == f
    page = client.get(reverse("changes:detail", args=[change.pk])).content.decode()
    assert "Answers advisor finding" in page and f.seen in page


def test_a_finding_of_another_deployment_cannot_be_attached(client, operator, deployment):
    other = make_deployment(deployment.host, name="other")
    other.active_config = make_config(other, dict(RUNNING))
    other.save()
    f = finding(other)
    client.force_login(operator)
    form = client.get(f"{reverse('changes:new')}?deployment={deployment.pk}").context["form"]
    data = {name: form[name].value() for name in form.fields}
    data = {k: "" if v is None else v for k, v in data.items()}
    data.update(action="draft", finding=f.pk, title="t", rationale="r")
    data["flag_max_num_seqs"] = 8
    response = client.post(f"{reverse('changes:new')}?deployment={deployment.pk}", data)
    assert response.status_code == 200  # the form refuses it: not one of this deployment's
    assert not ChangeRequest.objects.exists()
