from django.contrib import admin

from benchmarks.models import BenchmarkRun, LoadProfile


@admin.register(LoadProfile)
class LoadProfileAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "mode",
        "concurrency",
        "request_rate",
        "input_tokens",
        "output_tokens",
        "num_requests",
    ]


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):
    list_display = ["__str__", "deployment", "load_profile", "status", "created_at"]
    list_filter = ["status"]
