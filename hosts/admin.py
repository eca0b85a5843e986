from django.contrib import admin

from controlpanel.forms import ADMIN_JSON_FIELDS
from hosts.engines.redaction import masked
from hosts.models import Deployment, EngineConfig, EngineOperation, Gpu, Host, HostCheck


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    exclude = ["last_sample"]


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    formfield_overrides = ADMIN_JSON_FIELDS
    list_display = ["name", "address", "transport", "port", "status", "hourly_price"]
    search_fields = ["name", "address"]
    list_filter = ["transport", "status"]
    inlines = [GpuInline]
    # Secrets are set through the panel's host form (write-only) and never shown here; the
    # host key is accepted through the panel's "accept" action, which audits it. What each
    # secret is bound to (credential_bindings) is not editable anywhere (editable=False).
    exclude = [
        "agent_token",
        "ssh_private_key",
        "ssh_key_passphrase",
        "ssh_host_key_fingerprint",
        "host_readings",
    ]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["host", "index", "name", "uuid", "numa_node"]
    list_filter = ["name"]


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    formfield_overrides = ADMIN_JSON_FIELDS
    list_display = ["name", "host", "engine", "engine_version", "model", "port", "status"]
    list_filter = ["engine", "status"]
    filter_horizontal = ["gpus"]


@admin.register(EngineConfig)
class EngineConfigAdmin(admin.ModelAdmin):
    list_display = ["deployment", "version", "created_by", "created_at"]
    # Secret flags (--api-key) show masked here as everywhere else.
    exclude = ["settings", "env"]
    readonly_fields = ["masked_settings", "masked_env"]

    @admin.display(description="settings")
    def masked_settings(self, obj):
        return masked(obj.settings)

    @admin.display(description="env")
    def masked_env(self, obj):
        return masked(obj.env)

    def has_change_permission(self, request, obj=None):
        return False  # immutable: a change is the next version


@admin.register(HostCheck)
class HostCheckAdmin(admin.ModelAdmin):
    list_display = ["host", "status", "reachable", "latency_ms", "created_at"]
    list_filter = ["status", "reachable"]


@admin.register(EngineOperation)
class EngineOperationAdmin(admin.ModelAdmin):
    list_display = ["deployment", "kind", "status", "outcome", "created_at"]
    list_filter = ["kind", "status", "outcome"]

    def has_change_permission(self, request, obj=None):
        return False  # a record of what happened
