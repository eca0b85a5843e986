"""Pages of the changes app."""

from django.contrib.auth.decorators import permission_required
from django.shortcuts import render

from hosts.models import EngineConfig


@permission_required("hosts.view_engineconfig", raise_exception=True)
def change_list(request):
    """Every engine-config version, newest first, with what it changed from the one before."""
    configs = list(
        EngineConfig.objects.select_related("deployment__host", "created_by").order_by(
            "-created_at", "-pk"
        )[:100]
    )
    # One query for all predecessors instead of one per row.
    wanted = {(c.deployment_id, c.version - 1) for c in configs if c.version > 1}
    previous = {
        (c.deployment_id, c.version): c
        for c in EngineConfig.objects.filter(
            deployment_id__in={d for d, _ in wanted}, version__in={v for _, v in wanted}
        )
    }
    rows = [
        {"config": c, "diff": c.diff(previous.get((c.deployment_id, c.version - 1)))}
        for c in configs
    ]
    return render(request, "changes/change_list.html", {"rows": rows})
