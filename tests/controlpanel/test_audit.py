"""The audit log records who changed what, with before/after, and cannot be rewritten."""

import csv
import io
import json
import re
from datetime import UTC, datetime
from urllib.parse import parse_qs
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse

from controlpanel import services
from controlpanel.models import AuditEntry
from controlpanel.services import audit, audit_entries, audit_object_url, snapshot
from tests.factories import make_finished_run, make_gpu, make_host

pytestmark = pytest.mark.django_db


def test_entry_records_actor_object_and_change(operator):
    host = make_host(name="h1")
    before = snapshot(host, ["name", "port", "hourly_price"])
    host.port = 9000
    host.save()
    entry = audit(
        operator,
        "host.update",
        host,
        before=before,
        after=snapshot(host, ["name", "port", "hourly_price"]),
    )
    entry.refresh_from_db()
    assert entry.actor == operator and entry.actor_name == "otto-operator"
    assert entry.object_repr == "h1" and entry.object_id == str(host.pk)
    assert entry.content_type.model == "host"
    assert entry.before["hourly_price"] == "2.50"  # Decimals stored exactly, as text
    assert entry.changed_fields == ["port"]


def test_entries_are_append_only(operator):
    entry = audit(operator, "host.create", make_host())
    entry.action = "something.else"
    with pytest.raises(ValueError, match="append-only"):
        entry.save()


def test_actor_snapshot_survives_user_deletion(operator):
    entry = audit(operator, "host.create", make_host())
    operator.delete()
    entry.refresh_from_db()
    assert entry.actor is None and entry.actor_name == "otto-operator"


def test_system_actions_have_no_actor():
    entry = audit(None, "host.check", make_host())
    assert entry.actor is None and str(entry).split()[2] == "system"


def test_audit_page_lists_and_filters(client, viewer, operator):
    audit(operator, "host.create", make_host(name="alpha"))
    audit(operator, "benchmark.start", make_host(name="beta"))
    client.force_login(viewer)
    page = client.get(reverse("audit"), {"action": "host."}).content.decode()
    assert "alpha" in page and "beta" not in page


# --- The audit page as a tool: filters, rows, pagination, exports -------------------------


def _at(entry, when: datetime) -> None:
    """Back-date an entry (update() writes past the append-only save, as only a test may)."""
    AuditEntry.objects.filter(pk=entry.pk).update(created_at=when)


def _listed(response) -> set[int]:
    """Primary keys of the entries in the page's table."""
    return {int(pk) for pk in re.findall(r'data-entry="(\d+)"', response.content.decode())}


def _get(client, user, **params):
    client.force_login(user)
    return client.get(reverse("audit"), params)


def test_filter_by_actor_and_system(client, viewer, operator, approver):
    by_otto = audit(operator, "host.create", make_host())
    by_anna = audit(approver, "host.create", make_host())
    by_system = audit(None, "host.check", make_host())
    page = _get(client, viewer)
    html = page.content.decode()
    assert '<option value="otto-operator">' in html and '<option value="system">' in html
    # Only names that appear in the log are offered.
    assert '<option value="vera-viewer">' not in html
    assert _listed(_get(client, viewer, actor="otto-operator")) == {by_otto.pk}
    assert _listed(_get(client, viewer, actor="anna-approver")) == {by_anna.pk}
    assert _listed(_get(client, viewer, actor="system")) == {by_system.pk}


def test_filter_by_object_type_and_id(client, viewer, operator):
    h1, h2 = make_host(name="h-one"), make_host(name="h-two")
    run = make_finished_run()
    e1 = audit(operator, "host.create", h1)
    e2 = audit(operator, "host.update", h1, before={"port": 1}, after={"port": 2})
    e3 = audit(operator, "host.create", h2)
    e4 = audit(operator, "benchmark.start", run)
    assert _listed(_get(client, viewer, object_type="hosts.host")) == {e1.pk, e2.pk, e3.pk}
    assert _listed(_get(client, viewer, object_type="benchmarks.benchmarkrun")) == {e4.pk}
    one = _get(client, viewer, object_type="hosts.host", object_id=str(h1.pk))
    assert _listed(one) == {e1.pk, e2.pk}
    assert '<option value="benchmarks.benchmarkrun">' in one.content.decode()


