"""The SSH transport: reach a GPU server that runs no agent of ours, with an SSH key only.

Trust first. The server's host key is checked against the SHA256 fingerprint an admin accepted
(the text ``ssh-keygen -lf`` prints) right after the key exchange and before authenticating:
none stored → ``HostKeyUnknown`` carrying the fingerprint to accept; a different one →
``HostKeyMismatch``. Either way no key is offered and no command runs. Authentication is by
private key only: no passwords, no agent, no keys picked up from ``~/.ssh``.

Commands. SSH carries a command line, not an argv, so every command this module sends is a
constant ``sh -c`` script whose variable parts are positional arguments, each passed through
``shlex.join``; argv lists come from ``hosts.engines.launch`` after ``LaunchConfig.validated()``
and engine names are checked before a connection is even opened. Secrets in the engine's
environment go to a 0600 file (sourced or handed to systemd/docker), never onto a command line.

Engines run in one of three launch styles:

* ``process``: a detached process group (``setsid``) started from ``<remote_dir>/<name>/``,
  which holds ``config.json`` (the LaunchConfig), ``env``, ``engine.pid``, ``engine.log``
  (the previous run's in ``engine.log.1``) and ``state.json`` (timestamps);
* ``systemd``: a unit ``llm-<name>.service`` rendered by ``render_systemd``;
* ``docker``: a container ``llm-<name>`` started by ``render_docker``'s ``docker run``.

Readiness is checked like the agent does: ``GET /health`` then ``GET /v1/models`` on the
engine's port, sent through an SSH ``direct-tcpip`` channel to the host's loopback (nothing
needs to be reachable from the panel but port 22). Servers with TCP forwarding disabled get the
same requests from a one-line ``python3 -c`` on the host instead.

Telemetry comes from ``nvidia-smi`` CSV queries (``nvidia_smi.py``) plus ``/proc``; hosts
without ``nvidia-smi`` report ``source: "none"``, or ``"simulator"`` when simulated engines of
ours run there (their ``/simulator/gpus`` readings).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import io
import json
import logging
import re
import secrets
import select
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import paramiko

from hosts.agent.host import LIBRARIES
from hosts.engines.launch import (
    LaunchConfig,
    LaunchError,
    render_docker,
    render_process,
    render_systemd,
)
from hosts.transport import nvidia_smi, procfs
from hosts.transport.base import (
    ApplyOutcome,
    AuthError,
    HostKeyMismatch,
    HostKeyUnknown,
    Transport,
    TransportError,
    check_engine_name,
)

log = logging.getLogger("hosts.transport.ssh")

LAUNCH_STYLES = ("process", "systemd", "docker")
LOG_LINES_ON_FAILURE = 50
STATUS_LAST_LINES = 20
MAX_LOG_LINES = 10000
HTTP_BODY_LIMIT = 4 * 1024 * 1024
POLL_INTERVAL = 0.25

# Options that reach a command line (paths, program names): plain characters only, so nothing
# an admin types can read as a second flag or a shell construct even before quoting.
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_.,:/@+=~-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


# --------------------------------------------------------------------------- host keys, keys


def host_key_fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:`` + unpadded base64 of the key blob's SHA-256, as ``ssh-keygen -lf`` prints."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


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


def _where(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _open_ssh(address: str, port: int, timeout: float) -> paramiko.Transport:
    """TCP connect and SSH key exchange, nothing more: no key offered, nothing run."""
    where = _where(address, port)
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except TimeoutError:
        raise TransportError(f"cannot reach {where}: no answer within {timeout:g} s") from None
    except OSError as exc:
        raise TransportError(f"cannot reach {where}: {exc.strerror or exc}") from None
    ssh = paramiko.Transport(sock)
    # paramiko's defaults (15 s banner and handshake, 30 s auth) ignore ours.
    ssh.banner_timeout = ssh.handshake_timeout = ssh.auth_timeout = timeout
    try:
        ssh.start_client(timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        ssh.close()
        reason = str(exc) or type(exc).__name__
        raise TransportError(f"SSH handshake with {where} failed: {reason}") from None
    if not (ssh.is_active() and ssh.initial_kex_done):
        # start_client returns quietly when its timeout passes mid-negotiation.
        ssh.close()
        raise TransportError(f"SSH handshake with {where} did not complete within {timeout:g} s")
    return ssh


def fetch_host_key(address: str, port: int = 22, timeout: float = 10.0) -> tuple[str, str]:
    """First contact / "test connection": the host key's ``(fingerprint, key type)``, read
    without authenticating, so an admin can compare it with ``ssh-keygen -lf`` on the host."""
    ssh = _open_ssh(address, port, timeout)
    try:
        key = ssh.get_remote_server_key()
        return host_key_fingerprint(key), key.get_name()
    finally:
        ssh.close()


def _normalise_fingerprint(value: str | None) -> str | None:
    """Accept the fingerprint alone or the whole ``ssh-keygen -lf`` line it was pasted from."""
    if not value or not value.strip():
        return None
    match = _FINGERPRINT.search(value)
    return match.group(0) if match else value.strip()


# --------------------------------------------------------------------------- remote commands


def sh(script: str, *args: object) -> str:
    """A command line running the constant ``script`` with ``args`` as ``$1 …``, every word
    quoted: the remote login shell turns it back into exactly this argv."""
    return shlex.join(["sh", "-c", script, "sh", *(str(a) for a in args)])


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def text(self) -> str:
        return (self.err or self.out).strip()


def _libraries(text: str) -> dict[str, str]:
    """LIBRARIES_PY's output; {} when the host's python is missing or printed anything else."""
    try:
        found = json.loads(text.strip() or "{}")
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items()}


def _sections(text: str, marker: str) -> list[tuple[str, str]]:
    """Output printed as ``<marker> name`` lines each followed by its body → [(name, body)].
    The marker is random per call, so no file content can forge a section."""
    found: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        if line.startswith(marker + " "):
            found.append((line[len(marker) + 1 :].strip(), []))
        elif found:
            found[-1][1].append(line)
    return [(name, "\n".join(body).strip("\n")) for name, body in found]


# The engine directory listing every status, telemetry and info call reads. Variables: m
# (section marker), r (remote dir), one (one engine name, or empty for all).
_ENGINE_FILES = r"""
if [ -n "$one" ]; then set -- "$r/$one/"; else set -- "$r"/*/; fi
for d in "$@"; do
  [ -f "${d}config.json" ] || [ -f "${d}state.json" ] || continue
  n=${d%/}; n=${n##*/}
  echo "$m engine"; echo "$n"
  p=$(cat "${d}engine.pid" 2>/dev/null)
  echo "$m pid"; echo "$p"
  case "$p" in
    ''|*[!0-9]*) ;;
    *) echo "$m stat"; cat "/proc/$p/stat" 2>/dev/null
       echo "$m cpus"; sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null;;
  esac
  # The echo after each file: one without a final newline must not swallow the next marker.
  echo "$m state"; cat "${d}state.json" 2>/dev/null; echo
  echo "$m config"; cat "${d}config.json" 2>/dev/null; echo
