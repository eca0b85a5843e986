"""The home dashboard: the fleet, its deployments and the latest runs, checks and audit."""

from decimal import Decimal

from django.contrib.auth.decorators import login_not_required, permission_required
from django.db.models import Count, Sum
from django.http import HttpResponsePermanentRedirect
from django.shortcuts import render
from django.templatetags.static import static

from benchmarks.models import RUN_DOCUMENTS, BenchmarkRun
from changes.views_advisor import fleet_context
from controlpanel.models import AuditEntry
from home.attention import attention
from hosts.credentials import SECRET_FIELDS
from hosts.models import Deployment, Gpu, Host, HostCheck

# What the dashboard's short lists never show stays in the database: the runs' documents
# (RUN_DOCUMENTS) and the hosts' credentials (decrypted per row when read).
HOST_SECRETS = SECRET_FIELDS


def _memory_chart(hosts: list[Host]) -> dict:
    """Stacked bars of GPU memory in use and free per host (GiB), from the GPUs' last sample."""
    gpu_memory = dict(
        Gpu.objects.values_list("host__name").annotate(total=Sum("memory_bytes")).order_by()
    )
    used = {}
    for name, sample in Gpu.objects.values_list("host__name", "last_sample"):
        used[name] = used.get(name, 0) + ((sample or {}).get("memory_used_bytes") or 0)
    names = [h.name for h in hosts]
    return {
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


@permission_required("hosts.view_host", raise_exception=True)
def dashboard(request):
    hosts = list(Host.objects.annotate(gpu_count=Count("gpus")))
    context = {
        "host_count": len(hosts),
        "gpu_count": sum(h.gpu_count for h in hosts),
        "fleet_hourly": sum((h.hourly_price for h in hosts), Decimal("0")),
        "deployments": Deployment.objects.select_related("host", "active_config"),
        "recent_runs": BenchmarkRun.objects.select_related("deployment__host", "load_profile")
        .defer(*RUN_DOCUMENTS, *(f"deployment__host__{f}" for f in HOST_SECRETS))
        .defer("load_profile__spec")[:5],
        "recent_checks": HostCheck.objects.select_related("host").defer(
            *(f"host__{f}" for f in HOST_SECRETS)
        )[:5],
        "recent_audit": AuditEntry.objects.all()[:8],
        "chart": _memory_chart(hosts),
        "attention": attention(request.user),
        **fleet_context(),
    }
    return render(request, "home/dashboard.html", context)


@login_not_required
def favicon(request):
    """Browsers ask for /favicon.ico whatever the page links; answer with the static icon
    (also on the login page, hence no login)."""
    return HttpResponsePermanentRedirect(static("controlpanel/favicon.svg"))
