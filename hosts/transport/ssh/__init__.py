"""The SSH transport: reach a GPU server that runs no agent of ours, with an SSH key only.

* ``connection``: trust and login: host key fingerprints checked before authenticating, private
  keys, ``fetch_host_key`` for first contact;
* ``session``: one connection and its primitives: bounded commands, atomic SFTP writes, the
  engine directories, HTTP GETs on the host's loopback;
* ``scripts``: every shell script and ``python3 -c`` program sent, variable parts as
  positional arguments only;
* ``parsing``: reading what those scripts print (sections, engine directories, telemetry);
* ``styles``: one class per launch style (process, systemd, docker) behind ``LaunchStyle``;
* ``telemetry``: telemetry and inventory readings of the host;
* ``transport``: ``SshTransport``, the Transport interface on top of them.

Readiness is ``hosts.engines.readiness``'s rule, asked through the SSH connection.
"""

from hosts.transport.ssh.connection import (
    fetch_host_key,
    host_key_fingerprint,
    load_private_key,
)
from hosts.transport.ssh.parsing import EngineFiles
from hosts.transport.ssh.scripts import (
    ENGINE_FILES_SCRIPT,
    HTTP_GET_PY,
    LIBRARIES_PY,
    MKDIR_SCRIPT,
    PCI_SCRIPT,
    START_SCRIPT,
    STOP_SCRIPT,
    TAIL_SCRIPT,
    TELEMETRY_SCRIPT,
    sh,
)
from hosts.transport.ssh.session import Result
from hosts.transport.ssh.styles import LAUNCH_STYLES, LaunchStyle
from hosts.transport.ssh.transport import SshTransport

__all__ = [
    "ENGINE_FILES_SCRIPT",
    "HTTP_GET_PY",
    "LAUNCH_STYLES",
    "LIBRARIES_PY",
    "MKDIR_SCRIPT",
    "PCI_SCRIPT",
    "START_SCRIPT",
    "STOP_SCRIPT",
    "TAIL_SCRIPT",
    "TELEMETRY_SCRIPT",
    "EngineFiles",
    "LaunchStyle",
    "Result",
    "SshTransport",
    "fetch_host_key",
    "host_key_fingerprint",
    "load_private_key",
    "sh",
]
