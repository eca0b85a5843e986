"""Pages of the hosts app. Thin: check access, call a service, render."""

from datetime import UTC, datetime, timedelta
from functools import cache

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.functional import SimpleLazyObject
from django.utils.html import json_script
from django.views.decorators.http import require_POST

from hosts.choices import OperationKind
from hosts.forms import HostFilterForm, HostForm
from hosts.models import Deployment, EngineOperation, Host, HostCheck
from hosts.services import fleet_list, telemetry_series
from hosts.services.checks import request_host_check
from hosts.services.hosts import HostChangeRefused, accept_host_key, create_host, update_host
from hosts.services.operations import OperationRefused, request_operation

PARTS = {
    "facts": "hosts/_facts.html",
    "deployments": "hosts/_deployments.html",
    "operations": "hosts/_operations.html",
    "checks": "hosts/_checks.html",
}
BACKFILL = timedelta(minutes=10)


@permission_required("hosts.view_host", raise_exception=True)
def host_list(request):
    """One page of the fleet (``?page=``), narrowed by ``?q=&status=&gpu=&label=``; a filter
    value that does not validate is explained on the form and ignored. The page's data is
    read lazily: the template shares the rendered list between viewers (pagecache), and a
    list taken from there runs none of its queries."""
    form = HostFilterForm(request.GET)
    form.is_valid()
    chosen = form.chosen()
    asked = request.GET.get("page")
    hosts = fleet_list.filter_hosts(fleet_list.list_rows(), chosen)
    page = SimpleLazyObject(lambda: Paginator(hosts, fleet_list.PAGE_SIZE).get_page(asked))
    context = {
        "form": form,
        "page": page,
        "hosts": SimpleLazyObject(lambda: page.object_list),
        "filtered": chosen.active,
        "fleet_size": lambda: Host.objects.count() if chosen.active else page.paginator.count,
        "gpu_models": fleet_list.gpu_models,
        "page_note": lambda: _page_note(asked, page),
    }
    return render(request, "hosts/host_list.html", context)


def _page_note(asked: str | None, page) -> str:
    """Why the page shown is not the one asked for ("" when it is)."""
    if asked in (None, "") or asked.strip() == str(page.number):
        return ""
    shown = f"page {page.number} of {page.paginator.num_pages}"
    return f"There is no page {asked[:20]!r}; showing {shown}."


@permission_required("hosts.view_host", raise_exception=True)
def host_detail(request, pk):
    host = get_object_or_404(Host, pk=pk)
    context = _context(host)
    # Called only when the shared part is rendered: a viewer served the stored part reads none
    # of the 10 minutes of samples.
    context["telemetry_script"] = lambda: json_script(
        _recent_samples(host, timezone.now() - BACKFILL), "telemetry-data"
    )
    return render(request, "hosts/host_detail.html", context)


@permission_required("hosts.view_host", raise_exception=True)
def host_part(request, pk, part):
    """One fragment of the host page, re-fetched by htmx when a live event arrives."""
    if part not in PARTS:
        raise Http404("no such part")
    host = get_object_or_404(Host, pk=pk)
    return render(request, PARTS[part], _context(host))


@permission_required("hosts.view_host", raise_exception=True)
def host_checks(request, pk):
    host = get_object_or_404(Host, pk=pk)
    return render(request, "hosts/_checks.html", {"host": host, "checks": _recent_checks(host)})


@permission_required("hosts.view_host", raise_exception=True)
def host_telemetry(request, pk):
    """The charts' data: ``?range=10m|1h|24h|7d|30d|1y`` or a zoomed ``?start=&end=`` (ms), or
    with ``?since=`` (ms; at most the last 10 minutes) the 1-second samples since then: the
    live charts' backfill after a dropped socket."""
    host = get_object_or_404(Host, pk=pk)
    if "since" not in request.GET:
        try:
            window = telemetry_series.window_for_request(request.GET)
        except telemetry_series.BadSeriesRequest as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        return JsonResponse(telemetry_series.host_series(host, window))
    floor = timezone.now() - BACKFILL
    since = request.GET.get("since")
    try:
        since = max(floor, datetime.fromtimestamp(int(since) / 1000, tz=UTC)) if since else floor
    except (ValueError, OverflowError, OSError):
        return JsonResponse({"error": "since must be milliseconds since the epoch"}, status=400)
    return JsonResponse(_recent_samples(host, since))


@permission_required("hosts.add_host", raise_exception=True)
def host_create(request):
    form = HostForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        host = create_host(request.user, form)
        # A new host is set up step by step: install or SSH key, trust, check.
        messages.success(request, f"Host {host} added. Follow the steps to connect it.")
        return redirect("hosts:onboard", host.pk)
    return render(request, "hosts/host_form.html", {"form": form})


