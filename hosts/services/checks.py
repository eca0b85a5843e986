"""Host checks: a queued row per check, the worker's TCP probe and transport test (first
contact over SSH offers the host key), and the scheduler's sweep over every host."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlpanel.choices import OperationStatus
from controlpanel.jobs import enqueue_on_commit
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit
from hosts.choices import CheckOutcome, HostStatus, TransportKind
from hosts.models import Host, HostCheck
from hosts.services.hosts import offer_host_key, set_status
from hosts.services.inventory import refresh_inventory
from hosts.services.transports import CredentialsNotBound, transport_for
from hosts.transport.base import AuthError, HostKeyMismatch, HostKeyUnknown, TransportError
from hosts.transport.ssh import fetch_host_key


def request_host_check(actor, host: Host) -> HostCheck:
    """Queue a reachability check; the worker picks it up once this transaction commits."""
    with transaction.atomic():
        check = HostCheck.objects.create(host=host, requested_by=actor)
        if actor is not None:
            audit(actor, "host.check", host)
        # "queued" is sent before the task is: on commit, in this order. Sent after it, a
        # quick worker's "running" reached the page first and "queued" overwrote it.
        transaction.on_commit(lambda: _publish_check(check))
        enqueue_on_commit("hosts.tasks.check_host", check.pk)
    return check


def run_host_check(check: HostCheck) -> HostCheck:
    """Open a TCP connection to the host's transport port and record what happened."""
    check.transition_to(OperationStatus.RUNNING)
    _publish_check(check)
    host = check.host
    started = time.perf_counter()
    try:
        with socket.create_connection(
            (host.address.strip("[]"), host.port), timeout=settings.HOST_CHECK_TIMEOUT
        ):
            pass
    except OSError as exc:
        check.reachable = False
        check.outcome = CheckOutcome.UNREACHABLE
        check.detail = _describe(exc, host)[:300]
        set_status(host, HostStatus.UNREACHABLE, check.detail)
    else:
        check.reachable = True
        check.latency_ms = round((time.perf_counter() - started) * 1000, 3)
        check.detail = f"{host.transport} port {host.port} answered in {check.latency_ms} ms"
        check.outcome = CheckOutcome.PORT_OPEN
        if host.has_credentials or host.transport == TransportKind.SSH:
            check.outcome, said = _test_transport(host)
            check.detail = (check.detail + "; " + said)[:300]
    # SUCCEEDED below means the check ran to its end; what it found is the outcome.
    check.save(update_fields=["reachable", "latency_ms", "detail", "outcome"])
    check.transition_to(OperationStatus.SUCCEEDED)
    _publish_check(check)
    return check


def fail_host_check(check: HostCheck, error: str) -> None:
    """Record an unexpected failure of the check itself (not an unreachable host)."""
    check.refresh_from_db()
    if not check.is_finished:
        check.transition_to(OperationStatus.FAILED, error=error[:2000])
        _publish_check(check)


def check_all_hosts() -> list[HostCheck]:
    """The scheduler's periodic sweep: one check per host, and forget old checks."""
    cutoff = timezone.now() - timedelta(days=settings.HOST_CHECK_RETENTION_DAYS)
    HostCheck.objects.filter(created_at__lt=cutoff).delete()
    return [request_host_check(None, host) for host in Host.objects.all()]


def _test_transport(host: Host) -> tuple[CheckOutcome, str]:
    """Talk to the host for real: identity, then inventory. The outcome, and what happened
    in one line."""
    if host.transport == TransportKind.SSH and not host.ssh_host_key_fingerprint:
        return _first_contact(host)
    if not host.has_credentials:
        return CheckOutcome.PORT_OPEN, "no credentials stored"
    try:
        with transport_for(host) as transport:
            info = transport.info()
            refresh_inventory(host, transport.inventory())
    except CredentialsNotBound as exc:
        # Nothing was sent: the host was pointed elsewhere since its credentials were entered.
        set_status(host, HostStatus.AUTH_FAILED, str(exc))
        return CheckOutcome.AUTH_FAILED, f"credentials {exc}"
    except HostKeyMismatch as exc:
        offer_host_key(host, exc)
        return CheckOutcome.HOST_KEY, str(exc)
    except AuthError as exc:
        set_status(host, HostStatus.AUTH_FAILED, str(exc))
        return CheckOutcome.AUTH_FAILED, f"credentials refused: {exc}"
    except TransportError as exc:
        set_status(host, HostStatus.ERROR, str(exc))
        return CheckOutcome.FAILED, f"connection failed: {exc}"
    host.agent_version = info.get("agent_version") or ""
    host.libraries = reported_libraries(info.get("libraries"))
    host.save(update_fields=["agent_version", "libraries"])
    source = info.get("telemetry_source") or "none"
    gpus = host.gpus.count()
    where = f"{info.get('kind', host.transport)} on {info.get('hostname', '?')}"
    return CheckOutcome.CONNECTED, f"{where}: {gpus} GPU(s), telemetry from {source}"


def _first_contact(host: Host) -> tuple[CheckOutcome, str]:
    # An SSH host whose key nobody accepted yet: learn the key and offer it to an admin,
    # without authenticating to a machine we cannot identify.
    try:
        fingerprint, key_type = fetch_host_key(
            host.address.strip("[]"), host.port, settings.TRANSPORT_TIMEOUT
        )
    except TransportError as exc:
        set_status(host, HostStatus.ERROR, str(exc))
        return CheckOutcome.FAILED, f"SSH handshake failed: {exc}"
    offer_host_key(host, HostKeyUnknown(fingerprint, key_type))
    said = f"first contact: the host key is {key_type} {fingerprint}; an admin must accept it"
    return CheckOutcome.HOST_KEY, said


def reported_libraries(value) -> dict[str, str]:
    """A host's ``{package: version}`` as stored: strings, bounded, whatever the host sent."""
    if not isinstance(value, dict):
        return {}
    return {str(name)[:100]: str(version)[:60] for name, version in list(value.items())[:50]}


def _describe(exc: OSError, host: Host) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer from {host.address}:{host.port} within {settings.HOST_CHECK_TIMEOUT} s"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {host.address}: {exc.strerror}"
    return f"{host.address}:{host.port}: {exc.strerror or exc}"


def _publish_check(check: HostCheck) -> None:
    publish(group_name("host", check.host_id), "check.updated", check.as_event())
