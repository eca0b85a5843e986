"""Pages of the hosts app. Thin: check access, call a service, render."""

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.db.models import Count, Prefetch
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from hosts import services
from hosts.forms import HostForm
from hosts.models import Deployment, Host, HostCheck


@permission_required("hosts.view_host", raise_exception=True)
def host_list(request):
    hosts = Host.objects.annotate(
        gpu_count=Count("gpus", distinct=True), deployment_count=Count("deployments", distinct=True)
    )
    return render(request, "hosts/host_list.html", {"hosts": hosts})


@permission_required("hosts.view_host", raise_exception=True)
def host_detail(request, pk):
    host = get_object_or_404(
        Host.objects.prefetch_related(
            "gpus",
            Prefetch(
                "deployments",
                queryset=Deployment.objects.select_related("active_config").prefetch_related(
                    "gpus"
                ),
            ),
        ),
        pk=pk,
    )
    return render(request, "hosts/host_detail.html", {"host": host, "checks": _recent_checks(host)})


@permission_required("hosts.view_host", raise_exception=True)
def host_checks(request, pk):
    """The checks table alone, re-fetched by htmx when a live event arrives."""
    host = get_object_or_404(Host, pk=pk)
    return render(request, "hosts/_checks.html", {"host": host, "checks": _recent_checks(host)})


@permission_required("hosts.add_host", raise_exception=True)
def host_create(request):
    form = HostForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        host = services.create_host(request.user, form)
        messages.success(request, f"Host {host} added.")
        return redirect(host)
    return render(request, "hosts/host_form.html", {"form": form})


@permission_required("hosts.change_host", raise_exception=True)
def host_edit(request, pk):
    host = get_object_or_404(Host, pk=pk)
    form = HostForm(request.POST or None, instance=host)
    if request.method == "POST" and form.is_valid():
        services.update_host(request.user, host, form)
        messages.success(request, f"Host {host} saved.")
        return redirect(host)
    return render(request, "hosts/host_form.html", {"form": form, "host": host})


@require_POST
@permission_required("hosts.add_hostcheck", raise_exception=True)
def host_check(request, pk):
    host = get_object_or_404(Host, pk=pk)
    services.request_host_check(request.user, host)
    if request.headers.get("HX-Request"):
        # No fragment here: the worker may already have moved on, and a snapshot arriving
        # after a live refresh would show an older state. The table re-fetches itself instead.
        return HttpResponse(status=204, headers={"HX-Trigger": "checks-changed"})
    messages.info(request, f"Checking {host}…")
    return redirect(host)


def _recent_checks(host):
    return HostCheck.objects.filter(host=host).select_related("requested_by")[:10]