done
"""
ENGINE_FILES_SCRIPT = "m=$1; r=$2; one=$3\n" + _ENGINE_FILES

# $1 engine dir, $2 working directory, then the engine's argv. The inner shell records its own
# pid (which ``exec`` hands to the engine: pid = process group = session), loads the 0600 env
# file and becomes the engine; stdin/stdout/stderr are redirected so the SSH session can end.
START_SCRIPT = r"""
d=$1; w=$2; shift 2
[ ! -f "$d/engine.log" ] || mv -f "$d/engine.log" "$d/engine.log.1"
rm -f "$d/engine.pid"
cd "$w" || { echo "the working directory $w does not exist" >&2; exit 97; }
setsid nohup sh -c \
  'echo $$ > "$1/engine.pid" && set -a && . "$1/env" && set +a && shift && exec "$@"' \
  llm-engine "$d" "$@" > "$d/engine.log" 2>&1 < /dev/null &
i=0
while [ ! -s "$d/engine.pid" ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i+1)); done
p=$(cat "$d/engine.pid" 2>/dev/null)
[ -n "$p" ] || { echo "the engine did not start" >&2; exit 98; }
echo "$p"
# An engine that refuses its config may already be gone (and reaped): no stat line then, and
# the readiness wait reports how it ended, with its log. Not a failure of starting it.
cat "/proc/$p/stat" 2>/dev/null || true
"""

# $1 pid (= process group), $2 grace period in tenths of a second: TERM to the whole group
# (engines fork workers), KILL to whatever is left after the grace period. "Left" means a
# member that is not a zombie: where init does not reap (some containers), a dead engine stays
# a zombie, and `kill -0` would keep answering for it. (`kill -SIG -PGID`, without `--`: dash's
# kill refuses `--`.)
STOP_SCRIPT = r"""
p=$1; n=$2
alive() { grep -qs -e ") [^ZX] [0-9]* $p " /proc/[0-9]*/stat; }
alive || exit 0
kill -TERM "-$p" 2>/dev/null
i=0
while alive; do
  if [ "$i" -ge "$n" ]; then kill -KILL "-$p" 2>/dev/null; echo killed; sleep 0.2; break; fi
  sleep 0.1; i=$((i+1))
done
"""

TAIL_SCRIPT = 'tail -n "$1" "$2" 2>/dev/null || true'
MKDIR_SCRIPT = 'umask 077 && mkdir -p "$1"'

# $1 marker, $2 nvidia-smi, $3 GPU query, $4 legacy GPU query, $5 apps query, $6 format,
# $7 remote dir, $8 "inventory" for the slower, rarer extras.
TELEMETRY_SCRIPT = (
    r"""
m=$1; smi=$2; r=$7; one=
echo "$m hostname"; cat /proc/sys/kernel/hostname
echo "$m loadavg"; cat /proc/loadavg
echo "$m meminfo"; cat /proc/meminfo
echo "$m stat1"; head -n 1 /proc/stat
if command -v "$smi" >/dev/null 2>&1; then
  o=$("$smi" "$3" "$6" 2>&1); rc=$?
  case "$o" in *"is not a valid field"*) o=$("$smi" "$4" "$6" 2>&1); rc=$?; echo "$m legacy";; esac
  echo "$m gpus"; printf '%s\n' "$o"
  echo "$m gpus-rc"; echo "$rc"
  if [ "$rc" -eq 0 ]; then echo "$m apps"; "$smi" "$5" "$6" 2>/dev/null; fi
  if [ "$8" = inventory ]; then echo "$m smi"; "$smi" 2>/dev/null | head -n 5; fi
else
  echo "$m no-smi"
fi
sleep 0.2
echo "$m stat2"; head -n 1 /proc/stat
if [ "$8" = inventory ]; then
  echo "$m nproc"; getconf _NPROCESSORS_ONLN
  echo "$m cpuinfo"; grep -m 1 -i '^model name' /proc/cpuinfo
  echo "$m nodes"
  for f in /sys/devices/system/node/node[0-9]*; do
    [ -r "$f/cpulist" ] && echo "${f##*/node} $(cat "$f/cpulist")"
  done
fi
"""
    + _ENGINE_FILES
)

# $1 marker, then sysfs PCI addresses (validated): NUMA node and local CPUs of each GPU.
PCI_SCRIPT = r"""
m=$1; shift
for a in "$@"; do
  echo "$m $a"
  cat "/sys/bus/pci/devices/$a/numa_node" 2>/dev/null || echo
  cat "/sys/bus/pci/devices/$a/local_cpulist" 2>/dev/null || echo
done
"""

# Readiness probe for servers that refuse TCP forwarding: the same GET from the host itself.
# Proxies are switched off: the engine is on the host's own loopback.
# Versions of the engines' Python packages in the host's interpreter (the agent's
# /v1/info "libraries"); prints {} where importlib.metadata is missing (Python < 3.8).
LIBRARIES_PY = """\
import json, sys
try:
    from importlib import metadata
except ImportError:
    metadata = None
found = {}
for name in sys.argv[1:] if metadata else ():
    try:
        found[name] = metadata.version(name)
    except Exception:
        pass
sys.stdout.write(json.dumps(found))
"""

HTTP_GET_PY = """\
import sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    r = opener.open(sys.argv[1], timeout=float(sys.argv[2]))
    status, body = r.status, r.read(4194304)
except urllib.error.HTTPError as e:
    status, body = e.code, e.read(65536)
except Exception:
    status, body = 0, b""
sys.stdout.write(str(status) + "\\n")
sys.stdout.flush()
sys.stdout.buffer.write(body)
"""


class _CommandFailed(TransportError):
    """A command ran on the host and failed (the connection itself is fine)."""


class _PortTaken(_CommandFailed):
    """The engine's port answers before the engine is started."""


