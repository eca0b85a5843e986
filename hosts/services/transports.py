"""How the panel reaches a host: a transport built from the host's stored settings (secrets
decrypted here only, and only for the destination they were entered for), and the poller's
cache of one open transport per host."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from django.conf import settings

from controlpanel.crypto import DecryptionError, reveal
from hosts.choices import TransportKind
from hosts.credentials import SECRET_FIELDS
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
# would cost more than the reading); operations open their own. Threads share these
# transports (the fleet poll, a benchmark's own readings, the embedded worker's jobs), so a
# transport is held through a lease while in use: one replaced or forgotten meanwhile is
# closed by its last holder, never under a reader (that read failed with "Bad file
# descriptor" and marked a healthy host unreachable).
# Fields transport_for builds from (besides the deployments' launch style, which is read
# when the transport is built): an edit of any other field (a price, labels, a description)
# keeps the open connection.
CONNECTION_FIELDS = (
    "transport",
    "address",
    "port",
    "agent_tls",
    "agent_ca_cert",
    "ssh_username",
    "ssh_python",
    "ssh_host_key_fingerprint",
    "credential_bindings",
    *SECRET_FIELDS,
)
MAX_KNOWN_VERSIONS = 8


def connection_key(host: Host) -> str:
    """A digest of how ``host`` is reached (secrets included, never kept in clear)."""
    digest = hashlib.sha256()
    for name in CONNECTION_FIELDS:
        value = getattr(host, name)
        # An unreadable secret reads as "": its stored ciphertext tells two of them apart.
        digest.update(repr(getattr(value, "stored", value)).encode() + b"\0")
    return digest.hexdigest()


class _Pooled:
    """A cached poll transport: the host row versions (``updated_at``) known to be reached
    the way it was built, its holders, and whether it was replaced or forgotten."""

    __slots__ = ("versions", "key", "transport", "users", "retired")

    def __init__(self, version, key: str, transport: Transport):
        self.versions, self.key, self.transport = {version}, key, transport
        self.users, self.retired = 1, False


_poll_transports: dict[int, _Pooled] = {}
_poll_lock = threading.Lock()


class PollLease:
    """A hold on the cached poll transport of a host, taken when made (so a refusal raises
    there); ``with poll_transport(host) as transport:`` releases it at the block's end."""

    def __init__(self, host: Host):
        self._entry: _Pooled | None = _acquire(host)
        self.transport = self._entry.transport

    def __enter__(self) -> Transport:
        return self.transport

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        entry, self._entry = self._entry, None
        if entry is None:
            return
        with _poll_lock:
            entry.users -= 1
            closing = entry.retired and entry.users == 0
        if closing:
            entry.transport.close()


def poll_transport(host: Host) -> PollLease:
    """A lease on the cached transport to ``host`` for polling (built on first use, rebuilt
    when how the host is reached changed): ``with poll_transport(host) as transport:``."""
    return PollLease(host)


def _acquire(host: Host) -> _Pooled:
    with _poll_lock:
        entry = _poll_transports.get(host.pk)
        if entry is not None and host.updated_at in entry.versions:
            entry.users += 1
            return entry
    key = connection_key(host)  # may read deferred secrets: not under the lock
    with _poll_lock:
        entry = _poll_transports.get(host.pk)
        if entry is not None and entry.key == key:
            # The row changed, not the way to the host: keep the open connection. (Several
            # versions: a job holding the row as it was before an edit polls beside beat.)
            if len(entry.versions) >= MAX_KNOWN_VERSIONS:
                entry.versions.clear()
            entry.versions.add(host.updated_at)
            entry.users += 1
            return entry
    fresh = _Pooled(host.updated_at, key, transport_for(host))
    with _poll_lock:
        closing = _retire(_poll_transports.get(host.pk))
        _poll_transports[host.pk] = fresh
    if closing is not None:
        closing.close()
    return fresh


def _retire(entry: _Pooled | None) -> Transport | None:
    """Mark ``entry`` replaced (called under the lock); its transport when nobody holds it
    (the caller closes it outside the lock), else its last holder will."""
    if entry is None:
        return None
    entry.retired = True
    return entry.transport if entry.users == 0 else None


def has_poll_transport(host: Host) -> bool:
    """Whether ``poll_transport(host)`` has its transport already (built for this host row)."""
    with _poll_lock:
        entry = _poll_transports.get(host.pk)
        return entry is not None and host.updated_at in entry.versions


def forget_transport(pk: int) -> None:
    """Drop the cached transport of host ``pk`` (its settings changed, or it failed): closed
    now, or by its last holder."""
    with _poll_lock:
        closing = _retire(_poll_transports.pop(pk, None))
    if closing is not None:
        closing.close()
