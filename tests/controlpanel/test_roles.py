"""The four roles exist after migrate, with the permissions their names imply."""

import pytest
from django.contrib.auth.models import Group, Permission

from controlpanel.roles import ROLES, role_names, sync_roles

pytestmark = pytest.mark.sqlite


def codenames(group_name):
    return {
        f"{p.content_type.app_label}.{p.codename}"
        for p in Group.objects.get(name=group_name).permissions.select_related("content_type")
    }


@pytest.mark.django_db
def test_groups_created_by_migration():
    assert set(Group.objects.values_list("name", flat=True)) >= {r.name for r in ROLES}


@pytest.mark.django_db
def test_viewer_only_views():
    perms = codenames("Viewer")
    assert "hosts.view_host" in perms and "controlpanel.view_auditentry" in perms
    assert all(p.split(".")[1].startswith("view_") for p in perms)


@pytest.mark.django_db
def test_roles_are_cumulative_and_admin_can_delete():
    viewer, operator = codenames("Viewer"), codenames("Operator")
    approver, admin = codenames("Approver"), codenames("Admin")
    assert viewer < operator <= approver < admin
    assert {"hosts.add_host", "hosts.add_hostcheck", "benchmarks.add_benchmarkrun"} <= operator
    assert "hosts.delete_host" not in approver
    assert {"hosts.delete_host", "auth.change_user"} <= admin
    # Nobody may rewrite history through a permission.
    assert "hosts.change_engineconfig" not in operator


@pytest.mark.django_db
def test_sync_is_idempotent_and_repairs_drift():
    group = Group.objects.get(name="Viewer")
    before = set(group.permissions.all())
    group.permissions.add(Permission.objects.get(codename="delete_host"))
    sync_roles(Group, Permission)
    sync_roles(Group, Permission)
    assert set(group.permissions.all()) == before


@pytest.mark.django_db
def test_role_names(viewer, nobody, django_user_model):
    assert role_names(viewer) == ["Viewer"]
    assert role_names(nobody) == []
    root = django_user_model.objects.create_superuser("root", password="x")
    assert role_names(root) == ["Admin"]
