"""docker-compose.yml is valid Compose and runs the services production needs.

Docker cannot run here; Debian's docker-compose validates the file against the Compose schema
(`config -q`), and tests/integration runs the same commands natively.
"""

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from tests.conftest import need

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def compose_config(path: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    need(exe is not None, "Debian's docker-compose (apt-get install docker-compose)")
    return subprocess.run(
        [exe, "-f", str(path), "config", "-q"],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_compose_file_is_valid():
    result = compose_config(COMPOSE)
    assert result.returncode == 0, result.stderr


def test_validator_rejects_a_broken_file(tmp_path):
    data = yaml.safe_load(COMPOSE.read_text())
    data["services"]["web"]["healthcheck"]["interval"] = ["not", "a", "duration"]
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(data))
    result = compose_config(broken)
    assert result.returncode != 0
    assert "interval" in result.stderr


def test_services_volumes_and_healthchecks():
    data = yaml.safe_load(COMPOSE.read_text())
    services = data["services"]
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(services)
    for name in ("postgres", "redis", "web", "worker", "beat"):
        assert "healthcheck" in services[name], name
    assert {"postgres-data", "redis-data"} <= set(data["volumes"])
    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        assert env["REDIS_URL"].startswith("redis://") and env["DATABASE_URL"].startswith(
            "postgres"
        )
        assert "SECRET_KEY" not in env and env["SECRET_KEY_FILE"].startswith("/run/secrets/")
    assert services["web"]["command"] == ["python", "-m", "controlpanel.webserver"]
    # The web tier's settings reach it through the shared environment.
    assert env["FORWARDED_ALLOW_IPS"] == "${FORWARDED_ALLOW_IPS:-127.0.0.1}"
    assert env["WEB_CONCURRENCY"] == "${WEB_CONCURRENCY:-}"
    assert services["worker"]["command"][:4] == ["celery", "-A", "controlpanel", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "controlpanel", "beat"]


@pytest.mark.parametrize("name", ["Dockerfile", ".dockerignore"])
def test_image_files_exist(name):
    assert (ROOT / name).is_file()


def test_the_image_and_the_package_carry_every_app():
    """A new app (like the top app, home) must be copied into the image and packaged, or the
    image fails at start on INSTALLED_APPS."""
    apps = [name for name in settings.INSTALLED_APPS if (ROOT / name / "apps.py").is_file()]
    dockerfile = (ROOT / "Dockerfile").read_text()
    with open(ROOT / "pyproject.toml", "rb") as f:
        packaged = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    for app in apps:
        assert f"COPY {app} ./{app}" in dockerfile, app
        assert f"{app}*" in packaged, app


def test_simulated_agent_service_runs_natively(tmp_path):
    """The sim-agent service's command (its shell wrapper and the agent), run here: the
    agent answers with its token, and refuses without it."""
    import os
    import shlex
    import sys

    import httpx

    from tests.conftest import free_port
    from tests.integration.processes import COMPOSE, Process, wait_until

    command = COMPOSE["services"]["sim-agent"]["command"]
    assert command[:2] == ["sh", "-c"]
    port = free_port()
    secret = tmp_path / "agent_token"
    secret.write_text("compose-token\n")
    secret.chmod(0o644)  # as Docker mounts it
    line = (
        command[2]
        .replace("/run/secrets/agent_token", str(secret))
        .replace("/tmp/agent-token", str(tmp_path / "private-token"))
        .replace("/tmp/agent-state", str(tmp_path / "state"))
        .replace("0.0.0.0:9100", f"127.0.0.1:{port}")
        .replace("exec python ", f"exec {shlex.quote(sys.executable)} ")
    )
    process = Process("sim-agent", ["sh", "-c", line], dict(os.environ), tmp_path)
    try:

        def answers():
            try:
                return httpx.get(
                    f"http://127.0.0.1:{port}/v1/info",
                    headers={"Authorization": "Bearer compose-token"},
                ).json()
            except httpx.TransportError:
                return None

        info = wait_until(answers, 30, lambda: process.output())
        assert info["telemetry_source"] == "simulator"
        assert httpx.get(f"http://127.0.0.1:{port}/v1/info").status_code == 401
        assert oct((tmp_path / "private-token").stat().st_mode)[-3:] == "600"
    finally:
        process.stop()
