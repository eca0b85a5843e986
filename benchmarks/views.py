"""Pages of the benchmarks app: run history, one run, load profiles, fleet cost."""

from decimal import Decimal

from django.conf import settings
from django.contrib.auth.decorators import permission_required
from django.db.models import Count
from django.shortcuts import get_object_or_404, render

from benchmarks.models import BenchmarkRun, LoadProfile
from hosts.models import Host


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def run_list(request):
    runs = BenchmarkRun.objects.select_related(
        "deployment__host", "load_profile", "engine_config", "requested_by"
    )[:200]
    return render(
        request, "benchmarks/run_list.html", {"runs": runs, "profiles": LoadProfile.objects.all()}
    )


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def run_detail(request, pk):
    run = get_object_or_404(
        BenchmarkRun.objects.select_related("deployment__host", "load_profile", "engine_config"),
        pk=pk,
    )
    return render(request, "benchmarks/run_detail.html", {"run": run})


@permission_required("benchmarks.view_benchmarkrun", raise_exception=True)
def cost(request):
    hosts = Host.objects.annotate(gpu_count=Count("gpus"))
    rows = []
    for host in hosts:
        per_gpu = host.hourly_price / host.gpu_count if host.gpu_count else None
        rows.append({"host": host, "per_gpu_hour": per_gpu, "per_month": host.hourly_price * 730})
    total = sum((h.hourly_price for h in hosts), Decimal("0"))
    return render(
        request,
        "benchmarks/cost.html",
        {
            "rows": rows,
            "total_hour": total,
            "total_month": total * 730,
            "currency": settings.PANEL_CURRENCY,
        },
    )
