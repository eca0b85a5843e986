"""Approvers see what waits for them: a count in the navigation (changes and sweeps they may
approve, never their own) and the dashboard's "needs my attention" card."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from benchmarks.models import LoadProfile
from changes.models import ChangeRequest, Finding
from changes.models_sweeps import Sweep
from home.attention import attention, reviews_waiting
from tests.factories import make_config, make_deployment, make_host, make_profile, make_run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def _deployment(name="chat"):
    deployment = make_deployment(make_host(), name=name)
    deployment.active_config = make_config(deployment, {"max_num_seqs": 64})
    deployment.save()
    return deployment


def _change(deployment, by, state="pending", **kw):
    return ChangeRequest.objects.create(
        deployment=deployment,
        title=kw.pop("title", f"a {state} change"),
        rationale="Queue wait dominates TTFT.",
        state=state,
        proposed_by=by,
        base_config=deployment.active_config,
        settings={"max_num_seqs": 128},
        **kw,
    )


def _sweep(deployment, by, profile: LoadProfile, state="pending"):
    return Sweep.objects.create(
        deployment=deployment,
        title="more throughput",
        state=state,
        created_by=by,
        load_profile=profile,
        space={"max_num_seqs": [32, 64]},
        slo={"ttft_p95_ms": 500, "max_error_rate": 0.01},
        base_config=deployment.active_config,
        required_approvals=1,
    )


def _finding(deployment, severity, **kw):
    now = timezone.now()
    return Finding.objects.create(
        deployment=deployment,
        rule=kw.pop("rule", f"rule-{severity}"),
        severity=severity,
        title=kw.pop("title", f"{severity} finding"),
        seen="seen",
        why="why",
        source="live",
        first_seen_at=now,
        last_seen_at=now,
        **kw,
    )


def _nav_counts(html: str) -> list[str]:
    marker = 'data-testid="nav-waiting" title="waiting for your review">'
    return [part.split("<", 1)[0] for part in html.split(marker)[1:]]


def test_the_navigation_counts_reviews_the_user_may_make_never_their_own(
    client, approver, operator, admin
):
    deployment = _deployment()
    _change(deployment, operator)
    _change(deployment, operator, title="another")
    _change(deployment, approver)  # the approver's own: someone else reviews it
    _change(deployment, operator, state="draft")
    _change(deployment, operator, state="approved")
    _sweep(deployment, operator, make_profile())
    client.force_login(approver)
    html = client.get(reverse("benchmarks:list")).content.decode()
    assert _nav_counts(html) == ["2", "1"]  # Changes 2, Sweeps 1
    changes, sweeps = reviews_waiting(approver)
    assert len(changes) == 2 and all(c.proposed_by == operator for c in changes)
    assert len(sweeps) == 1
    # An operator cannot approve: no count at all.
    client.force_login(operator)
    assert _nav_counts(client.get(reverse("benchmarks:list")).content.decode()) == []
    # An admin may review all three changes (the approver's too).
    client.force_login(admin)
    assert _nav_counts(client.get(reverse("benchmarks:list")).content.decode()) == ["3", "1"]


def test_a_stale_change_waits_for_a_rebase_not_for_a_review(client, approver, operator):
    deployment = _deployment()
    change = _change(deployment, operator)
    deployment.active_config = make_config(deployment, {"max_num_seqs": 96})
    deployment.save()
    assert change.pk and reviews_waiting(approver) == ([], [])
    client.force_login(approver)
    assert _nav_counts(client.get(reverse("dashboard")).content.decode()) == []


def test_the_dashboard_lists_what_needs_my_attention(client, approver, operator):
    deployment = _deployment()
    review = _change(deployment, operator, title="more sequences")
    mine = _change(
        deployment,
        approver,
        state="failed",
        title="my failed change",
        finished_at=timezone.now() - timedelta(days=1),
    )
    _change(
        deployment,
        approver,
        state="rolled_back",
        title="long ago",
        finished_at=timezone.now() - timedelta(days=30),
    )
    failed_run = make_run(deployment, requested_by=approver, status="failed", label="boom")
    make_run(deployment, requested_by=operator, status="failed", label="not mine")
    _finding(deployment, "critical", title="KV cache full")
    _finding(deployment, "info", title="just so you know")
    down = make_host(name="down-host", status="unreachable", last_error="connection refused")
    make_host(name="fine-host", status="online")
    locked = make_host(name="locked-host", status="auth_failed")
    client.force_login(approver)
    response = client.get(reverse("dashboard"))
    found = response.context["attention"]
    assert found.changes == [review]
    assert found.failed_changes == [mine]
    assert found.failed_runs == [failed_run]
    assert [f.title for f in found.findings] == ["KV cache full"]
    assert set(found.hosts) == {down, locked}
    html = response.content.decode()
    assert 'data-testid="attention"' in html
    for testid, count in (
        ("attention-review", 1),
        ("attention-failed-change", 1),
        ("attention-failed-run", 1),
        ("attention-finding", 1),
        ("attention-host", 2),
    ):
        assert html.count(f'data-testid="{testid}"') == count, testid
    assert "connection refused" in html and "attention-empty" not in html


def test_nothing_waiting_says_so(client, viewer):
    client.force_login(viewer)
    html = client.get(reverse("dashboard")).content.decode()
    assert 'data-testid="attention-empty"' in html and _nav_counts(html) == []


def test_attention_takes_a_bounded_number_of_queries(
    client, approver, operator, django_assert_max_num_queries
):
    profile = make_profile()
    for n in range(15):
        deployment = _deployment(name=f"d{n}")
        _change(deployment, operator)
        _sweep(deployment, operator, profile)
        _change(deployment, approver, state="failed", finished_at=timezone.now())
        make_run(deployment, requested_by=approver, status="failed")
        _finding(deployment, "warning")
        make_host(name=f"down-{n}", status="unreachable")
    client.force_login(approver)
    with django_assert_max_num_queries(12):
        found = attention(approver)
    assert len(found.changes) == len(found.sweeps) == len(found.hosts) == 10
    assert len(found.failed_runs) == len(found.failed_changes) == len(found.findings) == 10
    # The navigation's two counts: the two lists once per page, whatever the rows.
    with django_assert_max_num_queries(8):
        client.get(reverse("benchmarks:profiles"))


def test_attention_rows_leave_the_hosts_credentials_in_the_database(approver, operator):
    """Each host's credentials are decrypted when read: the card's rows never read them (nor
    the runs' JSON documents), and showing the card reads nothing more."""
    deployment = _deployment()
    _change(deployment, approver, state="failed", finished_at=timezone.now())
    make_run(deployment, requested_by=approver, status="failed")
    _finding(deployment, "critical")
    found = attention(approver)
    rows = [*found.failed_runs, *found.failed_changes, *found.findings]
    assert len(rows) == 3
    for row in rows:
        assert {"agent_token", "ssh_private_key"} <= row.deployment.host.get_deferred_fields()
    assert "summary" in found.failed_runs[0].get_deferred_fields()


def test_the_card_reads_no_deferred_field(client, approver):
    """A deferred field read by the template would cost a query per row: 4 rows and 10 rows of
    each kind cost the same."""

    def add(names):
        for name in names:
            deployment = _deployment(name=name)
            _change(deployment, approver, state="failed", finished_at=timezone.now())
            make_run(deployment, requested_by=approver, status="failed")
            _finding(deployment, "critical")

    def queries() -> int:
        client.get(reverse("dashboard"))  # warm: the first view reads the session etc.
        with CaptureQueriesContext(connection) as captured:
            html = client.get(reverse("dashboard")).content.decode()
        return len(captured), html.count('data-testid="attention-failed-run"')

    client.force_login(approver)
    add(f"d{n}" for n in range(4))
    four, shown = queries()
    assert shown == 4
    add(f"d{n}" for n in range(4, 10))
    ten, shown = queries()
    assert shown == 10 and ten == four


def test_the_navigation_links_follow_the_script_prefix(rf, viewer):
    """The entries' URLs are reversed once per script prefix, not once for every deployment."""
    from django.urls import set_script_prefix

    from home.context_processors import panel

    request = rf.get("/hosts/")
    request.user = viewer
    try:
        set_script_prefix("/panel/")
        prefixed = [item["url"] for item in panel(request)["nav"]]
        set_script_prefix("/")
        plain = [item["url"] for item in panel(request)["nav"]]
    finally:
        set_script_prefix("/")
    assert plain[:2] == ["/", "/hosts/"]
    assert prefixed == ["/panel" + url for url in plain]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([], (False, False)),
        ([("run", "mine", "failed", 1)], (True, False)),
        ([("run", "mine", "failed", 8)], (False, False)),  # outside the week
        ([("run", "theirs", "failed", 1)], (False, False)),
        ([("run", "mine", "succeeded", 1)], (False, False)),
        ([("change", "mine", "failed", 1)], (False, True)),
        ([("change", "mine", "rolled_back", 2)], (False, True)),
        ([("change", "mine", "failed", 9)], (False, False)),
        ([("change", "theirs", "rolled_back", 1)], (False, False)),
        ([("change", "mine", "pending", None)], (False, False)),
        ([("run", "mine", "failed", 3), ("change", "mine", "rolled_back", 3)], (True, True)),
    ],
)
def test_the_one_statement_check_agrees_with_the_lists(rows, expected, approver, operator):
    """The dashboard asks in one statement whether the user has failures to list (written out
    in SQL): it must say what the lists' own querysets say, on SQLite and PostgreSQL."""
    from benchmarks.models import BenchmarkRun
    from home import attention as module

    deployment = _deployment()
    now = timezone.now()
    for kind, whose, state, days in rows:
        user = approver if whose == "mine" else operator
        when = None if days is None else now - timedelta(days=days)
        if kind == "run":
            run = make_run(deployment, requested_by=user, status=state)
            BenchmarkRun.objects.filter(pk=run.pk).update(created_at=when)
        else:
            _change(deployment, user, state=state, finished_at=when)
    since = now - timedelta(days=module.RECENT_DAYS)
    by_the_lists = (
        module._own_failed_runs(approver, since).exists(),
        module._own_failed_changes(approver, since).exists(),
    )
    assert by_the_lists == expected
    assert module._own_failures_exist(approver, since) == expected
