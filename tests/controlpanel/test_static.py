"""plotly.js and htmx are served from the project's own static files; no page uses a CDN."""

import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path",
    [
        "vendor/plotly.min.js",
        "vendor/htmx.min.js",
        "controlpanel/live.js",
        "controlpanel/panel.css",
    ],
)
def test_assets_are_found(path):
    found = finders.find(path)
    assert found and Path(found).is_file() and Path(found).stat().st_size > 0


def test_plotly_is_the_real_library():
    head = Path(finders.find("vendor/plotly.min.js")).read_text()[:2000]
    assert "plotly.js" in head.lower()


def test_collectstatic_collects_vendor_assets(tmp_path, settings):
    settings.STATIC_ROOT = tmp_path
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    call_command("collectstatic", interactive=False, verbosity=0)
    assert (tmp_path / "vendor" / "plotly.min.js").is_file()
    assert (tmp_path / "vendor" / "htmx.min.js").is_file()
    manifest = (tmp_path / "staticfiles.json").read_text()
    assert "vendor/plotly.min.js" in manifest
    # Only plotly.js, not the rest of plotly's package data.
    assert not (tmp_path / "vendor" / "datasets").exists()


def test_templates_load_nothing_from_the_network():
    remote = re.compile(r"""(src|href)\s*=\s*["']?(https?:)?//""", re.I)
    offenders = [
        str(p) for p in (ROOT / "templates").rglob("*.html") if remote.search(p.read_text())
    ]
    assert not offenders
