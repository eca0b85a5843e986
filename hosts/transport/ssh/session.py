"""One SSH connection to a host and what the transport does over it: run a command (bounded in
time), write a file atomically over SFTP, read the engine directories, and GET a URL on the
host's loopback (through a ``direct-tcpip`` channel, or from the host's own python where TCP
forwarding is refused), so nothing needs to be reachable from the panel but port 22."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import secrets
import select
import shlex
import threading
import time
from dataclasses import dataclass

import paramiko

from hosts.transport import jsontext
from hosts.transport.base import TransportError, check_engine_name
from hosts.transport.ssh import connection, parsing
from hosts.transport.ssh.parsing import EngineFiles
from hosts.transport.ssh.scripts import ENGINE_FILES_SCRIPT, HTTP_GET_PY, sh

log = logging.getLogger(__name__)

HTTP_BODY_LIMIT = 4 * 1024 * 1024


@dataclass
class Result:
    """One command's exit status and output."""

    rc: int
    out: str
    err: str

    def text(self) -> str:
        return (self.err or self.out).strip()


class CommandFailed(TransportError):
    """A command ran on the host and failed (the connection itself is fine)."""


class SshSession:
    """The connection to one host (opened on first use, reopened after it breaks) and the
    primitives every launch style and reading is built from. ``private_key`` is the key's
    OpenSSH/PEM text; ``host_key_fingerprint`` the accepted ``SHA256:…`` or None."""

    def __init__(
        self,
        address: str,
        port: int,
        username: str,
        *,
        private_key: str,
        passphrase: str | None,
        host_key_fingerprint: str | None,
        remote_dir: str,
        python: str,
        connect_timeout: float,
        command_timeout: float,
    ):
        self.address, self.port, self.username = address, int(port), username
        self.where = connection.where(address, self.port)
        self._private_key, self._passphrase = private_key, passphrase
        self.host_key_fingerprint = connection.normalise_fingerprint(host_key_fingerprint)
        self.remote_dir_option = remote_dir.rstrip("/") or "/"
        self.python = python
        self.connect_timeout, self.command_timeout = connect_timeout, command_timeout
        self._lock = threading.RLock()
        self._ssh: paramiko.Transport | None = None
        self._sftp_client: paramiko.SFTPClient | None = None
        self._remote_dir: str | None = None
        self._forwarding = True
        self.presented_key: tuple[str, str] | None = None  # (fingerprint, type) last seen

    # ------------------------------------------------------------------ connection

    def _connection(self) -> paramiko.Transport:
        with self._lock:
            if self._ssh is not None and self._ssh.is_active():
                return self._ssh
            self._drop()
            key = connection.load_private_key(self._private_key, self._passphrase)
            ssh = connection.open_ssh(self.address, self.port, self.connect_timeout)
            try:
                self.presented_key = connection.presented_key(ssh)
                connection.check_host_key(self.presented_key, self.host_key_fingerprint, self.where)
                connection.authenticate(ssh, self.username, key, self.where)
                ssh.set_keepalive(30)
            except BaseException:
                ssh.close()
                raise
            self._ssh = ssh
            return ssh

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

    # ------------------------------------------------------------------ commands

    def _exec(self, command: str, *, timeout: float | None = None, what: str = "a command"):
        """Run one command line → Result. Its whole run is bounded by ``timeout``."""
        ssh = self._connection()
        timeout = timeout or self.command_timeout
        try:
            chan = ssh.open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransportError(f"cannot open an SSH session on {self.where}: {exc}") from None
        try:
            chan.exec_command(command)
            chan.shutdown_write()  # nothing is ever sent on stdin
            out, err = self._collect(chan, time.monotonic() + timeout, timeout, what)
            rc = chan.recv_exit_status()
        except TransportError:
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransportError(f"{what} on {self.where} failed: {exc}") from None
        finally:
            chan.close()
        return Result(rc, jsontext.text(out), jsontext.text(err))

    def _collect(self, chan: paramiko.Channel, deadline: float, timeout: float, what: str):
        """Read stdout and stderr until the command has ended: ``(out, err)`` bytes."""
        out: list[bytes] = []
        err: list[bytes] = []
        while True:
            if chan.recv_ready():
                out.append(chan.recv(65536))
            elif chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
            elif chan.exit_status_ready() and (chan.eof_received or chan.closed):
                return b"".join(out), b"".join(err)
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

    def run(self, command: str, *, timeout: float | None = None, what: str = "a command"):
        """Run one command line → Result, whatever its exit status."""
        return self._exec(command, timeout=timeout, what=what)

    def check(self, command: str, what: str, *, timeout: float | None = None) -> Result:
        """Run one command line; CommandFailed unless it exits 0."""
        result = self._exec(command, timeout=timeout, what=what)
        if result.rc != 0:
            raise CommandFailed(
                f"{what} on {self.where} failed (exit {result.rc}): {result.text()[-500:]}"
            )
        return result

    # ------------------------------------------------------------------ files

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

    def write_file(self, path: str, data: str, mode: int) -> None:
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

    def write_json(self, path: str, value: dict) -> None:
        self.write_file(path, json.dumps(value, indent=2, sort_keys=True) + "\n", 0o600)

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

    def engine_dir(self, name: str) -> str:
        return f"{self.remote_dir()}/{check_engine_name(name)}"

    def engine_files(self, name: str | None = None) -> dict[str, EngineFiles]:
        """The engine directories (all, or the one named), as ENGINE_FILES_SCRIPT reads them."""
        marker = "@@" + secrets.token_hex(8)
        script = sh(ENGINE_FILES_SCRIPT, marker, self.remote_dir(), name or "")
        result = self._exec(script, what="reading engine state")
        return parsing.engine_files(parsing.sections(result.out, marker))

    def files(self, name: str) -> EngineFiles:
        """One engine's directory (empty when it has none)."""
        check_engine_name(name)
        return self.engine_files(name).get(name) or EngineFiles(name)

    # ------------------------------------------------------------------ HTTP on the host

    def http_get(
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
            chan.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {connection.where(host, port)}\r\n"
                "User-Agent: llm-panel-ssh\r\nAccept: */*\r\nConnection: close\r\n\r\n".encode(
                    "ascii"
                )
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
        url = f"http://{connection.where(host, int(port))}{path}"
        command = shlex.join([self.python, "-c", HTTP_GET_PY, url, f"{timeout:g}"])
        result = self._exec(command, timeout=timeout + self.command_timeout, what="HTTP probe")
        status, _, body = result.out.partition("\n")
        if result.rc != 0 or not status.strip().isdigit() or int(status) == 0:
            return None
        return int(status), body.encode("utf-8")
