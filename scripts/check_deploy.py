#!/usr/bin/env python3
"""`manage.py check --deploy` with production settings (as docker-compose.yml sets them).

No service is contacted: the URLs only select production mode. Fails on any warning.
"""

import base64
import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PRODUCTION_ENV = {
    "DATABASE_URL": "postgres://panel:panel@postgres:5432/panel",
    "REDIS_URL": "redis://redis:6379/0",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "PANEL_ENCRYPTION_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    "ALLOWED_HOSTS": "panel.example.com",
    "HTTPS": "true",
    "DEBUG": "false",
}


def main() -> int:
    env = {**os.environ, **PRODUCTION_ENV}
    cmd = [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"]
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
