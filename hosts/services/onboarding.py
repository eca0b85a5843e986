"""Onboarding a real host: what the guided page changes on it, each change audited.

* ``generate_agent_token``: a strong token made by the panel, stored encrypted and bound to
  the host's destination; returned once for the install command, never shown again.
* ``fetch_agent_certificate`` / ``pin_agent_certificate``: trust on first use for the agent's
  TLS certificate, like SSH host keys: the panel reads what the agent presents, a person
  compares its SHA-256 fingerprint with ``openssl x509 -fingerprint`` on the server and accepts
  exactly that one (or pastes the PEM the install printed).
* ``generate_ssh_key``: an ed25519 key pair made by the panel (private key encrypted at rest);
  the public line is what goes into ``~/.ssh/authorized_keys``.

What each step's check found is read from the host and its ``HostCheck`` rows by
``hosts.services.onboarding_steps``.
"""

from __future__ import annotations

import hashlib
import io
import re
import secrets
import socket
import ssl
from dataclasses import dataclass

import paramiko
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import transaction

from controlpanel.services import audit
from hosts.choices import HostStatus, TransportKind
from hosts.models import Host
from hosts.services.hosts import set_status
from hosts.services.transports import forget_transport


class OnboardingRefused(ValueError):
    """A step that cannot be taken as asked; nothing was saved. The message says why."""


# ---------------------------------------------------------------------------- agent token


def generate_agent_token(actor, host: Host) -> str:
    """A new agent token for ``host`` (replacing any stored one): the caller shows it once."""
    if host.transport != TransportKind.AGENT:
        raise OnboardingRefused("Only an agent host has a token.")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        replaced = bool(host.agent_token)
        host.enter_secret("agent_token", token)
        host.save(update_fields=["agent_token"])
        # The value never reaches the log: only that it changed, and by whom.
        audit(
            actor,
            "host.agent_token_generated",
            host,
            after={"secrets_changed": ["agent_token"], "replaced": replaced},
        )
    forget_transport(host.pk)
    return token


# ---------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certificate:
    """A PEM certificate as a person compares it: fingerprint, names, expiry."""

    pem: str
    fingerprint: str  # SHA-256 of the DER, as ``openssl x509 -noout -fingerprint -sha256``
    subject: str
    names: list[str]
    not_after: str
    names_address: bool


def describe_certificate(pem: str, address: str) -> Certificate:
    """``pem``'s first certificate; ``OnboardingRefused`` when it is not one."""
    try:
        cert = x509.load_pem_x509_certificate(pem.strip().encode())
    except ValueError:
        raise OnboardingRefused(
            "Not a PEM certificate: paste the whole text from -----BEGIN CERTIFICATE----- to "
            "-----END CERTIFICATE-----."
        ) from None
    der = cert.public_bytes(serialization.Encoding.DER)
    digest = hashlib.sha256(der).hexdigest().upper()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
            str(v) for v in san.get_values_for_type(x509.IPAddress)
        ]
    except x509.ExtensionNotFound:
        names = []
    bare = address.strip("[]").lower()
    return Certificate(
        pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
        fingerprint=":".join(digest[i : i + 2] for i in range(0, len(digest), 2)),
        subject=cert.subject.rfc4514_string(),
        names=names,
        not_after=cert.not_valid_after_utc.strftime("%Y-%m-%d"),
        names_address=bare in (n.lower() for n in names),
    )


