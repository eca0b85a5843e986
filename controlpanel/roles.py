"""The four roles and what each may do, as Django groups with permissions.

Roles are cumulative: an Operator can do all a Viewer can, an Approver all an Operator can,
an Admin everything. The rule that an approver may not approve their own change is enforced on
the change itself, not here. ``sync_roles`` is idempotent: the data migration calls it to create
the groups, and a post_migrate hook calls it again so that models added by later migrations get
their permissions assigned too.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

PANEL_APPS = ("controlpanel", "hosts", "benchmarks", "changes", "scaling")


@dataclass(frozen=True)
class Role:
    name: str
    description: str
    # (app_label, codename) pairs, or "*" patterns handled by permissions_for().
    verbs: tuple[str, ...]
    extra: tuple[tuple[str, str], ...] = ()


VIEWER = Role("Viewer", "Sees the fleet, benchmarks, changes, costs and the audit log.", ("view",))
OPERATOR = Role(
    "Operator",
    "Viewer, plus manages hosts and deployments, runs checks, restarts engines, runs "
    "benchmarks, proposes changes.",
    ("view",),
    extra=(
        ("hosts", "add_host"),
        ("hosts", "change_host"),
        ("hosts", "add_gpu"),
        ("hosts", "change_gpu"),
        ("hosts", "add_deployment"),
        ("hosts", "change_deployment"),
        ("hosts", "add_engineconfig"),
        ("hosts", "add_hostcheck"),
        ("hosts", "add_engineoperation"),
        ("benchmarks", "add_loadprofile"),
        ("benchmarks", "change_loadprofile"),
        ("benchmarks", "add_benchmarkrun"),
        ("benchmarks", "change_benchmarkrun"),
        ("changes", "add_changerequest"),
        ("changes", "change_changerequest"),
        ("changes", "apply_changerequest"),
    ),
)
APPROVER = Role(
    "Approver",
    "Operator, plus approves or rejects changes proposed by someone else, and the first start "
    "of a deployment someone else created on a production host.",
    ("view",),
    extra=OPERATOR.extra + (("changes", "approve_changerequest"), ("hosts", "approve_deployment")),
)
ADMIN = Role(
    "Admin",
    "Everything, including deleting objects, accepting SSH host keys and managing users.",
    ("view", "add", "change", "delete"),
    extra=APPROVER.extra
    + (("hosts", "accept_host_key"), ("changes", "override_changerequest"))
    # Lifting a login lockout early: the failed-login counters of django-axes.
    + (("axes", "view_accessattempt"), ("axes", "delete_accessattempt"))
    # trust_remote_code and the like run code from outside the panel (changes.rules).
    + (("changes", "load_code_changerequest"),)
    + tuple(
        ("auth", f"{verb}_{model}")
        for verb in ("view", "add", "change", "delete")
        for model in ("user", "group")
    ),
)
ROLES = (VIEWER, OPERATOR, APPROVER, ADMIN)


def permissions_for(role: Role, permission_model):
    """The Permission rows ``role`` should hold. Missing ones (models not built yet) are skipped."""
    query = Q(content_type__app_label__in=PANEL_APPS) & Q(
        codename__regex=r"^({})_".format("|".join(role.verbs))
    )
    for app_label, codename in role.extra:
        query |= Q(content_type__app_label=app_label, codename=codename)
    return permission_model.objects.filter(query)


def sync_roles(group_model, permission_model) -> None:
    """Create the role groups and give each exactly its permissions."""
    for role in ROLES:
        group, _ = group_model.objects.get_or_create(name=role.name)
        group.permissions.set(permissions_for(role, permission_model))


def sync_roles_after_migrate(sender, **kwargs):
    """post_migrate hook (see ControlPanelConfig.ready)."""
    from django.contrib.auth.models import Group, Permission

    sync_roles(Group, Permission)


def role_names(user) -> list[str]:
    """The role names a user holds, for display; superusers count as Admin. Read once per
    user object (``controlpanel.permcache`` hands them over with the permissions)."""
    if not user.is_authenticated:
        return []
    if user.is_superuser:
        return [ADMIN.name]
    if not hasattr(user, "_role_names"):
        known = {role.name for role in ROLES}
        user._role_names = [
            name for name in user.groups.values_list("name", flat=True) if name in known
        ]
    return user._role_names
