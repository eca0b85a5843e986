"""docker-compose.yml is valid Compose and runs the services production needs.

Docker cannot run here; Debian's docker-compose validates the file against the Compose schema
(`config -q`), and tests/integration runs the same commands natively.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

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
    assert services["web"]["command"][0] == "uvicorn"
    assert services["worker"]["command"][:4] == ["celery", "-A", "controlpanel", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "controlpanel", "beat"]


@pytest.mark.parametrize("name", ["Dockerfile", ".dockerignore"])
def test_image_files_exist(name):
    assert (ROOT / name).is_file()


def test_simulated_engine_service_runs_natively(tmp_path):
    import httpx

    from tests.conftest import free_port
    from tests.integration.processes import Process, compose_command, wait_until

    cmd = compose_command("sim-vllm")
    port = free_port()
    cmd[cmd.index("--port") + 1] = str(port)
    process = Process("sim-vllm", [*cmd, "--host", "127.0.0.1"], {}, tmp_path)
    try:

        def healthy():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 30, lambda: process.output())
    finally:
        process.stop()
