from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User

from controlpanel.models import AuditEntry
from controlpanel.services import audit


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor_name", "action", "object_repr"]
    list_filter = ["action"]
    search_fields = ["actor_name", "object_repr", "action"]

    # The audit log is append-only, in the admin as everywhere.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# Login throttling (django-axes). The panel keeps failed logins in its audit log, so axes'
# own access and failure logs stay off and out of the admin.
admin.site.unregister(AccessLog)
admin.site.unregister(AccessFailureLog)
admin.site.unregister(AccessAttempt)


@admin.register(AccessAttempt)
class LoginAttemptAdmin(AccessAttemptAdmin):
    """Failed-login counters; deleting one lifts its lockout (audited as login.unlocked)."""

    def delete_model(self, request, obj):
        self._audit_unlock(request, [obj])
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        self._audit_unlock(request, list(queryset))
        super().delete_queryset(request, queryset)

    def _audit_unlock(self, request, attempts):
        for attempt in attempts:
            audit(
                request.user,
                "login.unlocked",
                after={
                    "username": attempt.username,
                    "address": attempt.ip_address,
                    "failures": attempt.failures_since_start,
                },
                remote_addr=request.META.get("REMOTE_ADDR"),
            )


# Users and roles are managed here (Django's admin is the panel's user management). Who holds
# which role decides who may approve and apply changes, so every change to an account's roles,
# flags or a role's permissions is written to the audit log with its before and after.
def _account(user) -> dict:
    return {
        "is_active": user.is_active,
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "roles": sorted(user.groups.values_list("name", flat=True)) if user.pk else [],
    }


def _role(group) -> dict:
    perms = group.permissions.values_list("content_type__app_label", "codename")
    return {"permissions": sorted(f"{app}.{code}" for app, code in perms) if group.pk else []}


class _AuditedAccounts:
    """Audits saves and deletes of the registered model with ``snapshot``'s before/after."""

    action: str
    snapshot = staticmethod(lambda obj: {})

    def save_model(self, request, obj, form, change):
        model = type(obj)
        stored = model.objects.filter(pk=obj.pk).first() if change else None
        request._audit_before = self.snapshot(stored) if stored else {}
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        before, after = getattr(request, "_audit_before", {}), self.snapshot(form.instance)
        if before != after:
            verb = "changed" if change else "created"
            audit(
                request.user,
                f"{self.action}.{verb}",
                form.instance,
                before=before or None,
                after=after,
                remote_addr=request.META.get("REMOTE_ADDR"),
            )

    def delete_model(self, request, obj):
        audit(request.user, f"{self.action}.deleted", obj, before=self.snapshot(obj))
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            audit(request.user, f"{self.action}.deleted", obj, before=self.snapshot(obj))
        super().delete_queryset(request, queryset)


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(_AuditedAccounts, UserAdmin):
    """Accounts: changes to roles, active/staff/superuser flags audited as ``user.*``."""

    action = "user"
    snapshot = staticmethod(_account)


@admin.register(Group)
class AuditedGroupAdmin(_AuditedAccounts, GroupAdmin):
    """Roles: changes to a role's permissions audited as ``role.*``."""

    action = "role"
    snapshot = staticmethod(_role)