def test_object_id_without_type_is_an_error(client, viewer, operator):
    audit(operator, "host.create", make_host())
    response = _get(client, viewer, object_id="1")
    assert response.status_code == 400
    assert "Choose the object type too" in response.content.decode()
    assert _listed(response) == set()


def test_unknown_choice_is_an_error(client, viewer, operator):
    audit(operator, "host.create", make_host())
    response = _get(client, viewer, actor="mallory")
    assert response.status_code == 400 and _listed(response) == set()


def test_filter_by_text_in_object(client, viewer, operator):
    hit = audit(operator, "host.create", make_host(name="Rack7-GPU"))
    audit(operator, "host.create", make_host(name="rack8-gpu"))
    assert _listed(_get(client, viewer, q="rack7")) == {hit.pk}


def test_filter_by_dates_is_inclusive_in_local_time(client, viewer, operator, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    tz = ZoneInfo("Europe/Berlin")
    host = make_host()
    before = audit(operator, "host.a", host)
    first = audit(operator, "host.b", host)
    last = audit(operator, "host.c", host)
    after = audit(operator, "host.d", host)
    _at(before, datetime(2026, 3, 1, 23, 59, 59, tzinfo=tz))
    _at(first, datetime(2026, 3, 2, 0, 0, 0, tzinfo=tz))
    _at(last, datetime(2026, 3, 3, 23, 59, 59, 999999, tzinfo=tz))
    _at(after, datetime(2026, 3, 4, 0, 0, 0, tzinfo=tz))
    both = _get(client, viewer, date_from="2026-03-02", date_to="2026-03-03")
    assert _listed(both) == {first.pk, last.pk}
    assert _listed(_get(client, viewer, date_from="2026-03-03")) == {last.pk, after.pk}
    assert _listed(_get(client, viewer, date_to="2026-03-01")) == {before.pk}


def test_invalid_date_shows_error_and_no_rows(client, viewer, operator):
    audit(operator, "host.create", make_host(name="visible"))
    response = _get(client, viewer, date_from="2026-13-45")
    html = response.content.decode()
    assert response.status_code == 400
    assert "Enter a valid date." in html and 'data-testid="audit-refused"' in html
    assert _listed(response) == set() and "visible" not in html


def test_end_before_start_is_an_error(client, viewer):
    response = _get(client, viewer, date_from="2026-03-05", date_to="2026-03-01")
    assert response.status_code == 400
    assert "The end date is before the start date." in response.content.decode()


def test_filters_combine(client, viewer, operator, approver):
    host = make_host(name="combo-host")
    other = make_host(name="combo-other")
    hit = audit(operator, "host.update", host)
    audit(approver, "host.update", host)  # other actor
    audit(operator, "benchmark.start", host)  # other action
    audit(operator, "host.update", other)  # other object
    old = audit(operator, "host.update", host)
    _at(old, datetime(2020, 1, 1, tzinfo=UTC))  # too old
    criteria = {
        "action": "host.",
        "actor": "otto-operator",
        "object_type": "hosts.host",
        "object_id": str(host.pk),
        "q": "combo",
        "date_from": "2025-01-01",
    }
    assert _listed(_get(client, viewer, **criteria)) == {hit.pk}
    assert list(
        audit_entries({"action": "host.", "actor": "otto-operator", "q": "combo-h"})
        .exclude(pk=old.pk)
        .values_list("pk", flat=True)
    ) == [hit.pk]


def test_audit_entries_service_without_criteria_lists_all_newest_first(operator):
    a = audit(operator, "host.create", make_host())
    b = audit(None, "host.check", make_host())
    assert list(audit_entries({}).values_list("pk", flat=True)) == [b.pk, a.pk]
    assert list(audit_entries({"actor": None})) == list(audit_entries({}))
    assert list(audit_entries({"actor": ""}).values_list("pk", flat=True)) == [b.pk]


def test_row_shows_link_changes_and_address(client, viewer, operator):
    host = make_host(name="linked")
    audit(
        operator,
        "host.update",
        host,
        before={"port": 9100, "labels": {"zone": "a"}, "same": 1, "note": "x" * 200},
        after={"port": 9000, "labels": {"zone": "b"}, "same": 1, "note": "y"},
        remote_addr="10.0.0.7",
    )
    audit(operator, "price.create", None, after={"name": "p5"})
    html = _get(client, viewer).content.decode()
    assert f'<a href="{host.get_absolute_url()}">linked</a>' in html
    assert '<span class="old">9100</span> → <span class="new">9000</span>' in html
    assert "{&quot;zone&quot;: &quot;a&quot;}" in html  # non-text values as JSON
    assert "<code>same</code>" not in html  # unchanged fields are left out
    assert "x" * 79 + "…" in html and "x" * 80 not in html
    assert "10.0.0.7" in html
    assert '<code>name</code>: <span class="muted">—</span> → <span class="new">p5</span>' in html


def test_object_urls_match_the_models_own_pages(operator):
    from changes.models import ChangeRequest

    host, run = make_host(), make_finished_run()
    change = ChangeRequest.objects.create(deployment=run.deployment, title="t", rationale="r")
    for obj in (host, run, run.load_profile, change):
        entry = AuditEntry.objects.select_related("content_type").get(
            pk=audit(operator, "x.y", obj).pk
        )
        assert audit_object_url(entry) == obj.get_absolute_url()
    gpu_entry = audit(operator, "gpu.add", make_gpu(host))
    assert audit_object_url(gpu_entry) is None  # no page: no link


def test_pagination_links_keep_filters(client, viewer, operator):
    host = make_host(name="paged")
    for i in range(60):
        audit(operator, "host.update", host, after={"i": i})
    audit(operator, "benchmark.start", host)
    response = _get(client, viewer, action="host.", actor="otto-operator", q="paged")
    html = response.content.decode()
    assert response.context["page"].paginator.count == 60
    links = re.findall(r'<a href="(\?[^"]*)">Older</a>', html)
    assert len(links) == 1
    query = parse_qs(links[0][1:].replace("&amp;", "&"))
    assert query == {"action": ["host."], "actor": ["otto-operator"], "q": ["paged"], "page": ["2"]}
    second = client.get(reverse("audit") + links[0].replace("&amp;", "&"))
    assert len(_listed(second)) == 10
    newer = re.findall(r'<a href="(\?[^"]*)">Newer</a>', second.content.decode())
    assert parse_qs(newer[0][1:].replace("&amp;", "&"))["action"] == ["host."]
    assert "page=1" in newer[0]


def test_export_links_carry_filters_without_page(client, viewer, operator):
    host = make_host()
    for _ in range(55):
        audit(operator, "host.update", host)
    html = _get(client, viewer, action="host.", page="2").content.decode()
    for fmt in ("csv", "json"):
        href = re.search(rf'href="([^"]*export\.{fmt}[^"]*)"', html).group(1)
        assert href == reverse("audit_export", kwargs={"fmt": fmt}) + "?action=host."


def _export(client, user, fmt, **params):
    client.force_login(user)
    return client.get(reverse("audit_export", kwargs={"fmt": fmt}), params)


def test_csv_export(client, viewer, operator):
    host = make_host(name="exported")
    entry = audit(
        operator,
        "host.update",
        host,
        before={"port": 1},
        after={"port": 2},
        remote_addr="192.0.2.1",
    )
    system = audit(None, "host.check", host)
    audit(operator, "benchmark.start", make_host(name="filtered-out"))
    response = _export(client, viewer, "csv", action="host.")
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert re.fullmatch(
        r'attachment; filename="audit-\d{8}-\d{4}\.csv"', response["Content-Disposition"]
    )
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [int(r["id"]) for r in rows] == [system.pk, entry.pk]
    row = rows[1]
    assert list(row) == [
        "id",
        "created_at",
        "actor",
        "action",
        "object_type",
        "object_id",
        "object",
        "before",
        "after",
        "remote_addr",
        "via",
    ]
    assert (
        datetime.fromisoformat(row["created_at"]) == AuditEntry.objects.get(pk=entry.pk).created_at
    )
    assert row["actor"] == "otto-operator" and row["action"] == "host.update"
    assert row["object_type"] == "hosts.host" and row["object_id"] == str(host.pk)
    assert row["object"] == "exported" and row["remote_addr"] == "192.0.2.1"
    assert json.loads(row["before"]) == {"port": 1} and json.loads(row["after"]) == {"port": 2}
    assert rows[0]["actor"] == "" and rows[0]["before"] == ""


def test_csv_export_neutralises_formulas(client, viewer, operator):
    for name in ("=HYPERLINK(1)", "+1", "-2", "@SUM(A1)", "safe"):
        audit(operator, "host.create", make_host(name=name))
    response = _export(client, viewer, "csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert sorted(r["object"] for r in rows) == sorted(
        ["'=HYPERLINK(1)", "'+1", "'-2", "'@SUM(A1)", "safe"]
    )


def test_json_export(client, viewer, operator, approver):
    host = make_host(name="json-host")
    entry = audit(operator, "host.update", host, before={"port": 1}, after={"port": 2})
    audit(approver, "host.update", host)
    response = _export(client, viewer, "json", actor="otto-operator")
    assert response.status_code == 200
    assert re.fullmatch(
        r'attachment; filename="audit-\d{8}-\d{4}\.json"', response["Content-Disposition"]
    )
    data = json.loads(response.content)
    assert data["filters"] == {"actor": "otto-operator"}
    assert data["count"] == 1 and data["truncated"] is False
    (record,) = data["entries"]
    assert record == {
        "id": entry.pk,
        "created_at": AuditEntry.objects.get(pk=entry.pk).created_at.isoformat(),
        "actor": "otto-operator",
        "action": "host.update",
        "object_type": "hosts.host",
        "object_id": str(host.pk),
        "object": "json-host",
        "before": {"port": 1},
        "after": {"port": 2},
        "remote_addr": None,
        "via": "",
    }


def test_json_export_is_capped(client, viewer, operator, monkeypatch):
    monkeypatch.setattr(services, "AUDIT_EXPORT_LIMIT", 2)
    host = make_host()
    entries = [audit(operator, "host.update", host) for _ in range(3)]
    data = json.loads(_export(client, viewer, "json").content)
    assert data["truncated"] is True and data["count"] == 2
    assert [r["id"] for r in data["entries"]] == [entries[2].pk, entries[1].pk]


def test_export_refuses_invalid_filters(client, viewer):
    for fmt in ("csv", "json"):
        response = _export(client, viewer, fmt, date_to="yesterday")
        assert response.status_code == 400
        assert "date_to" in response.json()["errors"]


@pytest.mark.parametrize(
    "url",
    [
        lambda: reverse("audit"),
        lambda: reverse("audit_export", kwargs={"fmt": "csv"}),
        lambda: reverse("audit_export", kwargs={"fmt": "json"}),
    ],
    ids=["page", "csv", "json"],
)
def test_permissions(client, nobody, viewer, url):
    response = client.get(url())
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")
    client.force_login(nobody)
    assert client.get(url()).status_code == 403
    client.force_login(viewer)
    assert client.get(url()).status_code == 200


def test_page_queries_do_not_grow_with_rows(
    client, viewer, operator, django_assert_max_num_queries
):
    hosts = [make_host() for _ in range(3)]
    run = make_finished_run()
    for i in range(60):
        obj = run if i % 4 == 0 else hosts[i % 3]
        audit(operator if i % 2 else None, "x.update", obj, before={"n": i}, after={"n": i + 1})
    client.force_login(viewer)
    # session, user, permissions (2), actor and type choices (2), count, the page
    with django_assert_max_num_queries(10):
        response = client.get(reverse("audit"), {"action": "x."})
    assert len(_listed(response)) == 50