@dataclass
class EngineFiles:
    """What ``<remote_dir>/<name>/`` holds, plus the process its pid file names."""

    name: str
    pid: int | None = None
    stat: tuple[str, int, int] | None = None  # (state, pgrp, starttime) of that pid
    cpus: str | None = None
    state: dict = field(default_factory=dict)
    config: dict | None = None

    def process_alive(self) -> bool:
        """The pid file's process still runs and is the one we started (a reused pid is not)."""
        if self.pid is None or self.stat is None or self.stat[0] in ("Z", "X"):
            return False
        expected = self.state.get("starttime")
        return expected is None or expected == self.stat[2]

    def launch(self) -> LaunchConfig | None:
        return LaunchConfig.from_dict(self.config) if self.config else None


def _parse_engine_files(sections: list[tuple[str, str]]) -> dict[str, EngineFiles]:
    engines: dict[str, EngineFiles] = {}
    current: EngineFiles | None = None
    for name, body in sections:
        if name == "engine":
            current = engines.setdefault(body.strip(), EngineFiles(body.strip()))
        elif current is None:
            continue
        elif name == "pid":
            current.pid = int(body) if body.strip().isdigit() else None
        elif name == "stat":
            current.stat = procfs.parse_proc_stat(body)
        elif name == "cpus":
            current.cpus = body.strip() or None
        elif name == "state":
            current.state = _json_or(body, {})
        elif name == "config":
            current.config = _json_or(body, None)
    return engines


def _json_or(text: str, default):
    try:
        value = json.loads(text) if text.strip() else default
    except ValueError:
        return default
    return value if isinstance(value, dict) else default


def _probe_host(listen: str) -> str:
    """Where, on the host itself, an engine listening on ``listen`` answers."""
    if listen in ("", "0.0.0.0", "localhost"):  # noqa: S104 - not binding, reading a config
        return "127.0.0.1"
    if listen == "::":
        return "::1"
    return listen


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# --------------------------------------------------------------------------- the transport


