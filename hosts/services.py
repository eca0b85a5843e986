"""Workflows of the hosts app: verbs that change the fleet, each writing the audit log."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlpanel.choices import OperationStatus
from controlpanel.realtime import group_name, publish
from controlpanel.services import audit, snapshot
from hosts.models import Host, HostCheck

HOST_FIELDS = ["name", "address", "transport", "port", "labels", "hourly_price", "description"]


def _stored(host: Host) -> dict:
    # Read back from the database so both sides of a diff have the stored precision
    # (a form's Decimal("2.5") is stored as 2.5000).
    return snapshot(Host.objects.get(pk=host.pk), HOST_FIELDS)


def create_host(actor, form) -> Host:
    with transaction.atomic():
        host = form.save()
        audit(actor, "host.create", host, after=_stored(host))
    return host


def update_host(actor, host: Host, form) -> Host:
    with transaction.atomic():
        before = _stored(host)
        host = form.save()
        after = _stored(host)
        if after != before:
            audit(actor, "host.update", host, before=before, after=after)
    return host


def request_host_check(actor, host: Host) -> HostCheck:
    """Queue a reachability check; the worker picks it up once this transaction commits."""
    from hosts.tasks import check_host

    with transaction.atomic():
        check = HostCheck.objects.create(host=host, requested_by=actor)
        if actor is not None:
            audit(actor, "host.check", host)
        transaction.on_commit(lambda: check_host.delay(check.pk))
    _publish_check(check)
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
        check.detail = _describe(exc, host)[:300]
    else:
        check.reachable = True
        check.latency_ms = round((time.perf_counter() - started) * 1000, 3)
        check.detail = f"{host.transport} port {host.port} answered in {check.latency_ms} ms"
    check.save(update_fields=["reachable", "latency_ms", "detail"])
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


def _describe(exc: OSError, host: Host) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer from {host.address}:{host.port} within {settings.HOST_CHECK_TIMEOUT} s"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {host.address}: {exc.strerror}"
    return f"{host.address}:{host.port}: {exc.strerror or exc}"


def _publish_check(check: HostCheck) -> None:
    publish(group_name("host", check.host_id), "check.updated", check.as_event())
