"""`manage.py check --deploy` is clean with production settings, and the check has teeth."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_check(**overrides):
    env = {**os.environ, **overrides}
    return subprocess.run(
        [sys.executable, "scripts/check_deploy.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_settings_pass_deploy_checks():
    result = run_check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_deploy_check_fails_when_production_is_weakened(monkeypatch):
    # The script sets its own HTTPS=true, so weaken it through a setting it does not pin.
    result = run_check(SECURE_HSTS_SECONDS="0")
    assert result.returncode != 0
    assert "security.W004" in result.stdout + result.stderr