class SshTransport(Transport):
    """One host over SSH. ``private_key`` is the key's OpenSSH/PEM text (decrypted secrets from
    the database, never a path); ``host_key_fingerprint`` the accepted ``SHA256:…`` or None.

    ``remote_dir`` holds one directory per engine (a leading ``~/`` is the login's home).
    ``python`` is the interpreter launch configs are rendered with: for simulated engines, one
    the panel is installed into, so ``python -m hosts.simulator`` imports from anywhere.
    ``workdir`` is the working directory of "process" engines (default: their own
    directory), for hosts where the panel is a plain checkout instead (``-m`` imports from the
    working directory; PYTHONPATH is not an allowed engine variable).
    ``nvidia_smi``, ``systemctl``, ``journalctl`` and ``docker`` are the host's programs
    (absolute paths where PATH differs; stand-ins in tests), the last three as argv prefixes
    (``["systemctl", "--user"]``); ``unit_dir`` is where systemd units are written (over SFTP,
    so the login must be allowed to write there: root, or a user unit directory).
    """

    kind = "ssh"

    def __init__(
        self,
        address: str,
        port: int = 22,
        username: str = "root",
        *,
        private_key: str,
        passphrase: str | None = None,
        host_key_fingerprint: str | None,
        launch_style: str = "process",
        remote_dir: str = "~/.llm-panel",
        workdir: str | None = None,
        connect_timeout: float = 10.0,
        command_timeout: float = 30.0,
        python: str = "python3",
        stop_grace_s: float = 10.0,
        nvidia_smi: str = "nvidia-smi",
        unit_dir: str = "/etc/systemd/system",
        systemd_user: str | None = None,
        systemctl: Sequence[str] = ("systemctl",),
        journalctl: Sequence[str] = ("journalctl",),
        docker: Sequence[str] = ("docker",),
        docker_image: str | None = None,
    ):
        if launch_style not in LAUNCH_STYLES:
            raise TransportError(
                f"unknown launch style {launch_style!r} (choose from {', '.join(LAUNCH_STYLES)})"
            )
        for what, value in (
            ("remote_dir", remote_dir),
            ("workdir", workdir),
            ("python", python),
            ("nvidia_smi", nvidia_smi),
            ("unit_dir", unit_dir),
            ("systemd_user", systemd_user),
            ("docker_image", docker_image),
            ("username", username),
            *((f"systemctl[{i}]", v) for i, v in enumerate(systemctl)),
            *((f"journalctl[{i}]", v) for i, v in enumerate(journalctl)),
            *((f"docker[{i}]", v) for i, v in enumerate(docker)),
        ):
            # Options of a prefix (systemctl --user) may start with "-"; nothing else may.
            flag_ok = what[-1] == "]" and not what.endswith("[0]")
            if value is not None and (
                not _SAFE_WORD.match(value) or (value.startswith("-") and not flag_ok)
            ):
                raise TransportError(f"SSH transport option {what}={value!r} is not allowed")
        if not (systemctl and journalctl and docker):
            raise TransportError("systemctl, journalctl and docker need a program name")
        if not (remote_dir.startswith("/") or remote_dir.startswith("~/")):
            raise TransportError("remote_dir must be absolute or start with ~/")
        self.address, self.port, self.username = address, int(port), username
        self.where = _where(address, self.port)
        self._private_key, self._passphrase = private_key, passphrase
        self.host_key_fingerprint = _normalise_fingerprint(host_key_fingerprint)
        self.launch_style = launch_style
        self.remote_dir_option = remote_dir.rstrip("/") or "/"
        self.workdir = workdir
        self.connect_timeout, self.command_timeout = connect_timeout, command_timeout
        self.python, self.stop_grace_s, self.nvidia_smi = python, stop_grace_s, nvidia_smi
        self.unit_dir, self.systemd_user = unit_dir.rstrip("/"), systemd_user
        self.systemctl, self.journalctl = list(systemctl), list(journalctl)
        self.docker, self.docker_image = list(docker), docker_image
        self._lock = threading.RLock()
        self._ssh: paramiko.Transport | None = None
        self._sftp_client: paramiko.SFTPClient | None = None
        self._remote_dir: str | None = None
        self._forwarding = True
        self._numa: dict[str, tuple[int | None, str | None]] = {}
        self.presented_key: tuple[str, str] | None = None  # (fingerprint, type) last seen

    # ------------------------------------------------------------------ connection

    def _connection(self) -> paramiko.Transport:
        with self._lock:
            if self._ssh is not None and self._ssh.is_active():
                return self._ssh
            self._drop()
            key = load_private_key(self._private_key, self._passphrase)
            ssh = _open_ssh(self.address, self.port, self.connect_timeout)
            try:
                server_key = ssh.get_remote_server_key()
                presented, key_type = host_key_fingerprint(server_key), server_key.get_name()
                self.presented_key = (presented, key_type)
                # The check sits between key exchange and authentication: on a mismatch the
                # (possibly impostor) server never sees our key or a command.
                if self.host_key_fingerprint is None:
                    raise HostKeyUnknown(presented, key_type)
                if presented != self.host_key_fingerprint:
                    log.error(
                        "HOST KEY CHANGED for %s: expected %s, presented %s %s; refusing",
                        self.where,
                        self.host_key_fingerprint,
                        key_type,
                        presented,
                    )
                    raise HostKeyMismatch(self.host_key_fingerprint, presented)
                self._authenticate(ssh, key)
                ssh.set_keepalive(30)
            except BaseException:
                ssh.close()
                raise
            self._ssh = ssh
            return ssh

    def _authenticate(self, ssh: paramiko.Transport, key: paramiko.PKey) -> None:
        who = f"{self.username}@{self.where}"
        try:
            further = ssh.auth_publickey(self.username, key)
        except paramiko.BadAuthenticationType as exc:
            allowed = ", ".join(exc.allowed_types) or "nothing"
            raise AuthError(
                f"{who} does not take key authentication (it allows {allowed})"
            ) from None
        except paramiko.AuthenticationException:
            raise AuthError(f"{who} refused the SSH key ({key.get_name()})") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"SSH authentication with {who} failed: {exc}") from None
        if further:
            raise AuthError(f"{who} wants more than a key ({', '.join(further)})")

    def _drop(self) -> None:
        """Forget a broken or closed connection so the next call opens a new one."""
        with self._lock:
            if self._sftp_client is not None:
                with contextlib.suppress(Exception):  # already broken: closing is best effort
                    self._sftp_client.close()
            if self._ssh is not None:
                self._ssh.close()
            self._ssh, self._sftp_client = None, None

    def close(self) -> None:
        self._drop()

    # ------------------------------------------------------------------ primitives

    def _exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        what: str = "a command",
    ) -> Result:
        """Run one command line; (exit status, stdout, stderr). Its whole run is bounded."""
        ssh = self._connection()
        timeout = timeout or self.command_timeout
        deadline = time.monotonic() + timeout
        try:
            chan = ssh.open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransportError(f"cannot open an SSH session on {self.where}: {exc}") from None
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            chan.exec_command(command)
            chan.shutdown_write()  # nothing is ever sent on stdin
            while True:
                if chan.recv_ready():
                    out.append(chan.recv(65536))
                elif chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(65536))
                elif chan.exit_status_ready() and (chan.eof_received or chan.closed):
                    break
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TransportError(
                            f"{what} on {self.where} did not finish within {timeout:g} s"
                        )
                    # The channel's fileno is a pipe set when either stream has data or ends.
                    if not select.select([chan], [], [], min(remaining, 0.5))[0]:
                        continue
                    if chan.closed or chan.eof_received:
                        time.sleep(0.002)  # EOF came first; the exit status is on its way
            rc = chan.recv_exit_status()
        except TransportError:
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransportError(f"{what} on {self.where} failed: {exc}") from None
        finally:
            chan.close()
        return Result(
            rc,
            b"".join(out).decode("utf-8", "replace"),
            b"".join(err).decode("utf-8", "replace"),
        )

    def _check(self, command: str, what: str, **kwargs) -> Result:
        result = self._exec(command, what=what, **kwargs)
        if result.rc != 0:
            raise _CommandFailed(
                f"{what} on {self.where} failed (exit {result.rc}): {result.text()[-500:]}"
            )
        return result

    def _sftp(self) -> paramiko.SFTPClient:
        with self._lock:
            ssh = self._connection()
            if self._sftp_client is None or self._sftp_client.get_channel().closed:
                try:
                    self._sftp_client = paramiko.SFTPClient.from_transport(ssh)
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    raise TransportError(f"SFTP on {self.where} failed: {exc}") from None
                self._sftp_client.get_channel().settimeout(self.command_timeout)
            return self._sftp_client

    def _write_file(self, path: str, data: str, mode: int) -> None:
        """Write ``path`` atomically (temp file + rename), with ``mode`` set before any content
        is written, so a secret never sits in a world-readable file."""
        sftp = self._sftp()
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        try:
            with sftp.open(tmp, "wb") as f:
                sftp.chmod(tmp, mode)
                f.write(data.encode("utf-8"))
            sftp.posix_rename(tmp, path)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                sftp.remove(tmp)
            raise TransportError(f"cannot write {path} on {self.where}: {exc}") from None

    def _write_json(self, path: str, value: dict) -> None:
        self._write_file(path, json.dumps(value, indent=2, sort_keys=True) + "\n", 0o600)

    def remote_dir(self) -> str:
        """``remote_dir`` with ``~`` resolved (quoting would keep the shell from doing it)."""
        if self._remote_dir is None:
            path = self.remote_dir_option
            if path.startswith("~/"):
                try:
                    home = self._sftp().normalize(".")
                except (OSError, paramiko.SSHException, EOFError) as exc:
                    raise TransportError(f"cannot find the home directory: {exc}") from None
                path = home.rstrip("/") + path[1:]
            self._remote_dir = path
        return self._remote_dir

    def _engine_dir(self, name: str) -> str:
        return f"{self.remote_dir()}/{check_engine_name(name)}"

    def _http_get(
        self, port: int, path: str, *, host: str = "127.0.0.1", timeout: float = 5.0
    ) -> tuple[int, bytes] | None:
        """GET ``path`` from ``host:port`` as seen from the server; None when nothing answers."""
        if not self._forwarding:
            return self._http_get_on_host(port, path, host=host, timeout=timeout)
        ssh = self._connection()
        try:
            chan = ssh.open_channel(
                "direct-tcpip", (host, int(port)), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            if exc.code == paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
                log.info("%s refuses TCP forwarding; probing from the host", self.where)
                self._forwarding = False
                return self._http_get_on_host(port, path, host=host, timeout=timeout)
            return None  # connection refused on the host: nothing listens (yet)
        except (paramiko.SSHException, EOFError, OSError):
            if not ssh.is_active():
                self._drop()
                raise TransportError(f"the SSH connection to {self.where} broke") from None
            return None
        try:
            chan.settimeout(timeout)
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            chan.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: llm-panel-ssh\r\n"
                "Accept: */*\r\nConnection: close\r\n\r\n".encode("ascii")
            )
            # http.client parses the reply from the channel's file object (chunked or not).
            response = http.client.HTTPResponse(chan)  # type: ignore[arg-type]
            response.begin()
            return response.status, response.read(HTTP_BODY_LIMIT)
        except (http.client.HTTPException, OSError, EOFError, paramiko.SSHException):
            return None
        finally:
            chan.close()

    def _http_get_on_host(
        self, port: int, path: str, *, host: str, timeout: float
    ) -> tuple[int, bytes] | None:
        authority = f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"
        command = shlex.join(
            [self.python, "-c", HTTP_GET_PY, f"http://{authority}{path}", f"{timeout:g}"]
        )
        result = self._exec(command, timeout=timeout + self.command_timeout, what="HTTP probe")
        status, _, body = result.out.partition("\n")
        if result.rc != 0 or not status.strip().isdigit() or int(status) == 0:
            return None
        return int(status), body.encode("utf-8")

    def _ready(self, launch: LaunchConfig) -> bool:
        """Ready = ``/health`` answers 200 and then ``/v1/models`` does (vLLM binds its port
        before the engine is up)."""
        host = _probe_host(launch.host)
        health = self._http_get(launch.port, "/health", host=host)
        if health is None or health[0] != 200:
            return False
        models = self._http_get(launch.port, "/v1/models", host=host)
        return models is not None and models[0] == 200

    def _engine_files(self, name: str | None = None) -> dict[str, EngineFiles]:
        marker = "@@" + secrets.token_hex(8)
        script = sh(ENGINE_FILES_SCRIPT, marker, self.remote_dir(), name or "")
        result = self._exec(script, what="reading engine state")
        return _parse_engine_files(_sections(result.out, marker))

    def _files(self, name: str) -> EngineFiles:
        check_engine_name(name)
        return self._engine_files(name).get(name) or EngineFiles(name)

    # ------------------------------------------------------------------ styles

    @staticmethod
    def _validated(launch: LaunchConfig) -> LaunchConfig:
        try:
            return launch.validated()
        except LaunchError as exc:
            raise TransportError(f"the launch config was refused: {exc}") from exc

    def _render(self, name: str, launch: LaunchConfig) -> dict:
        """Everything the launch style needs, rendered (and so validated) before any change."""
        try:
            launch = launch.validated()
            if self.launch_style == "process":
                command = render_process(launch, python=self.python)
                for key in command.env:
                    if not _ENV_NAME.match(key):
                        raise LaunchError({"env": f"{key!r} is not an environment variable name"})
                return {"launch": launch, "argv": list(command.argv), "env": dict(command.env)}
            if self.launch_style == "systemd":
                unit = render_systemd(
                    launch,
                    unit_name=self._unit(name),
                    env_file=f"{self._engine_dir(name)}/env",
                    user=self.systemd_user,
                    python=self.python,
                )
                return {"launch": launch, "unit": unit}
            argv = render_docker(launch, name=self._container(name), image=self.docker_image)
            return {"launch": launch, "argv": self._docker_argv(argv)}
        except LaunchError as exc:
            raise TransportError(f"the launch config was refused: {exc}") from exc

    @staticmethod
    def _unit(name: str) -> str:
        return f"llm-{check_engine_name(name)}.service"

    @staticmethod
    def _container(name: str) -> str:
        return f"llm-{check_engine_name(name)}"

    def _docker_argv(self, argv: list[str]) -> list[str]:
        """render_docker's ``docker run -d …`` with our docker program in front. Detached is
        part of the contract: the transport polls the container, it does not stream it."""
        if argv[:3] != ["docker", "run", "-d"]:
            raise TransportError(f"render_docker returned an unexpected command: {argv[:3]}")
        return [*self.docker, *argv[1:]]

    def _start(self, name: str, rendered: dict) -> dict:
        """Start the engine (whatever ran under that name is stopped first); its state.json."""
        launch: LaunchConfig = rendered["launch"]
        directory = self._engine_dir(name)
        self._check(sh(MKDIR_SCRIPT, directory), "creating the engine directory")
        self._stop(name)
        if self._http_get(launch.port, "/health", host=_probe_host(launch.host)) is not None:
            # Something else answers HTTP there: the new engine could not bind, and that other
            # server's /health would pass for ours.
            raise _PortTaken(
                f"port {launch.port} on {self.address} is in use by another program "
                "(something answers HTTP there after our engine was stopped)"
            )
        self._write_json(f"{directory}/config.json", launch.to_dict())
        state: dict = {"style": self.launch_style, "started_at": time.time(), "ready_at": None}
        if self.launch_style == "process":
            env_text = "".join(f"{k}={shlex.quote(v)}\n" for k, v in rendered["env"].items())
            self._write_file(f"{directory}/env", env_text, 0o600)
            workdir = self.workdir or directory
            result = self._check(
                sh(START_SCRIPT, directory, workdir, *rendered["argv"]), "starting the engine"
            )
            lines = result.out.splitlines()
            state["pid"] = int(lines[0])
            stat = procfs.parse_proc_stat(lines[1]) if len(lines) > 1 else None
            state["starttime"] = stat[2] if stat else None
        elif self.launch_style == "systemd":
            unit = rendered["unit"]
            self._write_file(f"{directory}/env", unit.env_text, 0o600)
            self._write_file(f"{self.unit_dir}/{self._unit(name)}", unit.unit_text, 0o644)
            command = (
                shlex.join([*self.systemctl, "daemon-reload"])
                + " && "
                + shlex.join([*self.systemctl, "restart", self._unit(name)])
            )
            self._check(command, f"starting {self._unit(name)}")
        else:
            command = (
                shlex.join([*self.docker, "rm", "-f", self._container(name)])
                + " >/dev/null 2>&1; "
                + shlex.join(rendered["argv"])
            )
            self._check(command, f"starting container {self._container(name)}")
        self._write_json(f"{directory}/state.json", state)
        return state

    def _service_status(self, name: str, files: EngineFiles) -> dict:
        """``{"alive", "pid", "exit_code", "state"}`` as the launch style sees it; ``state``
        is one of running / stopped / failed."""
        if self.launch_style == "process":
            if files.process_alive():
                return {"alive": True, "pid": files.pid, "exit_code": None, "state": "running"}
            # A pid file we did not remove means the engine ended without being stopped.
            state = "failed" if files.pid is not None else "stopped"
            return {"alive": False, "pid": None, "exit_code": None, "state": state}
        if self.launch_style == "systemd":
            command = shlex.join(
                [
                    *self.systemctl,
                    "show",
                    "-p",
                    "ActiveState",
                    "-p",
                    "MainPID",
                    "-p",
                    "ExecMainStatus",
                    "-p",
                    "Result",
                    self._unit(name),
                ]
            )
            result = self._exec(command, what=f"systemctl show {self._unit(name)}")
            props = dict(line.split("=", 1) for line in result.out.splitlines() if "=" in line)
            active = props.get("ActiveState", "inactive")
            pid = _int_or_none(props.get("MainPID")) or None
            exit_code = _int_or_none(props.get("ExecMainStatus"))
            if active in ("active", "activating", "reloading"):
                return {"alive": True, "pid": pid, "exit_code": None, "state": "running"}
            failed = active == "failed" or (exit_code not in (None, 0) and bool(files.state))
            state = "failed" if failed else "stopped"
            return {"alive": False, "pid": None, "exit_code": exit_code, "state": state}
        template = "{{.State.Status}} {{.State.Pid}} {{.State.ExitCode}}"
        command = shlex.join([*self.docker, "inspect", "-f", template, self._container(name)])
        result = self._exec(command, what=f"docker inspect {self._container(name)}")
        parts = result.out.split()
        if result.rc != 0 or len(parts) != 3:
            return {"alive": False, "pid": None, "exit_code": None, "state": "stopped"}
        status, pid, code = parts[0], _int_or_none(parts[1]) or None, _int_or_none(parts[2])
        if status in ("running", "restarting", "created"):
            return {"alive": True, "pid": pid, "exit_code": None, "state": "running"}
        state = "failed" if status == "dead" or code != 0 else "stopped"
        return {"alive": False, "pid": None, "exit_code": code, "state": state}

    def _stop(self, name: str, files: EngineFiles | None = None) -> None:
        directory = self._engine_dir(name)
        grace = max(1, round(self.stop_grace_s * 10))
        timeout = self.stop_grace_s + self.command_timeout
        if self.launch_style == "process":
            files = files or self._files(name)
            if files.pid is not None:
                # A live pid with another start time is someone else's process: leave it.
                reused = files.stat is not None and not files.process_alive()
                if not reused:
                    self._exec(sh(STOP_SCRIPT, files.pid, grace), timeout=timeout, what="stop")
                self._exec(shlex.join(["rm", "-f", f"{directory}/engine.pid"]), what="stop")
        elif self.launch_style == "systemd":
            command = shlex.join([*self.systemctl, "stop", self._unit(name)])
            self._exec(command, timeout=timeout, what=f"stopping {self._unit(name)}")
        else:
            seconds = str(max(1, round(self.stop_grace_s)))
            command = shlex.join([*self.docker, "stop", "-t", seconds, self._container(name)])
            self._exec(command, timeout=timeout, what=f"stopping {self._container(name)}")

    def _logs(self, name: str, lines: int) -> list[str]:
        lines = max(1, min(int(lines), MAX_LOG_LINES))
        if self.launch_style == "process":
            command = sh(TAIL_SCRIPT, lines, f"{self._engine_dir(name)}/engine.log")
        elif self.launch_style == "systemd":
            unit = self._unit(name)
            command = shlex.join(
                [*self.journalctl, "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"]
            )
        else:
            command = (
                shlex.join([*self.docker, "logs", "--tail", str(lines), self._container(name)])
                + " 2>&1"
            )
        result = self._exec(command, what="reading the engine's log")
        if self.launch_style == "docker" and result.rc != 0 and "No such" in result.out:
            return []
        return result.out.splitlines()[-lines:]

    def _wait_ready(self, name: str, launch: LaunchConfig, timeout: float) -> tuple[bool, str]:
        """Poll until ready, the engine dies, or ``timeout``: (ready, why not)."""
        deadline = time.monotonic() + timeout
        while True:
            files = self._files(name) if self.launch_style == "process" else EngineFiles(name)
            status = self._service_status(name, files)
            if not status["alive"]:
                code = status["exit_code"]
                return False, "the engine exited before it was ready" + (
                    f" (exit status {code})" if code is not None else ""
                )
            if self._ready(launch):
                return True, ""
            if time.monotonic() >= deadline:
                return False, f"the engine was not ready within {timeout:g} s"
            time.sleep(POLL_INTERVAL)

    def _mark_ready(self, name: str, state: dict) -> None:
        state = {**state, "ready_at": time.time()}
        self._write_json(f"{self._engine_dir(name)}/state.json", state)

    def _run(self, name: str, rendered: dict, timeout: float) -> tuple[bool, str, list[str]]:
        """Start and wait: (ready, error, the engine's last lines when it failed). A failed
        engine is stopped again so a half-started one never keeps the port or the GPU."""
        started = time.monotonic()
        try:
            state = self._start(name, rendered)
        except _CommandFailed as exc:
            # Not started (the port is taken, a start command failed): the caller may still
            # roll back. A broken connection is raised instead: nothing can be done over it.
            return False, str(exc), []
        ready, error = self._wait_ready(name, rendered["launch"], timeout)
        if ready:
            state["seconds_to_ready"] = round(time.monotonic() - started, 2)
            self._mark_ready(name, state)
            return True, "", []
        # The log first: "docker rm" and a restart both lose it.
        log_lines = self._logs(name, LOG_LINES_ON_FAILURE)
        self._stop(name)
        # Remembered so the status says "failed" (and why) rather than "stopped".
        self._write_json(f"{self._engine_dir(name)}/state.json", {**state, "error": error})
        return False, error, log_lines

    # ------------------------------------------------------------------ Transport API

    def info(self) -> dict:
        ssh = self._connection()
        marker = "@@" + secrets.token_hex(8)
        script = (
            'm=$1; smi=$2; r=$3; py=$4; code=$5; shift 5; one=\necho "$m hostname"; '
            'cat /proc/sys/kernel/hostname\necho "$m smi"; command -v "$smi" || true\n'
            'echo "$m libraries"; "$py" -c "$code" "$@" 2>/dev/null; echo\n' + _ENGINE_FILES
        )
        command = sh(
            script,
            marker,
            self.nvidia_smi,
            self.remote_dir(),
            self.python,
            LIBRARIES_PY,
            *LIBRARIES,
        )
        result = self._exec(command, what="info")
        sections = _sections(result.out, marker)
        values = dict(sections)
        engines = _parse_engine_files(sections)
        smi = values.get("smi", "").strip()
        if smi:
            source = "nvidia-smi"
        elif self._simulators(engines):
            source = "simulator"
        else:
            source = "none"
        fingerprint, key_type = self.presented_key or ("", "")
        return {
            "kind": "ssh",
            "hostname": values.get("hostname", "").strip(),
            "agent_version": None,
            "libraries": _libraries(values.get("libraries", "")),
            "telemetry_source": source,
            "detail": (
                f"{ssh.remote_version} as {self.username}, host key {key_type} {fingerprint}, "
                f"launch style {self.launch_style}, "
                + (f"nvidia-smi at {smi}" if smi else "no nvidia-smi")
            ),
        }

    def _simulators(self, engines: dict[str, EngineFiles]) -> list[EngineFiles]:
        """Our engines that run the simulator and are up, for hosts without GPUs."""
        found = []
        for files in engines.values():
            config = files.config or {}
            if config.get("runner") != "simulator":
                continue
            if self.launch_style == "process" and not files.process_alive():
                continue
            found.append(files)
        return found

    def _sample(self, inventory: bool) -> tuple[dict, dict[str, EngineFiles]]:
        marker = "@@" + secrets.token_hex(8)
        script = sh(
            TELEMETRY_SCRIPT,
            marker,
            self.nvidia_smi,
            nvidia_smi.query_gpu_argv()[1],
            nvidia_smi.query_gpu_argv(legacy=True)[1],
            nvidia_smi.query_apps_argv()[1],
            nvidia_smi.CSV_FORMAT,
            self.remote_dir(),
            "inventory" if inventory else "",
        )
        result = self._exec(script, what="reading telemetry")
        sections = _sections(result.out, marker)
        return dict(sections), _parse_engine_files(sections)

    def _gpu_rows(self, values: dict) -> tuple[str, list[dict], dict, str]:
        """(source, parsed nvidia-smi rows, processes by uuid, note)."""
        host = values.get("hostname", "").strip() or self.address
        if "no-smi" in values:
            return "none", [], {}, f"nvidia-smi not found on {host}"
        output = values.get("gpus", "")
        if values.get("gpus-rc", "").strip() != "0":
            first = next(iter(_lines(output)), "no output")
            return "none", [], {}, f"nvidia-smi failed on {host}: {first}"
        try:
            rows = nvidia_smi.parse_gpus(output, legacy="legacy" in values)
            apps = nvidia_smi.parse_apps(values.get("apps", ""))
        except nvidia_smi.NvidiaSmiError as exc:
            return "none", [], {}, f"nvidia-smi on {host}: {exc}"
        return "nvidia-smi", rows, apps, ""

    def _pci_numa(self, rows: list[dict]) -> dict[str, tuple[int | None, str | None]]:
        """NUMA node and local CPU list of each GPU from sysfs (cached: they do not move)."""
        wanted = {
            addr
            for row in rows
            if (addr := nvidia_smi.sysfs_pci_address(row.get("pci_bus_id")))
            and addr not in self._numa
        }
        if wanted:
            marker = "@@" + secrets.token_hex(8)
            result = self._exec(sh(PCI_SCRIPT, marker, *sorted(wanted)), what="reading sysfs")
            for addr, body in _sections(result.out, marker):
                node_text, _, cpus = body.partition("\n")
                self._numa[addr] = (procfs.parse_numa_node(node_text), cpus.strip() or None)
        return self._numa

    def _gpu_numa(self, row: dict) -> tuple[int | None, str | None]:
        address = nvidia_smi.sysfs_pci_address(row.get("pci_bus_id"))
        return self._numa.get(address, (None, None)) if address else (None, None)

    def _simulator_gpus(self, engines: dict[str, EngineFiles]) -> list[dict]:
        readings: dict[str, dict] = {}
        for files in self._simulators(engines):
            launch = files.launch()
            if launch is None:
                continue
            answer = self._http_get(launch.port, "/simulator/gpus", host=_probe_host(launch.host))
            if answer is None or answer[0] != 200:
                continue
            try:
                gpus = json.loads(answer[1]).get("gpus", [])
            except (ValueError, AttributeError):
                continue
            for gpu in gpus:
                # Engines simulating the same GPU model report the same uuids: one reading each.
                readings.setdefault(str(gpu.get("uuid")), gpu)
        return list(readings.values())

    def telemetry(self) -> dict:
        now = time.time()
        values, engines = self._sample(inventory=False)
        source, rows, apps, note = self._gpu_rows(values)
        gpus = []
        if source == "nvidia-smi":
            self._pci_numa(rows)
            for row in rows:
                node, cpus = self._gpu_numa(row)
                processes = apps.get(row.get("uuid"), [])
                gpus.append(
                    nvidia_smi.telemetry_gpu(
                        row, processes=processes, numa_node=node, cpu_affinity=cpus
                    )
                )
        else:
            simulated = self._simulator_gpus(engines)
            if simulated:
                source = "simulator"
                note = f"{note}; readings from the simulated engines running there"
                gpus = [self._from_simulator(reading) for reading in simulated]
        meminfo = procfs.parse_meminfo(values.get("meminfo", ""))
        return {
            "time": now,
            "source": source,
            "note": note,
            "gpus": gpus,
            "host": {
                "cpu_percent": procfs.cpu_percent(values.get("stat1", ""), values.get("stat2", "")),
                "load_avg": procfs.parse_loadavg(values.get("loadavg", "")),
                "memory_total_bytes": meminfo.get("MemTotal"),
                "memory_used_bytes": procfs.memory_used_bytes(meminfo),
            },
            "engines": self._engines_summary(engines),
        }

    @staticmethod
    def _from_simulator(reading: dict) -> dict:
        row = {key: reading.get(key) for key in nvidia_smi.TELEMETRY_KEYS}
        return nvidia_smi.telemetry_gpu(
            row,
            processes=reading.get("processes") or [],
            numa_node=reading.get("numa_node"),
            cpu_affinity=reading.get("cpu_affinity"),
        )

    def _engines_summary(self, engines: dict[str, EngineFiles]) -> dict:
        summary = {}
        for name, files in engines.items():
            status = self._service_status(name, files)
            pid, cpus = status["pid"], None
            if status["alive"]:
                state = "ready" if files.state.get("ready_at") else "starting"
                cpus = files.cpus if self.launch_style == "process" else self._cpus_of(pid)
            else:
                state = "failed" if files.state.get("error") else status["state"]
            summary[name] = {
                "state": state,
                "pid": pid,
                "cpu_affinity": procfs.parse_cpulist(cpus) if cpus else None,
            }
        return summary

    def _cpus_of(self, pid: int | None) -> str | None:
        if not pid:
            return None
        script = 'sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" "/proc/$1/status" 2>/dev/null'
        return self._exec(sh(script, int(pid)), what="reading CPU affinity").out.strip() or None

    def inventory(self) -> dict:
        values, engines = self._sample(inventory=True)
        source, rows, _, note = self._gpu_rows(values)
        meminfo = procfs.parse_meminfo(values.get("meminfo", ""))
        nproc = values.get("nproc", "").strip()
        nodes = []
        for line in _lines(values.get("nodes", "")):
            node, _, cpus = line.partition(" ")
            if node.isdigit():
                nodes.append({"node": int(node), "cpus": cpus.strip()})
        inventory = {
            "hostname": values.get("hostname", "").strip(),
            "driver_version": None,
            "cuda_version": None,
            "cpu_count": int(nproc) if nproc.isdigit() else None,
            "cpu_model": procfs.cpu_model(values.get("cpuinfo", "")),
            "memory_total_bytes": meminfo.get("MemTotal"),
            "numa_nodes": sorted(nodes, key=lambda n: n["node"]),
            "source": source,
            "note": note,
            "gpus": [],
        }
        if source == "nvidia-smi":
            self._pci_numa(rows)
            inventory["driver_version"] = next(
                (row["driver_version"] for row in rows if row.get("driver_version")), None
            )
            inventory["cuda_version"] = nvidia_smi.cuda_version(values.get("smi", ""))
            for row in rows:
                node, cpus = self._gpu_numa(row)
                inventory["gpus"].append(
                    nvidia_smi.inventory_gpu(row, numa_node=node, cpu_affinity=cpus)
                )
        else:
            simulated = self._simulator_gpus(engines)
            if simulated:
                inventory["source"] = "simulator"
                inventory["note"] = f"{note}; GPUs of the simulated engines running there"
                inventory["gpus"] = [
                    nvidia_smi.inventory_gpu(
                        g, numa_node=g.get("numa_node"), cpu_affinity=g.get("cpu_affinity")
                    )
                    for g in simulated
                ]
        return inventory

    def engine_status(self, name: str) -> dict:
        files = self._files(name)
        status = self._service_status(name, files)
        launch = None
        try:
            launch = files.launch()
        except (LaunchError, TypeError, ValueError, KeyError):
            pass  # a config.json we cannot read is reported as absent, not as a crash
        state, error = status["state"], ""
        if status["alive"]:
            if launch is not None and self._ready(launch):
                state = "ready"
            elif files.state.get("ready_at"):
                state, error = "failed", "the engine runs but no longer answers /health"
            else:
                state = "starting"
        elif files.state.get("error"):
            state, error = "failed", files.state["error"]
        elif state == "failed":
            code = status["exit_code"]
            error = "the engine exited" + (f" with status {code}" if code is not None else "")
        return {
            "name": name,
            "state": state,
            "pid": status["pid"],
            "exit_code": status["exit_code"],
            "started_at": files.state.get("started_at"),
            "ready_at": files.state.get("ready_at") if state == "ready" else None,
            "error": error,
            "last_lines": self._logs(name, STATUS_LAST_LINES) if files.state else [],
            "config": files.config,
        }

    def apply_config(
        self,
        name: str,
        launch: LaunchConfig,
        *,
        previous: LaunchConfig | None,
        ready_timeout_s: float,
    ) -> ApplyOutcome:
        check_engine_name(name)
        # Both configs are validated, then rendered, before anything changes: a rollback must
        # not be the first time the previous config meets the renderer.
        checked = [self._validated(c) for c in (launch, previous) if c is not None]
        new = self._render(name, checked[0])
        old = self._render(name, checked[1]) if previous is not None else None
        ready, error, log_lines = self._run(name, new, ready_timeout_s)
        detail = {"launch_style": self.launch_style}
        if ready:
            return ApplyOutcome("ready", detail=detail)
        if old is None:
            return ApplyOutcome("failed", error, log_lines, detail)
        back, back_error, back_lines = self._run(name, old, ready_timeout_s)
        if back:
            return ApplyOutcome("rolled_back", error, log_lines, detail)
        detail.update(rollback_error=back_error, rollback_log_lines=back_lines)
        return ApplyOutcome(
            "failed",
            f"{error}; the previous config did not come back either: {back_error}",
            log_lines,
            detail,
        )

    def restart_engine(self, name: str, *, ready_timeout_s: float) -> ApplyOutcome:
        files = self._files(name)
        if not files.config:
            raise TransportError(f"engine {name} has no stored config on {self.where}")
        try:
            stored = LaunchConfig.from_dict(files.config)
        except (LaunchError, TypeError, ValueError, KeyError) as exc:
            raise TransportError(f"the stored config of {name} cannot be read: {exc}") from None
        ready, error, log_lines = self._run(name, self._render(name, stored), ready_timeout_s)
        detail = {"launch_style": self.launch_style}
        return ApplyOutcome("ready" if ready else "failed", error, log_lines, detail)

    def stop_engine(self, name: str) -> None:
        files = self._files(name)
        self._stop(name, files)
        if files.state:
            state = {**files.state, "stopped_at": time.time(), "ready_at": None, "error": None}
            self._write_json(f"{self._engine_dir(name)}/state.json", state)

    def logs(self, name: str, lines: int = 200) -> list[str]:
        check_engine_name(name)
        return self._logs(name, lines)
