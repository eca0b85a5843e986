"""How the panel reaches a host: a transport built from the host's stored settings (secrets
decrypted here only, and only for the destination they were entered for), and the poller's
cache of one open transport per host."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path

from django.conf import settings

from controlpanel.crypto import DecryptionError, reveal
from hosts.choices import TransportKind
from hosts.models import Deployment, Host
from hosts.transport.agent import AgentTransport
from hosts.transport.base import Transport, TransportError
from hosts.transport.ssh import SshTransport


class CredentialsNotBound(TransportError):
    """The stored credentials were entered for another destination than the host's current
    one (its address, port, transport or TLS settings changed since): nothing is sent."""


class KeyFileRefused(TransportError):
    """A ``file:`` SSH key reference outside SSH_KEY_DIR, or one that cannot be read."""


def transport_for(host: Host, deployment: Deployment | None = None) -> Transport:
    """A transport to ``host`` built from its stored settings (secrets decrypted here only).
    Over SSH, how engines are launched is the deployment's choice: operations pass theirs.

    Every path that talks to a host (checks, polls, operations, benchmarks' readings) comes
    through here, so this is where a credential is refused for a destination it was not
    entered for."""
    problem = host.credential_problem()
    if problem:
        raise CredentialsNotBound(f"not sent: {problem}")
    try:
        if host.transport == TransportKind.SSH:
            return _ssh_transport(host, deployment)
        return _agent_transport(host)
    except DecryptionError as exc:
        raise TransportError(str(exc)) from None


def _ssh_transport(host: Host, deployment: Deployment | None) -> SshTransport:
    timeout = settings.TRANSPORT_TIMEOUT
    key = reveal(host.ssh_private_key)
    if key.startswith("file:"):
        key = read_key_file(key[5:])
    return SshTransport(
        host.address.strip("[]"),
        host.port,
        host.ssh_username,
        private_key=key,
        passphrase=reveal(host.ssh_key_passphrase) or None,
        host_key_fingerprint=host.ssh_host_key_fingerprint or None,
        launch_style=deployment.launch_style if deployment else _ssh_launch_style(host),
        docker_image=(deployment.docker_image or None) if deployment else None,
        python=host.ssh_python or "python3",
        remote_dir=settings.SSH_REMOTE_DIR,
        connect_timeout=timeout,
        command_timeout=max(timeout, 30.0),
    )


def _agent_transport(host: Host) -> AgentTransport:
    return AgentTransport(
        host.address.strip("[]"),
        host.port,
        reveal(host.agent_token),
        tls=host.agent_tls,
        ca_cert=host.agent_ca_cert or None,
        timeout=settings.TRANSPORT_TIMEOUT,
    )


MAX_KEY_FILE_BYTES = 64 * 1024


def key_file_path(reference: str) -> Path:
    """The file a ``file:`` key reference names, which must lie inside SSH_KEY_DIR once
    symlinks and ``..`` are resolved. A reference outside it is refused with the same words
    whether or not such a file exists, so the error cannot be used to probe the worker."""
    if not settings.SSH_KEY_DIR:
        raise KeyFileRefused("SSH key files are disabled (SSH_KEY_DIR is empty): paste the key")
    root = Path(settings.SSH_KEY_DIR).resolve()
    path = (root / reference).resolve()  # an absolute reference replaces root here
    if path == root or not path.is_relative_to(root):
        raise KeyFileRefused(f"SSH key files must be inside SSH_KEY_DIR ({root})")
    return path


def read_key_file(reference: str) -> str:
    path = key_file_path(reference)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        # Inside the key directory, saying what is wrong with a file reveals nothing new.
        raise KeyFileRefused(f"cannot read the SSH key file {path}: {exc.strerror}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileRefused(f"the SSH key file {path} is too large to be a private key")
    return data.decode(errors="replace")


def _ssh_launch_style(host: Host) -> str:
    # Reading telemetry and engine states: the style the host's engines share (only how
    # engines are found differs between styles, not what is read).
    styles = {d.launch_style for d in host.deployments.all()}
    return styles.pop() if len(styles) == 1 else "process"


# The poller keeps one transport per host per worker process (an SSH handshake a second
# would cost more than the reading); operations open their own.
_poll_transports: dict[int, tuple[datetime, Transport]] = {}
_poll_lock = threading.Lock()


def poll_transport(host: Host) -> Transport:
    """The cached transport to ``host`` for polling, rebuilt when the host row changed."""
    with _poll_lock:
        cached = _poll_transports.get(host.pk)
        if cached and cached[0] == host.updated_at:
            return cached[1]
    transport = transport_for(host)
    with _poll_lock:
        old = _poll_transports.pop(host.pk, None)
        _poll_transports[host.pk] = (host.updated_at, transport)
    if old:
        old[1].close()
    return transport


def has_poll_transport(host: Host) -> bool:
    """Whether ``poll_transport(host)`` has its transport already (built for this host row)."""
    with _poll_lock:
        cached = _poll_transports.get(host.pk)
    return cached is not None and cached[0] == host.updated_at


def forget_transport(pk: int) -> None:
    """Close and drop the cached transport of host ``pk`` (its settings changed, or it failed)."""
    with _poll_lock:
        old = _poll_transports.pop(pk, None)
    if old:
        old[1].close()
