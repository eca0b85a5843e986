"""What an ops engineer runs on a GPU server to install the host agent: the agent as one
zipapp file built from the panel's own source, and the shell script and systemd unit the
onboarding page shows.

Why a zipapp rather than ``pip install`` of this project: the agent is a pure package (no
Django, no Celery), so the GPU server needs only a few of our files, not the panel and its
dependencies; the file comes from the panel the host will talk to (same version, no index or
internet access needed), and the interpreter that already runs vLLM/SGLang has everything the
agent imports (``psutil``, ``nvidia-ml-py``, ``httpx`` are vLLM dependencies). The download URL
carries a signed, expiring key bound to the host, so ``curl`` on the server needs no login.
"""

from __future__ import annotations

import functools
import io
import ipaddress
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path

from django.core import signing

from hosts.addresses import is_loopback
from hosts.agent import DEFAULT_PORT

# Where the files go on the GPU server (the manual.s recipe uses the same names).
PYZ_PATH = "/opt/llm-agent/llm-agent.pyz"
CONFIG_DIR = "/etc/llm-agent"
TOKEN_FILE = f"{CONFIG_DIR}/token"
TLS_CERT = f"{CONFIG_DIR}/tls.crt"
TLS_KEY = f"{CONFIG_DIR}/tls.key"
STATE_DIR = "/var/lib/llm-agent"
UNIT_NAME = "llm-agent.service"
PYTHON = "python3"
MASK = "<the token shown once when it was generated>"

DOWNLOAD_SALT = "hosts.onboarding.agent-download"
DOWNLOAD_MAX_AGE_S = 24 * 3600

# The agent's own modules and what they import from the panel's pure packages; checked by
# tests/hosts/test_onboarding_agent.py, which starts the zipapp in isolated mode.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FILES = (
    "hosts/__init__.py",
    "hosts/addresses.py",
    "hosts/transport/__init__.py",
    "hosts/transport/base.py",
)
PACKAGE_DIRS = ("hosts/agent", "hosts/engines")
ZIP_MAIN = (
    '"""The host agent as a zipapp: python3 llm-agent.pyz --token-file … (see --help)."""\n'
    "import sys\n\nfrom hosts.agent.server import main\n\nsys.exit(main())\n"
)


@functools.cache
def agent_zipapp() -> bytes:
    """The agent as one ``.pyz`` file (built once per process from the running source)."""
    names = list(PACKAGE_FILES)
    for folder in PACKAGE_DIRS:
        names += sorted(
            str(p.relative_to(PACKAGE_ROOT)) for p in (PACKAGE_ROOT / folder).rglob("*.py")
        )
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("__main__.py", ZIP_MAIN)
        for name in names:
            archive.write(PACKAGE_ROOT / name, name)
    return buffer.getvalue()


def download_key(host_pk: int) -> str:
    return signing.dumps(host_pk, salt=DOWNLOAD_SALT)


def download_key_valid(host_pk: int, key: str) -> bool:
    try:
        return signing.loads(key, salt=DOWNLOAD_SALT, max_age=DOWNLOAD_MAX_AGE_S) == host_pk
    except signing.BadSignature:
        return False


@dataclass(frozen=True)
class AgentInstall:
    """The install of one host's agent: ``argv`` (the agent's flags, for the unit and the
    tests), ``script`` (one paste as root) and ``unit`` (the systemd unit it writes)."""

    argv: list[str]
    script: str
    unit: str
    token_shown: bool


def agent_argv(host, python: str = PYTHON) -> list[str]:
    """The agent's command line for ``host``: the flags of ``hosts.agent.server.build_parser``."""
    listen_host = "127.0.0.1" if is_loopback(host.address) else "0.0.0.0"  # noqa: S104
    argv = [
        python,
        PYZ_PATH,
        "--listen",
        f"{listen_host}:{host.port or DEFAULT_PORT}",
        "--token-file",
        TOKEN_FILE,
        "--state-dir",
        STATE_DIR,
    ]
    if host.agent_tls:
        argv += ["--tls-cert", TLS_CERT, "--tls-key", TLS_KEY]
    return argv


def subject_alt_name(address: str) -> str:
    """What the certificate must name: the panel checks it against the host's address."""
    bare = address.strip("[]")
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        return f"DNS:{bare}"
    return f"IP:{bare}"


def agent_install(host, download_url: str, token: str | None) -> AgentInstall:
    """The script for ``host``; ``token`` is the one just generated (shown once) or None
    (a placeholder: the stored token is never shown again)."""
    argv = ["/usr/bin/env", *agent_argv(host)]
    unit = "\n".join(
        [
            "[Unit]",
            "Description=LLM control panel host agent",
            "After=network-online.target",
            "Wants=network-online.target",
            "",
            "[Service]",
            f"ExecStart={shlex.join(argv)}",
            "Restart=on-failure",
            # Engines outlive an agent restart (it adopts them again): only stop the agent.
            "KillMode=process",
            "UMask=0077",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
        ]
    )
    q = shlex.quote
    lines = [
        "sudo sh -eu <<'INSTALL'",
        f"install -d -m 0755 {q(str(Path(PYZ_PATH).parent))}",
        f"install -d -m 0700 {CONFIG_DIR} {STATE_DIR}",
        f"curl -fsS -o {PYZ_PATH} {q(download_url)}",
        f"{PYTHON} -c 'import sys, psutil, pynvml, httpx; assert sys.version_info >= (3, 11)' "
        "|| { echo 'needs python3 >= 3.11 with psutil, nvidia-ml-py and httpx "
        "(the python that runs vLLM has them)'; exit 1; }",
        "umask 077",
    ]
    if token:
        lines.append(f"printf '%s\\n' {q(token)} > {TOKEN_FILE}")
    else:
        lines.append(f"# {TOKEN_FILE} keeps the token you wrote there; a new one: see step 1.")
        lines.append(f"test -s {TOKEN_FILE}")
    lines.append(f"chmod 600 {TOKEN_FILE}")
    if host.agent_tls:
        name = host.address.strip("[]")
        lines.append(
            f"test -s {TLS_CERT} || openssl req -x509 -newkey ec "
            "-pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 "
            f"-subj {q('/CN=' + name)} -addext {q('subjectAltName=' + subject_alt_name(name))} "
            f"-keyout {TLS_KEY} -out {TLS_CERT}"
        )
    lines += [
        f"cat > /etc/systemd/system/{UNIT_NAME} <<'UNIT'",
        unit,
        "UNIT",
        "systemctl daemon-reload",
        f"systemctl enable {UNIT_NAME}",
        # restart, not start: a reinstall (a new token, a new agent) takes effect at once.
        f"systemctl restart {UNIT_NAME}",
    ]
    if host.agent_tls:
        lines.append(f"cat {TLS_CERT}")
    lines.append("INSTALL")
    return AgentInstall(
        argv=agent_argv(host), script="\n".join(lines), unit=unit, token_shown=bool(token)
    )
