"""Roles decide who may approve and apply changes: granting or taking one in Django's admin
(the panel's user management) is written to the audit log with before and after, as are a
role's permissions and deleted accounts."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse

from controlpanel.models import AuditEntry

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client, admin):
    admin.is_staff = True
    admin.save()
    client.force_login(admin)
    return admin


def user_form(user, **changes) -> dict:
    data = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on" if user.is_active else "",
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
        "groups": [g.pk for g in user.groups.all()],
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v != ""}


def test_granting_a_role_in_the_admin_is_audited(client, staff, viewer):
    approver = Group.objects.get(name="Approver")
    url = reverse("admin:auth_user_change", args=[viewer.pk])
    response = client.post(url, user_form(viewer, groups=[approver.pk]))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert list(viewer.groups.values_list("name", flat=True)) == ["Approver"]
    entry = AuditEntry.objects.get(action="user.changed")
    assert entry.actor_id == staff.pk and entry.object_repr == viewer.username
    assert entry.before["roles"] == ["Viewer"] and entry.after["roles"] == ["Approver"]


def test_a_save_that_changes_nothing_writes_nothing(client, staff, viewer):
    url = reverse("admin:auth_user_change", args=[viewer.pk])
    assert client.post(url, user_form(viewer)).status_code == 302
    assert not AuditEntry.objects.filter(action__startswith="user.").exists()


def test_making_someone_superuser_is_audited(client, staff, operator):
    url = reverse("admin:auth_user_change", args=[operator.pk])
    assert client.post(url, user_form(operator, is_superuser="on")).status_code == 302
    entry = AuditEntry.objects.get(action="user.changed")
    assert entry.before["is_superuser"] is False and entry.after["is_superuser"] is True


def test_deleting_an_account_and_changing_a_role_are_audited(client, staff, viewer):
    url = reverse("admin:auth_user_delete", args=[viewer.pk])
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not User.objects.filter(pk=viewer.pk).exists()
    deleted = AuditEntry.objects.get(action="user.deleted")
    assert deleted.before["roles"] == ["Viewer"]

    role = Group.objects.get(name="Viewer")
    kept = list(role.permissions.values_list("pk", flat=True))[1:]
    url = reverse("admin:auth_group_change", args=[role.pk])
    assert client.post(url, {"name": "Viewer", "permissions": kept}).status_code == 302
    entry = AuditEntry.objects.get(action="role.changed")
    assert len(entry.before["permissions"]) == len(entry.after["permissions"]) + 1
