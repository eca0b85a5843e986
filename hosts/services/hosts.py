"""Host rows: create and update hosts (secrets audited as "changed", never with their values),
trust a host key, and record the host's status (``set_status``, ``offer_host_key``)."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from controlpanel.realtime import group_name, publish
from controlpanel.services import audit, snapshot
from hosts.choices import HostStatus
from hosts.models import Host
from hosts.services.transports import forget_transport
from hosts.transport.base import HostKeyMismatch, HostKeyUnknown

log = logging.getLogger(__name__)

HOST_FIELDS = [
    "name",
    "address",
    "transport",
    "port",
    "labels",
    "hourly_price",
    "description",
    "agent_tls",
    "ssh_username",
    "ssh_python",
    "ssh_host_key_fingerprint",
]
# Secrets are audited as "changed", never with their values.
SECRET_FIELDS = ["agent_token", "ssh_private_key", "ssh_key_passphrase"]


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
        secrets_before = _secret_marks(host.pk)
        host = form.save(commit=False)
        if any(before[f] != getattr(host, f) for f in ("address", "port", "transport")):
            # Another address may be another machine: its key must be accepted again.
            host.ssh_host_key_fingerprint = ""
            host.status = HostStatus.UNKNOWN
        host.save()
        form.save_m2m()
        after = _stored(host)
        changed = [k for k, v in _secret_marks(host.pk).items() if v != secrets_before[k]]
        if changed:
            after["secrets_changed"] = changed
        if after != before:
            audit(actor, "host.update", host, before=before, after=after)
    forget_transport(host.pk)
    return host


def _secret_marks(pk) -> dict:
    # The stored ciphertexts: they differ exactly when a secret was replaced.
    return dict(
        zip(
            SECRET_FIELDS,
            Host.objects.filter(pk=pk).values_list(*SECRET_FIELDS).first() or [None] * 3,
            strict=True,
        )
    )


def accept_host_key(actor, host: Host) -> Host:
    """An admin trusts the key the host offered (first contact, or a reinstalled server)."""
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        if not host.ssh_offered_fingerprint:
            raise ValueError("The host has not offered a key: test the connection first.")
        before = {"ssh_host_key_fingerprint": host.ssh_host_key_fingerprint}
        host.ssh_host_key_fingerprint = host.ssh_offered_fingerprint
        host.ssh_offered_fingerprint = ""
        host.status = HostStatus.UNKNOWN
        host.last_error = ""
        host.save(
            update_fields=[
                "ssh_host_key_fingerprint",
                "ssh_offered_fingerprint",
                "status",
                "last_error",
            ]
        )
        audit(
            actor,
            "host.accept_host_key",
            host,
            before=before,
            after={"ssh_host_key_fingerprint": host.ssh_host_key_fingerprint},
        )
    forget_transport(host.pk)
    return host


def offer_host_key(host: Host, exc: HostKeyUnknown | HostKeyMismatch) -> None:
    """Keep the key the host presented for an admin to accept; a changed key is an error
    (another machine, or a reinstalled one) and is audited."""
    if isinstance(exc, HostKeyMismatch):
        host.ssh_offered_fingerprint = exc.presented
        status = HostStatus.HOST_KEY_CHANGED
    else:
        host.ssh_offered_fingerprint = exc.fingerprint
        host.ssh_offered_key_type = exc.key_type
        status = HostStatus.HOST_KEY
    host.save(update_fields=["ssh_offered_fingerprint", "ssh_offered_key_type"])
    set_status(host, status, str(exc))
    if isinstance(exc, HostKeyMismatch):
        log.error("host %s: %s", host.name, exc)
        audit(None, "host.host_key_changed", host, after={"presented": exc.presented})


def set_status(host: Host, status: HostStatus, error: str = "") -> None:
    """Record what the last contact with ``host`` found and tell its live page."""
    now = timezone.now()
    host.status = status
    host.last_error = error[:500]
    fields = ["status", "last_error", "last_poll_at"]
    host.last_poll_at = now
    if status == HostStatus.ONLINE:
        host.last_seen_at = now
        fields.append("last_seen_at")
    Host.objects.filter(pk=host.pk).update(**{f: getattr(host, f) for f in fields})
    publish(
        group_name("host", host.pk),
        "host.status",
        {"status": host.status, "label": host.get_status_display(), "error": host.last_error},
    )
