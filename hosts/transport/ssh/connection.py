"""Reaching an SSH server we trust: host key fingerprints, private keys, the handshake, the
host key check and key authentication.

The server's host key is checked against the SHA256 fingerprint an admin accepted (the text
``ssh-keygen -lf`` prints) right after the key exchange and before authenticating: none stored
→ ``HostKeyUnknown`` carrying the fingerprint to accept; a different one → ``HostKeyMismatch``.
Either way no key is offered and no command runs. Authentication is by private key only: no
passwords, no agent, no keys picked up from ``~/.ssh``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import re
import socket

import paramiko

from hosts.transport.base import AuthError, HostKeyMismatch, HostKeyUnknown, TransportError

log = logging.getLogger(__name__)

_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


def host_key_fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:`` + unpadded base64 of the key blob's SHA-256, as ``ssh-keygen -lf`` prints."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def normalise_fingerprint(value: str | None) -> str | None:
    """Accept the fingerprint alone or the whole ``ssh-keygen -lf`` line it was pasted from."""
    if not value or not value.strip():
        return None
    match = _FINGERPRINT.search(value)
    return match.group(0) if match else value.strip()


def load_private_key(text: str, passphrase: str | None = None) -> paramiko.PKey:
    """An Ed25519, ECDSA or RSA private key from its OpenSSH or PEM text."""
    if not text or "PRIVATE KEY" not in text:
        raise AuthError("no SSH private key (OpenSSH or PEM text) is configured for this host")
    problem: Exception | None = None
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(text), password=passphrase or None)
        except paramiko.PasswordRequiredException:
            raise AuthError("the SSH private key is encrypted: its passphrase is needed") from None
        except (paramiko.SSHException, ValueError, TypeError) as exc:
            problem = exc
    raise AuthError(
        f"the SSH private key could not be read (wrong passphrase, or not an Ed25519, ECDSA or "
        f"RSA key): {problem}"
    )


def where(address: str, port: int) -> str:
    """``address:port`` as people write it (IPv6 in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def open_ssh(address: str, port: int, timeout: float) -> paramiko.Transport:
    """TCP connect and SSH key exchange, nothing more: no key offered, nothing run."""
    place = where(address, port)
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except TimeoutError:
        raise TransportError(f"cannot reach {place}: no answer within {timeout:g} s") from None
    except OSError as exc:
        raise TransportError(f"cannot reach {place}: {exc.strerror or exc}") from None
    ssh = paramiko.Transport(sock)
    # paramiko's defaults (15 s banner and handshake, 30 s auth) ignore ours.
    ssh.banner_timeout = ssh.handshake_timeout = ssh.auth_timeout = timeout
    try:
        ssh.start_client(timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        ssh.close()
        reason = str(exc) or type(exc).__name__
        raise TransportError(f"SSH handshake with {place} failed: {reason}") from None
    if not (ssh.is_active() and ssh.initial_kex_done):
        # start_client returns quietly when its timeout passes mid-negotiation.
        ssh.close()
        raise TransportError(f"SSH handshake with {place} did not complete within {timeout:g} s")
    return ssh


def fetch_host_key(address: str, port: int = 22, timeout: float = 10.0) -> tuple[str, str]:
    """First contact / "test connection": the host key's ``(fingerprint, key type)``, read
    without authenticating, so an admin can compare it with ``ssh-keygen -lf`` on the host."""
    ssh = open_ssh(address, port, timeout)
    try:
        return presented_key(ssh)
    finally:
        ssh.close()


def presented_key(ssh: paramiko.Transport) -> tuple[str, str]:
    """``(fingerprint, key type)`` of the host key the server presented in the key exchange."""
    key = ssh.get_remote_server_key()
    return host_key_fingerprint(key), key.get_name()


def check_host_key(presented: tuple[str, str], accepted: str | None, place: str) -> None:
    """Refuse a server whose key is not the accepted one. Called between key exchange and
    authentication: on a mismatch the (possibly impostor) server never sees our key."""
    fingerprint, key_type = presented
    if accepted is None:
        raise HostKeyUnknown(fingerprint, key_type)
    if fingerprint != accepted:
        log.error(
            "HOST KEY CHANGED for %s: expected %s, presented %s %s; refusing",
            place,
            accepted,
            key_type,
            fingerprint,
        )
        raise HostKeyMismatch(accepted, fingerprint)


def authenticate(ssh: paramiko.Transport, username: str, key: paramiko.PKey, place: str) -> None:
    """Public key authentication, nothing else; a server wanting more is refused."""
    who = f"{username}@{place}"
    try:
        further = ssh.auth_publickey(username, key)
    except paramiko.BadAuthenticationType as exc:
        allowed = ", ".join(exc.allowed_types) or "nothing"
        raise AuthError(f"{who} does not take key authentication (it allows {allowed})") from None
    except paramiko.AuthenticationException:
        raise AuthError(f"{who} refused the SSH key ({key.get_name()})") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise TransportError(f"SSH authentication with {who} failed: {exc}") from None
    if further:
        raise AuthError(f"{who} wants more than a key ({', '.join(further)})")
