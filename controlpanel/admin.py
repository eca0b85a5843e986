from django.contrib import admin

from controlpanel.models import AuditEntry


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
