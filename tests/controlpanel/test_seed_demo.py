"""The demo data `make run` seeds: one login per role and a small fleet, safe to run twice."""

from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from benchmarks.models import LoadProfile
from hosts.models import Deployment, Host

pytestmark = pytest.mark.django_db


def seed(**env):
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_seed_creates_logins_and_fleet(monkeypatch, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("DEMO_PASSWORD", "demo-pass-123")
    output = seed()
    assert "password: demo-pass-123" in output
    for username, role in [
        ("admin", "Admin"),
        ("approver", "Approver"),
        ("operator", "Operator"),
        ("viewer", "Viewer"),
    ]:
        user = authenticate(username=username, password="demo-pass-123")
        assert user is not None and user.groups.filter(name=role).exists()
    assert get_user_model().objects.get(username="admin").is_superuser
    assert Host.objects.count() == 2
    llama = Deployment.objects.get(name="llama-8b")
    assert llama.active_config.version == 3 and llama.configs.count() == 3
    # The running config caps the batch at 32: the bottleneck the advisor finds at peak.
    assert llama.active_config.settings["max_num_seqs"] == 32
    assert llama.active_config.note.startswith("demo: cap the batch")
    assert llama.runner == "simulator" and llama.simulator["gpu"] == "h100-sxm"
    # The demo hosts carry the tokens of the local demo agents (encrypted at rest).
    host = Host.objects.get(name="sim-h100-01")
    token = (settings.VAR_DIR / "demo-fleet" / "sim-h100-01" / "token").read_text()
    assert host.agent_token == token and host.port == 9101
    assert (
        oct((settings.VAR_DIR / "demo-fleet" / "sim-h100-01" / "token").stat().st_mode)[-3:]
        == "600"
    )
    assert LoadProfile.objects.filter(name="RAG long-prompt", source="builtin").exists()


def test_seed_is_idempotent(monkeypatch, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("DEMO_PASSWORD", "demo-pass-123")
    seed()
    seed()
    assert Host.objects.count() == 2 and Deployment.objects.count() == 2


def test_generated_password_is_kept_private(monkeypatch, settings, tmp_path):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    settings.VAR_DIR = tmp_path
    first = seed()
    password = (tmp_path / "demo-password").read_text()
    assert f"password: {password}" in first
    assert oct((tmp_path / "demo-password").stat().st_mode)[-3:] == "600"
    assert f"password: {password}" in seed()
