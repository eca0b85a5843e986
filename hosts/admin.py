"""The fleet in Django's admin: to look at, not to edit. Hosts, deployments and their configs
are changed in the panel, which reviews and audits every change (an admin edit of a
deployment's model would skip both); the admin keeps lists, search and filters, and an Admin
may still delete a host or deployment taken out of service, audited
(controlpanel.admin_audited)."""

from django.contrib import admin

from controlpanel.admin_audited import AuditedReadOnlyAdmin, ReadOnlyInline
from hosts.engines.redaction import masked
from hosts.models import Deployment, EngineConfig, EngineOperation, Gpu, Host, HostCheck


class GpuInline(ReadOnlyInline):
    model = Gpu
    exclude = ["last_sample"]


@admin.register(Host)
class HostAdmin(AuditedReadOnlyAdmin):
    list_display = ["name", "address", "transport", "port", "status", "hourly_price"]
    search_fields = ["name", "address"]
    list_filter = ["transport", "status"]
    inlines = [GpuInline]
    deletable = True
    # Secrets are set through the panel's host form (write-only) and never shown here, nor is
    # what each secret is bound to.
    exclude = [
        "agent_token",
        "ssh_private_key",
        "ssh_key_passphrase",
        "ssh_host_key_fingerprint",
        "host_readings",
        "credential_bindings",
    ]


@admin.register(Gpu)
class GpuAdmin(AuditedReadOnlyAdmin):
    list_display = ["host", "index", "name", "uuid", "numa_node"]
    list_filter = ["name"]
    exclude = ["last_sample"]


@admin.register(Deployment)
class DeploymentAdmin(AuditedReadOnlyAdmin):
    list_display = ["name", "host", "engine", "engine_version", "model", "port", "status"]
    list_filter = ["engine", "status"]
    search_fields = ["name", "model", "host__name"]
    deletable = True


@admin.register(EngineConfig)
class EngineConfigAdmin(AuditedReadOnlyAdmin):
    list_display = ["deployment", "version", "note", "created_by", "created_at"]
    # Secret flags (--api-key) show masked here as everywhere else.
    exclude = ["settings", "env"]
    readonly_fields = ["masked_settings", "masked_env"]

    @admin.display(description="settings")
    def masked_settings(self, obj):
        return masked(obj.settings)

    @admin.display(description="env")
    def masked_env(self, obj):
        return masked(obj.env)


@admin.register(HostCheck)
class HostCheckAdmin(AuditedReadOnlyAdmin):
    list_display = ["host", "status", "reachable", "latency_ms", "created_at"]
    list_filter = ["status", "reachable"]


@admin.register(EngineOperation)
class EngineOperationAdmin(AuditedReadOnlyAdmin):
    list_display = ["deployment", "kind", "status", "outcome", "created_at"]
    list_filter = ["kind", "status", "outcome"]
