"""var/ is owner-only (issue 14, item 7): the embedded database holds sessions, var/ the secret
key and the demo password. What the panel finds there and what it creates later."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage
from django.core.management import call_command

from home.management.commands import serve

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def group_or_other_bits(root: Path) -> list[str]:
    """Every path under root (root included) that anyone but the owner may use."""
    found = [] if not mode(root) & 0o077 else [f"{root} {oct(mode(root))}"]
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(parent, name)
            if not path.is_symlink() and mode(path) & 0o077:
                found.append(f"{path} {oct(mode(path))}")
    return found


@pytest.fixture
def restore_umask():
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def test_embedded_start_creates_var_database_and_secret_key_owner_only(tmp_path):
    """A fresh embedded start (no SECRET_KEY) with the umask most systems have (022)."""
    var = tmp_path / "var"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG")
    }
    env["VAR_DIR"] = str(var)
    code = "from django.db import connection; connection.cursor().execute('create table t (x int)')"
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o022),  # noqa: PLW1509 - the umask most systems have
    )
    assert result.returncode == 0, result.stderr
    assert (var / "db.sqlite3").exists() and (var / "secret_key").exists()
    assert mode(var) == 0o700
    assert mode(var / "db.sqlite3") == 0o600
    assert mode(var / "secret_key") == 0o600
    assert group_or_other_bits(var) == []  # the -wal/-shm files too


@pytest.mark.django_db
def test_serve_makes_what_var_holds_owner_only_and_what_it_creates_later(
    tmp_path, settings, monkeypatch, restore_umask
):
    var = tmp_path / "var"
    (var / "static" / "vendor").mkdir(parents=True)
    (var / "demo-fleet" / "gpu-1").mkdir(parents=True)
    os.chmod(var, 0o755)
    left_by_earlier_runs = {
        "db.sqlite3": 0o644,
        "db.sqlite3-wal": 0o644,
        "secret_key": 0o644,
        "demo-password": 0o644,
        "static/vendor/htmx.min.js": 0o644,
        "demo-fleet/gpu-1/token": 0o664,
        "demo-fleet/gpu-1/run.sh": 0o755,
    }
    for name, file_mode in left_by_earlier_runs.items():
        (var / name).write_text("x")
        os.chmod(var / name, file_mode)
    for path in (var / "static", var / "static" / "vendor", var / "demo-fleet"):
        os.chmod(path, 0o755)
    settings.VAR_DIR = var
    os.umask(0o022)

    created_while_serving = []

    def fake_serve(self, host, port):
        # Stands in for uvicorn: files the running panel writes (a log, an upload).
        (var / "logs").mkdir()
        (var / "logs" / "panel.log").write_text("started")
        # Django's storages chmod what they save (0644 by default): static files, uploads.
        upload = FileSystemStorage(location=var / "media").save("import.json", ContentFile(b"{}"))
        created_while_serving.extend(
            [var / "logs", var / "logs" / "panel.log", var / "media", var / "media" / upload]
        )

    monkeypatch.setattr(serve.Command, "_serve", fake_serve)
    call_command("serve", "--no-worker")

    assert group_or_other_bits(var) == []
    assert mode(var / "demo-fleet" / "gpu-1" / "run.sh") == 0o700  # still executable
    assert mode(var / "db.sqlite3") == 0o600
    assert [mode(p) for p in created_while_serving] == [0o700, 0o600, 0o700, 0o600]
