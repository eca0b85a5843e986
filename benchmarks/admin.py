from django.contrib import admin

from benchmarks.models import BenchmarkRun, ImportJob, LoadProfile, Price
from controlpanel.forms import ADMIN_JSON_FIELDS as JSON_FIELDS


@admin.register(LoadProfile)
class LoadProfileAdmin(admin.ModelAdmin):
    formfield_overrides = JSON_FIELDS
    list_display = ["name", "version", "source", "summary", "created_at"]
    list_filter = ["source"]


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):
    formfield_overrides = JSON_FIELDS
    list_display = ["__str__", "deployment", "load_profile", "status", "created_at"]
    list_filter = ["status", "source"]
    raw_id_fields = ["deployment", "engine_config", "load_profile"]


@admin.register(ImportJob)
class ImportJobAdmin(admin.ModelAdmin):
    list_display = ["__str__", "deployment", "status", "progress", "run", "created_at"]
    list_filter = ["status"]
    raw_id_fields = ["deployment", "engine_config", "run", "requested_by"]
    # The file path and progress are the task's to write.
    readonly_fields = ["path", "bytes_total", "bytes_read", "progress", "phase"]


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ["name", "pricing", "hourly_price", "currency", "gpu_model", "gpu_count"]
