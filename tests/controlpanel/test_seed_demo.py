"""The demo data `make run` seeds: one login per role and a small fleet, safe to run twice."""

from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from benchmarks.models import LoadProfile
from hosts.models import Deployment, Gpu, Host

pytestmark = pytest.mark.django_db


def seed(**env):
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_seed_creates_logins_and_fleet(monkeypatch):
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
    assert Host.objects.count() == 3 and Gpu.objects.count() == 4
    llama = Deployment.objects.get(name="llama-8b")
    assert llama.active_config.version == 2 and llama.configs.count() == 2
    assert LoadProfile.objects.filter(name="rag-long-prompt", mode="open").exists()


def test_seed_is_idempotent(monkeypatch):
    monkeypatch.setenv("DEMO_PASSWORD", "demo-pass-123")
    seed()
    seed()
    assert Host.objects.count() == 3 and Deployment.objects.count() == 3


def test_generated_password_is_kept_private(monkeypatch, settings, tmp_path):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    settings.VAR_DIR = tmp_path
    first = seed()
    password = (tmp_path / "demo-password").read_text()
    assert f"password: {password}" in first
    assert oct((tmp_path / "demo-password").stat().st_mode)[-3:] == "600"
    assert f"password: {password}" in seed()
