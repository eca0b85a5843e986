"""The onboarding install for real: the zipapp the panel serves, started in isolated mode with
the exact flags and certificate command the page generates (paths moved into a temp dir, a
free port, simulated GPUs), then the page's steps: fetch and accept the certificate, test the
connection, every step done with the GPUs listed."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading

import pytest
from django.urls import reverse

from hosts.models import Host, HostCheck
from hosts.services import checks
from hosts.services.agent_install import (
    PYZ_PATH,
    STATE_DIR,
    TLS_CERT,
    TLS_KEY,
    TOKEN_FILE,
    agent_install,
    agent_zipapp,
)
from hosts.services.onboarding_steps import steps_for
from tests.conftest import free_port
from tests.factories import make_host

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def _moved(text: str, paths: dict[str, str]) -> str:
    for old, new in paths.items():
        text = text.replace(old, new)
    return text


@pytest.fixture
def installed(tmp_path):
    """Run the generated install's pieces against a temp dir: the token line, the openssl
    line, the agent command line (from the systemd unit) with the served zipapp."""
    port = free_port()
    host = make_host(address="127.0.0.1", port=port, agent_token="", agent_tls=True)
    (tmp_path / "state").mkdir()
    paths = {
        PYZ_PATH: str(tmp_path / "llm-agent.pyz"),
        TOKEN_FILE: str(tmp_path / "token"),
        TLS_CERT: str(tmp_path / "tls.crt"),
        TLS_KEY: str(tmp_path / "tls.key"),
        STATE_DIR: str(tmp_path / "state"),
    }
    (tmp_path / "llm-agent.pyz").write_bytes(agent_zipapp())
    yield host, paths, tmp_path


def test_the_generated_install_runs_and_passes_every_step(installed, client, operator):
    host, paths, tmp = installed
    client.force_login(operator)
    # Step 1: the token, shown once, inside the script.
    page = client.post(reverse("hosts:onboard_token", args=[host.pk])).content.decode()
    assert "printf" in page
    host.refresh_from_db()
    script = agent_install(host, "http://panel/agent.pyz?key=k", host.agent_token).script
    lines = {
        "token": next(x for x in script.splitlines() if x.startswith("printf")),
        "openssl": next(x for x in script.splitlines() if "openssl req" in x),
    }
    for name in ("token", "openssl"):
        subprocess.run(
            ["sh", "-euc", "umask 077; " + _moved(lines[name], paths)],
            check=True,
            cwd=tmp,
            capture_output=True,
            timeout=60,
        )
    exec_start = next(
        x.removeprefix("ExecStart=")
        for x in agent_install(host, "u", None).unit.splitlines()
        if x.startswith("ExecStart=")
    )
    argv = shlex.split(_moved(exec_start, paths))
    assert argv[:3] == ["/usr/bin/env", "python3", paths[PYZ_PATH]]
    # The python that runs the tests stands for the engines' python; -I: nothing from here
    # but the zipapp and site-packages (psutil, nvidia-ml-py, httpx) can be imported.
    argv = [sys.executable, "-I", *argv[2:], "--simulate", "h100-sxm:2"]
    agent = subprocess.Popen(
        argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(agent.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        assert line and line[0].startswith("agent listening on"), (
            line,
            agent.poll() is not None and agent.stderr.read(),
        )

        # Step 2: fetch what the agent presents, accept exactly that fingerprint.
        page = client.post(
            reverse("hosts:onboard_fetch_certificate", args=[host.pk])
        ).content.decode()
        fingerprint = re.search(r'name="fingerprint" value="([0-9A-F:]+)"', page).group(1)
        client.post(reverse("hosts:onboard_pin", args=[host.pk]), {"fingerprint": fingerprint})
        host.refresh_from_db()
        assert host.agent_ca_cert == (tmp / "tls.crt").read_text()
        assert host.credential_problem() == ""

        # Step 3: the check, as the worker runs it.
        check = HostCheck.objects.create(host=host)
        checks.run_host_check(check)
        host = Host.objects.get(pk=host.pk)
        check.refresh_from_db()
        assert check.outcome == "connected", check.detail
        steps = {s.key: s for s in steps_for(host, check)}
        assert [s.state for s in steps.values()] == ["done", "done", "done"], steps
        found = {r.name: r for r in steps["check"].results}
        assert found["TLS certificate"].text == "matches the pinned certificate"
        assert found["Token"].state == "pass"
        assert found["GPUs"].state == "pass" and "2 found" in found["GPUs"].text
        page = client.get(reverse("hosts:onboard", args=[host.pk])).content.decode()
        assert 'data-step="check" data-step-state="done"' in page
    finally:
        agent.terminate()
        agent.wait(30)
