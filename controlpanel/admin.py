from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin

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
