"""Benchmarks in Django's admin: to look at, not to edit. Load profiles are versioned, runs
and imports are records of what was measured, prices feed every cost figure: the panel
changes them and audits it (controlpanel.admin_audited)."""

from django.contrib import admin

from benchmarks.models import BenchmarkRun, ImportJob, LoadProfile, Price
from controlpanel.admin_audited import AuditedReadOnlyAdmin


@admin.register(LoadProfile)
class LoadProfileAdmin(AuditedReadOnlyAdmin):
    list_display = ["name", "version", "source", "summary", "created_at"]
    list_filter = ["source"]
    search_fields = ["name"]


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(AuditedReadOnlyAdmin):
    list_display = ["__str__", "deployment", "load_profile", "status", "created_at"]
    list_filter = ["status", "source"]
    raw_id_fields = ["deployment", "engine_config", "load_profile"]


@admin.register(ImportJob)
class ImportJobAdmin(AuditedReadOnlyAdmin):
    list_display = ["__str__", "deployment", "status", "progress", "run", "created_at"]
    list_filter = ["status"]
    raw_id_fields = ["deployment", "engine_config", "run", "requested_by"]


@admin.register(Price)
class PriceAdmin(AuditedReadOnlyAdmin):
    list_display = ["name", "pricing", "hourly_price", "currency", "gpu_model", "gpu_count"]
