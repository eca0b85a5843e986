"""The home dashboard, the audit log and the health endpoint."""

from decimal import Decimal

from django.contrib.auth.decorators import login_not_required, permission_required
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Count, Sum
from django.http import JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from benchmarks.models import BenchmarkRun
from controlpanel import services
from controlpanel.forms import AuditFilterForm
from controlpanel.models import AuditEntry
from hosts.models import Deployment, Gpu, Host, HostCheck


@permission_required("hosts.view_host", raise_exception=True)
def dashboard(request):
    hosts = list(Host.objects.annotate(gpu_count=Count("gpus")))
    gpu_memory = dict(
        Gpu.objects.values_list("host__name").annotate(total=Sum("memory_bytes")).order_by()
    )
    used = {}
    for name, sample in Gpu.objects.values_list("host__name", "last_sample"):
        used[name] = used.get(name, 0) + ((sample or {}).get("memory_used_bytes") or 0)
    names = [h.name for h in hosts]
    chart = {
        "data": [
            {
                "type": "bar",
                "x": names,
                "y": [round(used.get(n, 0) / 2**30, 1) for n in names],
                "name": "in use",
            },
            {
                "type": "bar",
                "x": names,
                "y": [round((gpu_memory.get(n, 0) - used.get(n, 0)) / 2**30, 1) for n in names],
                "name": "free",
            },
        ],
        "layout": {
            "barmode": "stack",
            "margin": {"t": 10, "b": 40, "l": 50, "r": 10},
            "height": 240,
            "yaxis": {"title": {"text": "GPU memory (GiB)"}},
        },
    }
    context = {
        "host_count": len(hosts),
        "gpu_count": sum(h.gpu_count for h in hosts),
        "fleet_hourly": sum((h.hourly_price for h in hosts), Decimal("0")),
        "deployments": Deployment.objects.select_related("host", "active_config"),
        "recent_runs": BenchmarkRun.objects.select_related("deployment__host", "load_profile")[:5],
        "recent_checks": HostCheck.objects.select_related("host")[:5],
        "recent_audit": AuditEntry.objects.all()[:8],
        "chart": chart,
    }
    return render(request, "controlpanel/dashboard.html", context)


@permission_required("controlpanel.view_auditentry", raise_exception=True)
def audit_log(request):
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        # Invalid filters list nothing: an unfiltered log could pass for the filtered one.
        return render(request, "controlpanel/audit_log.html", {"form": form}, status=400)
    entries = services.audit_entries(form.cleaned_data)
    page = Paginator(entries, 50).get_page(request.GET.get("page"))
    page.object_list = services.audit_page_rows(page.object_list)
    return render(request, "controlpanel/audit_log.html", {"form": form, "page": page})


@permission_required("controlpanel.view_auditentry", raise_exception=True)
def audit_export(request, fmt: str):
    """The filtered log as CSV (streamed) or JSON (at most AUDIT_EXPORT_LIMIT entries)."""
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return JsonResponse({"errors": form.errors.get_json_data()}, status=400)
    entries = services.audit_entries(form.cleaned_data)
    filename = services.audit_export_filename(fmt)
    if fmt == "csv":
        response = StreamingHttpResponse(
            services.audit_csv_lines(entries), content_type="text/csv; charset=utf-8"
        )
    else:
        filters = {k: v for k, v in request.GET.items() if k != "page" and v}
        response = JsonResponse(services.audit_json_export(entries, filters))
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_not_required
@never_cache
def healthz(request):
    """Liveness for load balancers and compose: the process answers and the database does."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return JsonResponse({"status": "ok"})
    except Exception as exc:  # noqa: BLE001 - the answer is the point
        return JsonResponse({"status": "error", "database": str(exc)}, status=503)
