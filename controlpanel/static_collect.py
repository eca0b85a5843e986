"""``collectstatic`` only when the sources changed: `make run` (``serve --demo``) collects on
every start, and with hashed, compressed files (whitenoise) that cost 4-6 s of CPU even when
nothing had changed (2026-12-07: py-spy of a demo panel's start, mostly gzip), every time.

The sources' fingerprint (each file the static finders find: its path, size and modification
time, and the storage that processes them) is written next to the collected files after a
collection; a start that finds the same fingerprint and the manifest skips the collection."""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from pathlib import Path

import django
from django.conf import settings
from django.contrib.staticfiles.finders import get_finders
from django.core.management import call_command

STAMP = ".sources-fingerprint"
MANIFEST = "staticfiles.json"  # ManifestStaticFilesStorage's manifest_name


def fingerprint() -> str:
    """A digest of what ``collectstatic`` would collect and how (the sources, the storage
    that processes them and the versions of Django and whitenoise)."""
    digest = hashlib.sha256()
    digest.update(repr(settings.STORAGES.get("staticfiles")).encode())
    digest.update(f"django {django.get_version()} whitenoise {_version('whitenoise')}".encode())
    digest.update(str(settings.STATIC_URL).encode())
    seen = []
    for finder in get_finders():
        for path, storage in finder.list([]):
            prefix = getattr(storage, "prefix", None) or ""
            stat = os.stat(storage.path(path))
            seen.append(f"{prefix}/{path}\0{stat.st_size}\0{stat.st_mtime_ns}")
    for entry in sorted(seen):
        digest.update(entry.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def collect_if_changed() -> bool:
    """Collect the static files unless the ones in STATIC_ROOT came from these sources;
    True when it collected."""
    root = Path(settings.STATIC_ROOT)
    stamp = root / STAMP
    current = fingerprint()
    try:
        if (root / MANIFEST).is_file() and stamp.read_text() == current:
            return False
    except OSError:
        pass  # no stamp yet: collect
    call_command("collectstatic", interactive=False, verbosity=0)
    stamp.write_text(current)
    return True
