"""The home dashboard: the fleet, its deployments and the latest runs, checks and audit."""

from decimal import Decimal
from functools import cache

from django.contrib.auth.decorators import login_not_required, permission_required
from django.db.models import Case, Count, F, FloatField, Sum, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.http import HttpResponsePermanentRedirect
from django.shortcuts import render
from django.templatetags.static import static
from django.utils.functional import SimpleLazyObject
from django.utils.html import json_script

from benchmarks.models import RUN_DOCUMENTS, BenchmarkRun
from changes.views_advisor import fleet_context
from controlpanel.models import AuditEntry
from home.attention import attention
from hosts.choices import DeploymentStatus
from hosts.credentials import SECRET_FIELDS
from hosts.models import Deployment, Gpu, Host, HostCheck

# What the dashboard's short lists never show stays in the database: the runs' documents
# (RUN_DOCUMENTS) and the hosts' credentials (decrypted per row when read).
HOST_SECRETS = SECRET_FIELDS


# Lists and the chart are capped whatever the fleet's size (issue 22: 500 hosts); each links
# on to the full list.
CHART_HOSTS = 20
DEPLOYMENTS_SHOWN = 10
# GPU memory in use, from each GPU's newest reading (a JSON field), summed by the database.
MEMORY_USED = Cast(KeyTextTransform("memory_used_bytes", "last_sample"), FloatField())
# The deployments card shows the ones that need a look first.
DEPLOYMENT_ORDER = Case(
    *(
        When(status=status, then=Value(rank))
        for rank, status in enumerate(
            (
                DeploymentStatus.FAILED,
                DeploymentStatus.DEGRADED,
                DeploymentStatus.STARTING,
                DeploymentStatus.UNKNOWN,
                DeploymentStatus.STOPPED,
            )
        )
    ),
    default=Value(9),
)


def _memory_chart() -> dict:
    """Stacked bars of GPU memory in use and free (GiB) for the CHART_HOSTS hosts with the
    most in use, from the GPUs' last sample: one grouped query, however many hosts."""
    rows = list(
        Gpu.objects.values("host__name")
        .annotate(total=Sum("memory_bytes"), used=Sum(MEMORY_USED))
        .order_by(F("used").desc(nulls_last=True), "host__name")[:CHART_HOSTS]
    )
    names = [row["host__name"] for row in rows]
    used = [(row["used"] or 0) / 2**30 for row in rows]
    free = [row["total"] / 2**30 - u for row, u in zip(rows, used, strict=True)]
    return {
        "data": [
            {"type": "bar", "x": names, "y": [round(u, 1) for u in used], "name": "in use"},
            {"type": "bar", "x": names, "y": [round(f, 1) for f in free], "name": "free"},
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
    """The fleet's cards are shared between viewers of a role (pagecache), so their data is
    read lazily: cards taken from the cache run none of these queries. "Needs my attention"
    is the user's own and always read."""
    hosts = cache(lambda: Host.objects.aggregate(count=Count("pk"), hourly=Sum("hourly_price")))
    fleet = cache(fleet_context)
    chart = cache(_memory_chart)
    context = {
        "host_count": SimpleLazyObject(lambda: hosts()["count"]),
        "gpu_count": SimpleLazyObject(Gpu.objects.count),
        "fleet_hourly": SimpleLazyObject(lambda: hosts()["hourly"] or Decimal("0")),
        "deployment_count": SimpleLazyObject(Deployment.objects.count),
        # Callables (the template calls them), each built once: even building these querysets
        # costs CPU that a viewer served the stored cards should not spend.
        "deployments": cache(_deployments),
        "recent_runs": cache(
            lambda: (
                BenchmarkRun.objects.select_related("deployment__host", "load_profile")
                .defer(*RUN_DOCUMENTS, *(f"deployment__host__{f}" for f in HOST_SECRETS))
                .defer("load_profile__spec")[:5]
            )
        ),
        "recent_checks": cache(
            lambda: HostCheck.objects.select_related("host").defer(
                *(f"host__{f}" for f in HOST_SECRETS)
            )[:5]
        ),
        "recent_audit": cache(lambda: AuditEntry.objects.all()[:8]),
        "chart": SimpleLazyObject(chart),
        # json_script cannot serialise a lazy object: the template takes the script whole.
        "chart_script": lambda: json_script(chart(), "gpu-memory-chart-data"),
        "chart_hosts": CHART_HOSTS,
        "attention": attention(request.user),
        "findings": SimpleLazyObject(lambda: fleet()["findings"]),
        "findings_more": SimpleLazyObject(lambda: fleet()["findings_more"]),
        # A callable, not a lazy object: timesince needs the datetime itself (or None).
        "advisor_last_ran": lambda: fleet()["advisor_last_ran"],
    }
    return render(request, "home/dashboard.html", context)


def _deployments():
    """The dashboard's deployments: the ones to look at first, capped."""
    return (
        Deployment.objects.select_related("host", "active_config")
        .defer(*(f"host__{f}" for f in HOST_SECRETS))
        .order_by(DEPLOYMENT_ORDER, "host__name", "name")[:DEPLOYMENTS_SHOWN]
    )


@login_not_required
def favicon(request):
    """Browsers ask for /favicon.ico whatever the page links; answer with the static icon
    (also on the login page, hence no login)."""
    return HttpResponsePermanentRedirect(static("controlpanel/favicon.svg"))
