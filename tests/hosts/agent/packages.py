"""Fake installed packages for the library-version tests: a directory importlib.metadata
reads as a site-packages holding them."""

from __future__ import annotations

from pathlib import Path

from hosts.agent.host import LIBRARIES, library_versions

FAKE = {"vllm": "0.11.0", "torch": "2.8.0+cu128", "nvidia-nccl-cu12": "2.27.3"}


def fake_site(root: Path, packages: dict[str, str] = FAKE) -> Path:
    """A directory that importlib.metadata reads as installed ``packages``."""
    root.mkdir(parents=True, exist_ok=True)
    for name, version in packages.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def expected(site_packages: dict[str, str] = FAKE) -> dict[str, str]:
    """What an interpreter with ``site_packages`` in front of this venv's reports."""
    here = library_versions()
    return {
        name: site_packages.get(name) or here[name]
        for name in LIBRARIES
        if name in site_packages or name in here
    }
