from django.contrib import admin

from benchmarks.models import BenchmarkRun, LoadProfile, Price


@admin.register(LoadProfile)
class LoadProfileAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "source", "summary", "created_at"]
    list_filter = ["source"]


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):
    list_display = ["__str__", "deployment", "load_profile", "status", "created_at"]
    list_filter = ["status", "source"]
    raw_id_fields = ["deployment", "engine_config", "load_profile"]


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ["name", "pricing", "hourly_price", "currency", "gpu_model", "gpu_count"]
