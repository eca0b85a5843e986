"""Host rows: create and update hosts (secrets audited as "changed", never with their values),
trust a host key, and record the host's status (``set_status``, ``offer_host_key``).

Two rules guard an update whatever the caller (form, admin, API): a host pointed at another
destination keeps no credential that was not entered again for it (``HostChangeRefused``
otherwise; the other transport's leftovers and the SSH host-key trust are dropped), and only
an Admin (``hosts.change_host_protection``) changes the labels that set how many approvals
its changes need."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from controlpanel.realtime import group_name, publish
from controlpanel.services import audit, snapshot
from hosts.choices import HostStatus
from hosts.credentials import SECRET_FIELDS, TRANSPORT_SECRETS, same_secret
from hosts.models import Host
from hosts.services.transports import connection_key, forget_transport
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
    "agent_ca_cert",
    "ssh_username",
    "ssh_python",
    "ssh_host_key_fingerprint",
]
PROTECTION_PERMISSION = "hosts.change_host_protection"


class HostChangeRefused(ValueError):
    """An update the rules do not allow; nothing was saved. The message says what to do."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def _stored(host: Host) -> dict:
    # Read back from the database so both sides of a diff have the stored precision
    # (a form's Decimal("2.5") is stored as 2.5000).
    return _snapshot(Host.objects.get(pk=host.pk))


def _snapshot(host: Host) -> dict:
    data = snapshot(host, HOST_FIELDS)
    data["destination"] = host.destination
    return data


def may_change_protection(actor) -> bool:
    """The system (actor None) and Admins may; the one rule for the form and the service."""
    return actor is None or actor.has_perm(PROTECTION_PERMISSION)


def create_host(actor, form) -> Host:
    with transaction.atomic():
        host = form.save()
        audit(actor, "host.create", host, after=_stored(host))
    return host


def update_host(actor, host: Host, form) -> Host:
    """Save the form's changes to ``host``; ``HostChangeRefused`` (nothing saved) when they
    keep a credential for a new destination or change protection without the permission."""
    with transaction.atomic():
        stored = Host.objects.select_for_update().get(pk=host.pk)
        before = _snapshot(stored)
        host = form.save(commit=False)
        entered = host.entered_secrets
        if host.protection != stored.protection and not may_change_protection(actor):
            raise HostChangeRefused(_protection_refusal(stored), field="labels")
        cleared = _drop_trust_if_moved(stored, host)
        host.save()
        form.save_m2m()
        after = _stored(host)
        changed = sorted(
            name
            for name in SECRET_FIELDS
            if name in entered or not same_secret(getattr(host, name), getattr(stored, name))
        )
        if changed:
            after["secrets_changed"] = changed
        if cleared:
            after["credentials_cleared"] = cleared
        if after != before:
            audit(actor, "host.update", host, before=before, after=after)
        if host.protection != stored.protection:
            audit(
                actor,
                "host.protection_change",
                host,
                before={"protection": stored.protection},
                after={"protection": host.protection},
            )
    if connection_key(host) != connection_key(stored):
        # Only a new way to the host drops the open poll connection: a price or label edit
        # during a run keeps it (its holders finish on it either way).
        forget_transport(host.pk)
    return host


def _drop_trust_if_moved(stored: Host, host: Host) -> list[str]:
    """When ``host`` points elsewhere than ``stored`` did, nothing trusted for the old
    destination may follow it: refuse a kept credential of the new transport, drop the other
    transport's leftovers and the accepted SSH host key. Returns what was dropped."""
    if stored.destination == host.destination:
        return []
    cleared = []
    for name in SECRET_FIELDS:
        value = getattr(host, name)
        if not value or name in host.entered_secrets:
            continue
        if not same_secret(value, getattr(stored, name)):
            continue  # a new value, set by the caller for this destination
        if name in TRANSPORT_SECRETS[host.transport]:
            label = Host._meta.get_field(name).verbose_name
            raise HostChangeRefused(
                f"The host now points at {host.destination} (it was {stored.destination}): "
                f"enter the {label} again. A stored credential is only ever sent to the "
                "destination it was entered for.",
                field=name,
            )
        setattr(host, name, "")
        cleared.append(name)
    if host.ssh_host_key_fingerprint or host.ssh_offered_fingerprint:
        # Another address may be another machine: its key must be accepted again.
        host.ssh_host_key_fingerprint = ""
        host.ssh_offered_fingerprint = ""
        host.ssh_offered_key_type = ""
        cleared.append("ssh_host_key_fingerprint")
    host.status = HostStatus.UNKNOWN
    return cleared


def _protection_refusal(stored: Host) -> str:
    keys = ", ".join(stored.protection) or "protection"
    return (
        f"Only an Admin may change the label {keys}: it sets how many approvals this host's "
        f"changes need (now {_describe_protection(stored)}). Put it back as it was to save "
        "your other changes, or ask an Admin."
    )


def _describe_protection(host: Host) -> str:
    return ", ".join(f"{k}={v}" if v is not None else f"no {k}" for k, v in host.protection.items())


class OfferedKeyChanged(ValueError):
    """The key on offer is not the one the admin was shown."""


def accept_host_key(actor, host: Host, expected: str) -> Host:
    """An admin trusts the key the host offered (first contact, or a reinstalled server):
    ``expected``, the fingerprint they were shown, checked under the row lock, so that a key
    offered after the page was drawn is never the one accepted."""
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        if not host.ssh_offered_fingerprint:
            raise ValueError("The host has not offered a key: test the connection first.")
        if not expected or expected != host.ssh_offered_fingerprint:
            raise OfferedKeyChanged("The offered key changed since the page was shown: look again.")
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
