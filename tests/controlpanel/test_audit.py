"""The audit log records who changed what, with before/after, and cannot be rewritten."""

import pytest
from django.urls import reverse

from controlpanel.services import audit, snapshot
from tests.factories import make_host

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