@permission_required("hosts.change_host", raise_exception=True)
def host_edit(request, pk):
    host = get_object_or_404(Host, pk=pk)
    form = HostForm(request.POST or None, instance=host, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            update_host(request.user, host, form)
        except HostChangeRefused as exc:
            # The form had its say; the service checks again whatever the caller.
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        else:
            messages.success(request, f"Host {host} saved.")
            return redirect(host)
    return render(request, "hosts/host_form.html", {"form": form, "host": host})


@require_POST
@permission_required("hosts.add_hostcheck", raise_exception=True)
def host_check(request, pk):
    """ "Test connection": reachability, then the transport itself (token, host key) and the
    inventory."""
    host = get_object_or_404(Host, pk=pk)
    request_host_check(request.user, host)
    if request.headers.get("HX-Request"):
        # No fragment here: the worker may already have moved on, and a snapshot arriving
        # after a live refresh would show an older state. The table re-fetches itself instead.
        return HttpResponse(status=204, headers={"HX-Trigger": "checks-changed"})
    messages.info(request, f"Testing the connection to {host}…")
    return redirect(host)


@require_POST
@permission_required("hosts.accept_host_key", raise_exception=True)
def host_accept_key(request, pk):
    host = get_object_or_404(Host, pk=pk)
    offered = request.POST.get("fingerprint", "")
    try:
        # The admin accepts what they saw, not whatever the host offers by the time they click.
        accept_host_key(request.user, host, offered)
    except ValueError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Host key {offered} accepted for {host}.")
    return redirect(host)


@require_POST
@permission_required("hosts.add_engineoperation", raise_exception=True)
def deployment_restart(request, pk):
    deployment = get_object_or_404(Deployment, pk=pk)
    try:
        request_operation(request.user, deployment, OperationKind.RESTART)
    except OperationRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.info(request, f"Restarting {deployment}…")
    return redirect(deployment.host)


@permission_required("hosts.view_engineoperation", raise_exception=True)
def operation_detail(request, pk):
    operation = get_object_or_404(
        EngineOperation.objects.select_related(
            "deployment__host", "config", "previous_config", "requested_by"
        ),
        pk=pk,
    )
    return render(request, "hosts/operation_detail.html", {"operation": operation})


def _context(host: Host) -> dict:
    """The host page's data, each read only when a template first uses it: a viewer served
    the shared page body (pagecache) reads none of it."""
    gpus = cache(lambda: list(host.gpus.order_by("index")))
    deployments = cache(
        lambda: list(
            Deployment.objects.filter(host=host)
            .select_related("active_config")
            .prefetch_related("gpus")
        )
    )
    return {
        "host": host,
        "gpus": SimpleLazyObject(gpus),
        "deployments": SimpleLazyObject(deployments),
        "operations": EngineOperation.objects.filter(deployment__host=host).select_related(
            "deployment", "config", "previous_config", "requested_by"
        )[:10],
        "checks": _recent_checks(host),
        "numa": SimpleLazyObject(lambda: _numa(host, gpus(), deployments())),
    }


def _numa(host: Host, gpus: list, deployments: list) -> list[dict]:
    """Per NUMA node: its CPUs, the GPUs hanging off it, the engines pinned to it."""
    nodes = {
        n.get("node"): {"node": n.get("node"), "cpus": n.get("cpus"), "gpus": [], "engines": []}
        for n in host.numa_nodes or []
    }
    for gpu in gpus:
        nodes.setdefault(
            gpu.numa_node, {"node": gpu.numa_node, "cpus": "", "gpus": [], "engines": []}
        )
        nodes[gpu.numa_node]["gpus"].append(gpu)
    for deployment in deployments:
        placement = (deployment.active_config.placement if deployment.active_config else {}) or {}
        node = placement.get("numa_node")
        if node is not None:
            nodes.setdefault(node, {"node": node, "cpus": "", "gpus": [], "engines": []})
            nodes[node]["engines"].append((deployment, placement))
    return sorted(nodes.values(), key=lambda n: (n["node"] is None, n["node"] or 0))


def _recent_samples(host: Host, since) -> dict:
    """The 1-second samples since ``since`` in the charts' shape
    (``hosts.services.telemetry_series.host_series``; plotly reads epoch ms as dates)."""
    now = timezone.now()
    window = telemetry_series.Window(since, now, "raw", 1, "10m")
    return telemetry_series.host_series(host, window)


def _recent_checks(host):
    return HostCheck.objects.filter(host=host).select_related("requested_by")[:10]
