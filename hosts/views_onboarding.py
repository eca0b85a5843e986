"""The guided setup of a host (``/hosts/<pk>/onboard/``): install the agent or set up SSH,
trust the host, check the connection. Thin: access, one service call, render."""

from django.contrib import messages
from django.contrib.auth.decorators import login_not_required, permission_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from hosts.choices import TransportKind
from hosts.models import Host
from hosts.services.agent_install import (
    TLS_CERT,
    agent_install,
    agent_zipapp,
    download_key,
    download_key_valid,
)
from hosts.services.hosts import accept_host_key
from hosts.services.onboarding import (
    OnboardingRefused,
    describe_certificate,
    fetch_agent_certificate,
    generate_agent_token,
    generate_ssh_key,
    pin_agent_certificate,
    public_key_line,
)
from hosts.services.onboarding_steps import check_running, latest_check, steps_for


@never_cache
@permission_required("hosts.change_host", raise_exception=True)
def onboard(request, pk):
    host = get_object_or_404(Host, pk=pk)
    return _page(request, host)


@never_cache
@permission_required("hosts.change_host", raise_exception=True)
def onboard_status(request, pk):
    """The steps' states and the check's sub-results, re-fetched by htmx (polled while a check
    runs)."""
    host = get_object_or_404(Host, pk=pk)
    return render(request, "hosts/_onboard_status.html", _status(host) | {"oob": True})


@require_POST
@never_cache
@permission_required("hosts.change_host", raise_exception=True)
def onboard_token(request, pk):
    """Generate (or replace) the agent token: this response is the only one that shows it."""
    host = get_object_or_404(Host, pk=pk)
    try:
        token = generate_agent_token(request.user, host)
    except OnboardingRefused as exc:
        messages.error(request, str(exc))
        return redirect("hosts:onboard", host.pk)
    host.refresh_from_db()
    return _page(request, host, token=token)


@require_POST
@never_cache
@permission_required("hosts.change_host", raise_exception=True)
def onboard_fetch_certificate(request, pk):
    host = get_object_or_404(Host, pk=pk)
    try:
        offered = fetch_agent_certificate(host)
    except OnboardingRefused as exc:
        messages.error(request, str(exc))
        return redirect("hosts:onboard", host.pk)
    return _page(request, host, offered=offered)


@require_POST
@permission_required("hosts.change_host", raise_exception=True)
def onboard_pin(request, pk):
    """Pin a pasted PEM, or accept the fetched certificate whose fingerprint the person saw
    (fetched again: what is pinned is what the agent presents now)."""
    host = get_object_or_404(Host, pk=pk)
    expected = request.POST.get("fingerprint", "")
    try:
        pem = fetch_agent_certificate(host).pem if expected else request.POST.get("pem", "")
        host = pin_agent_certificate(request.user, host, pem, expected=expected)
    except OnboardingRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Certificate pinned. Now test the connection.")
    return redirect("hosts:onboard", host.pk)


@require_POST
@permission_required("hosts.change_host", raise_exception=True)
def onboard_ssh_key(request, pk):
    host = get_object_or_404(Host, pk=pk)
    try:
        generate_ssh_key(request.user, host)
    except OnboardingRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Key pair generated: append the public key on the server.")
    return redirect("hosts:onboard", host.pk)


@require_POST
@permission_required("hosts.accept_host_key", raise_exception=True)
def onboard_accept_key(request, pk):
    host = get_object_or_404(Host, pk=pk)
    offered = request.POST.get("fingerprint", "")
    try:
        accept_host_key(request.user, host, offered)
    except ValueError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Host key {offered} accepted. Now test the connection.")
    return redirect("hosts:onboard", host.pk)


@login_not_required
@require_GET
def agent_download(request, pk):
    """The agent zipapp for ``curl`` on the GPU server: no login, a signed key bound to the
    host instead (from the onboarding page, valid a day)."""
    if not download_key_valid(pk, request.GET.get("key", "")):
        raise Http404("no such download")
    response = HttpResponse(agent_zipapp(), content_type="application/zip")
    response["Content-Disposition"] = 'attachment; filename="llm-agent.pyz"'
    return response


def _status(host: Host) -> dict:
    check = latest_check(host)
    return {
        "host": host,
        "check": check,
        "steps": steps_for(host, check),
        "running": check_running(check),
    }


def _page(request, host: Host, *, token: str | None = None, offered=None):
    context = _status(host) | {"token": token, "offered": offered}
    if host.transport == TransportKind.AGENT:
        url = request.build_absolute_uri(reverse("hosts:agent_download", args=[host.pk]))
        context["install"] = agent_install(host, f"{url}?key={download_key(host.pk)}", token)
        context["tls_cert_path"] = TLS_CERT
        if host.agent_ca_cert.strip():
            try:
                context["pinned"] = describe_certificate(host.agent_ca_cert, host.address)
            except OnboardingRefused:
                context["pinned"] = None
    else:
        context["public_key"] = public_key_line(host)
        kind = host.ssh_offered_key_type or "ssh-ed25519"
        # ssh-keyscan -t takes the family: ed25519, ecdsa, rsa.
        context["keyscan_type"] = "ecdsa" if kind.startswith("ecdsa") else kind.removeprefix("ssh-")
    return render(request, "hosts/onboarding.html", context)
