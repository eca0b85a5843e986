"""Pages of the scaling app: the fleet's provisioning, one deployment's scaling page (live
signals, capacity at SLO, desired replicas, thresholds, exports, policy), the charts' JSON
and the export downloads. Thin: access check, form, one service call, render."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from hosts.models import Deployment
from scaling import figures
from scaling.forms import ExportForm, PolicyForm
from scaling.models import EngineSample
from scaling.services import exports, pages
from scaling.services.policies import policy_of, save_policy
from scaling.services.state import fleet_states, scaling_state

# Seeing scaling is seeing the fleet; changing a policy is managing a deployment
# (Operators and up: controlpanel.roles).
VIEW = "hosts.view_deployment"
EDIT = "hosts.change_deployment"


def _deployment(pk) -> Deployment:
    return get_object_or_404(Deployment.objects.select_related("host", "active_config"), pk=pk)


@require_GET
@permission_required(VIEW, raise_exception=True)
def fleet(request):
    table = pages.fleet_table(fleet_states(), request.GET.get("status"), request.GET.get("sort"))
    return render(request, "scaling/fleet.html", table)


@require_GET
@permission_required(VIEW, raise_exception=True)
def deployment(request, pk):
    item = _deployment(pk)
    return render(request, "scaling/deployment.html", _page(request, item, None))


@require_POST
@permission_required(VIEW, raise_exception=True)
def policy_edit(request, pk):
    item = _deployment(pk)
    if not request.user.has_perm(EDIT):
        raise PermissionDenied("Operators and up change a deployment's scaling policy.")
    form = PolicyForm(request.POST, instance=policy_of(item))
    if not form.is_valid():
        return render(request, "scaling/deployment.html", _page(request, item, form))
    save_policy(request.user, item, form)
    messages.success(request, f"Scaling policy of {item} saved.")
    return redirect(reverse("scaling:deployment", args=[item.pk]) + "#policy")


@require_GET
@permission_required(VIEW, raise_exception=True)
def signals_json(request, pk):
    """The charts' columns since ``?since=`` (epoch ms; at most the last 15 minutes)."""
    item = get_object_or_404(Deployment, pk=pk)
    floor = timezone.now() - timedelta(seconds=figures.WINDOW_S)
    since = request.GET.get("since")
    try:
        # The charts' times are whole milliseconds: the point drawn last is not sent again.
        after = datetime.fromtimestamp((int(since) + 1) / 1000, tz=UTC) if since else floor
    except (ValueError, OverflowError, OSError):
        return JsonResponse({"error": "since must be milliseconds since the epoch"}, status=400)
    since = max(floor, after)
    return JsonResponse({"deployment": item.pk, **figures.columns(_rows(item, since))})


@require_GET
@permission_required(VIEW, raise_exception=True)
def export(request, pk, kind):
    item = _deployment(pk)
    form = ExportForm(request.GET)
    if not form.is_valid():
        context = {"deployment": item, "kind": kind, "problems": form.problems()}
        return render(request, "scaling/_export_error.html", context, status=400)
    target = exports.export_target(item, scaling_state(item), form.target_params(item.name))
    file = exports.render(kind, target)
    response = HttpResponse(file.text, content_type=f"{file.content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{file.filename}"'
    return response


def _rows(item: Deployment, since) -> list[tuple[float, dict]]:
    # Only the computed signals: a sample's raw snapshot (histogram buckets) is many times
    # larger and no chart needs it.
    rows = (
        EngineSample.objects.filter(deployment=item, time__gte=since)
        .order_by("-time")
        .values_list("time", "signals")[: figures.MAX_POINTS]
    )
    return [(at.timestamp(), signals) for at, signals in reversed(rows)]


def _page(request, item: Deployment, form: PolicyForm | None) -> dict:
    may_edit = request.user.has_perm(EDIT)
    if form is None and may_edit:
        form = PolicyForm(instance=policy_of(item))
    state = scaling_state(item)
    data = figures.columns(_rows(item, timezone.now() - timedelta(seconds=figures.WINDOW_S)))
    return {
        **pages.deployment_context(item, state, request.build_absolute_uri("/")),
        "charts": figures.signal_figures(data, state.slo.ttft_p95_ms, state.slo.itl_p95_ms),
        "may_edit": may_edit,
        "form": form,
    }
