"""The versions of the engines' Python packages (vllm, torch, ...) a host reports: read by the
agent and over SSH with importlib.metadata, stored on the host by a check, kept in a run's
record."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hosts.agent.host import LIBRARIES, library_versions
from hosts.models import HostCheck
from hosts.services import checks
from hosts.transport.ssh import LIBRARIES_PY, Result, SshTransport, parsing
from tests.factories import make_host
from tests.hosts.agent.packages import FAKE, expected, fake_site


def test_the_agent_reads_versions_from_its_interpreter_and_leaves_out_absent_ones(
    tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(fake_site(tmp_path / "site")))
    found = library_versions()
    assert found == expected()
    assert found["vllm"] == "0.11.0" and found["nvidia-nccl-cu12"] == "2.27.3"
    assert library_versions(("no-such-package-anywhere",)) == {}


def test_the_ssh_one_liner_reads_the_same_versions(tmp_path):
    site = fake_site(tmp_path / "site")
    out = subprocess.run(
        [sys.executable, "-c", LIBRARIES_PY, *LIBRARIES],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(out.stdout) == expected()


def local_ssh(tmp_path, monkeypatch, python: str) -> SshTransport:
    """An SshTransport whose commands run in a local shell (as the remote login shell would)."""
    transport = SshTransport(
        "127.0.0.1",
        private_key="unused",
        host_key_fingerprint=None,
        remote_dir=str(tmp_path / "remote"),
        python=python,
        nvidia_smi="no-nvidia-smi-here",
    )

    def run_locally(command, *, timeout=None, what=""):
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
        return Result(done.returncode, done.stdout, done.stderr)

    monkeypatch.setattr(transport, "_exec", run_locally)
    monkeypatch.setattr(
        transport, "_connection", lambda: types.SimpleNamespace(remote_version="SSH-2.0-fake")
    )
    return transport


def test_ssh_info_asks_the_hosts_python(tmp_path, monkeypatch):
    site = fake_site(tmp_path / "site")
    wrapper = tmp_path / "python3"  # the host's interpreter: one that sees the fake packages
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    info = local_ssh(tmp_path, monkeypatch, str(wrapper)).info()
    assert info["kind"] == "ssh" and info["libraries"] == expected()
    assert info["telemetry_source"] == "none"  # the sections after it still parse


def test_ssh_info_without_a_python_reports_no_libraries(tmp_path, monkeypatch):
    info = local_ssh(tmp_path, monkeypatch, str(tmp_path / "missing-python")).info()
    assert info["libraries"] == {} and info["kind"] == "ssh"
    assert parsing.libraries("Traceback (most recent call last):") == {}
    assert parsing.libraries('["not", "a", "dict"]') == {}


class FakeAgent(BaseHTTPRequestHandler):
    """Just enough of the agent's API for a host check: /v1/info and /v1/inventory."""

    libraries: dict = {}

    def log_message(self, *args):
        pass

    def do_GET(self):
        payloads = {
            "/v1/info": {
                "agent_version": "0.1.0",
                "hostname": "gpu-box",
                "telemetry_source": "none",
                "detail": "no GPUs",
                "libraries": type(self).libraries,
            },
            "/v1/inventory": {"hostname": "gpu-box", "source": "none", "note": "", "gpus": []},
        }
        body = json.dumps(payloads.get(self.path, {"error": "not found"})).encode()
        self.send_response(200 if self.path in payloads else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def fake_agent():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAgent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.django_db
def test_a_host_check_stores_what_the_agent_reported(fake_agent, monkeypatch):
    host = make_host(port=fake_agent)
    monkeypatch.setattr(FakeAgent, "libraries", dict(FAKE))
    checks.run_host_check(HostCheck.objects.create(host=host))
    host.refresh_from_db()
    assert host.libraries == FAKE and host.agent_version == "0.1.0"
    # An upgrade shows at the next check; an agent that sends rubbish stores nothing odd.
    monkeypatch.setattr(FakeAgent, "libraries", {"vllm": "0.12.0"})
    checks.run_host_check(HostCheck.objects.create(host=host))
    host.refresh_from_db()
    assert host.libraries == {"vllm": "0.12.0"}
    monkeypatch.setattr(FakeAgent, "libraries", ["vllm"])
    checks.run_host_check(HostCheck.objects.create(host=host))
    host.refresh_from_db()
    assert host.libraries == {}