def fetch_agent_certificate(host: Host) -> Certificate:
    """The certificate the agent presents now, read without trusting it (nothing is sent but
    the TLS handshake: no token)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    address = host.address.strip("[]")
    try:
        with (
            socket.create_connection(
                (address, host.port), timeout=settings.HOST_CHECK_TIMEOUT
            ) as raw,
            context.wrap_socket(raw, server_hostname=address) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except TimeoutError:
        raise OnboardingRefused(
            f"No answer from {host.address}:{host.port} within {settings.HOST_CHECK_TIMEOUT} s: "
            "is the agent running (step 1) and the port open in the firewall?"
        ) from None
    except ssl.SSLError as exc:
        raise OnboardingRefused(
            f"{host.address}:{host.port} answered, but not with TLS ({exc.reason or exc}): "
            "start the agent with --tls-cert and --tls-key (the step 1 command does)."
        ) from None
    except OSError as exc:
        raise OnboardingRefused(
            f"Cannot reach {host.address}:{host.port}: {exc.strerror or exc}. Is the agent "
            "running (systemctl status llm-agent) and the port open?"
        ) from None
    return describe_certificate(ssl.DER_cert_to_PEM_cert(der), host.address)


def pin_agent_certificate(actor, host: Host, pem: str, *, expected: str = "") -> Host:
    """Pin ``pem`` as the only certificate the agent of ``host`` may present. ``expected``: the
    fingerprint the person accepted (a fetched certificate must still be that one).

    A first pin narrows whom the stored token may go to (from any certificate the system's
    CAs vouch for to this one), so the token stays usable; replacing a pin does not keep it:
    the token is bound to the old certificate and must be generated again."""
    cert = describe_certificate(pem, host.address)
    if expected and cert.fingerprint != expected:
        raise OnboardingRefused(
            f"The agent now presents {cert.fingerprint}, not the {expected} you accepted: "
            "look again."
        )
    if not cert.names_address:
        raise OnboardingRefused(
            f"The certificate names {', '.join(cert.names) or 'no address'}, not "
            f"{host.address}: the panel checks that name. Create it again with "
            f"subjectAltName for {host.address} (the step 1 command does)."
        )
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        if host.transport != TransportKind.AGENT or not host.agent_tls:
            raise OnboardingRefused("Only an agent reached over TLS has a certificate to pin.")
        before = host.agent_ca_cert.strip()
        keep_token = not before and host.agent_token and not host.credential_problem()
        host.agent_ca_cert = cert.pem
        fields = ["agent_ca_cert", "status", "last_error"]
        if keep_token:
            host.enter_secret("agent_token", host.agent_token)
            fields.append("agent_token")
        host.status = HostStatus.UNKNOWN
        host.last_error = ""
        host.save(update_fields=fields)
        audit(
            actor,
            "host.pin_certificate",
            host,
            before={"agent_ca_cert_sha256": _pem_fingerprint(before)},
            after={
                "agent_ca_cert_sha256": cert.fingerprint,
                "subject": cert.subject,
                "token_kept": bool(keep_token),
            },
        )
    forget_transport(host.pk)
    return host


def _pem_fingerprint(pem: str) -> str:
    if not pem:
        return ""
    try:
        return describe_certificate(pem, "").fingerprint
    except OnboardingRefused:
        return "unreadable"


# ---------------------------------------------------------------------------- SSH


def generate_ssh_key(actor, host: Host) -> str:
    """A new ed25519 key pair for ``host`` (replacing the stored key); returns the public
    line for ``~/.ssh/authorized_keys``."""
    if host.transport != TransportKind.SSH:
        raise OnboardingRefused("Only an SSH host logs in with a key.")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        host.enter_secret("ssh_private_key", private)
        host.ssh_key_passphrase = ""
        host.save(update_fields=["ssh_private_key", "ssh_key_passphrase"])
        line = public_key_line(host)
        audit(
            actor,
            "host.ssh_key_generated",
            host,
            after={"secrets_changed": ["ssh_private_key"], "public_key": line},
        )
    forget_transport(host.pk)
    if host.status == HostStatus.AUTH_FAILED:
        set_status(host, HostStatus.UNKNOWN)
    return line


def public_key_line(host: Host) -> str:
    """The ``authorized_keys`` line of the stored private key ("" for none, a key file on the
    workers, or a key that cannot be read)."""
    text = host.ssh_private_key or ""
    if not text or text.startswith("file:"):
        return ""
    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            key = kind.from_private_key(io.StringIO(text), password=host.ssh_key_passphrase or None)
        except (paramiko.SSHException, ValueError):
            continue
        # The comment goes into a shell line on the page: plain characters only.
        comment = re.sub(r"[^A-Za-z0-9._-]", "-", host.name)
        return f"{key.get_name()} {key.get_base64()} llm-control-panel@{comment}"
    return ""
