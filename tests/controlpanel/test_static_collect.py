"""`serve --demo` collects static files only when their sources changed (controlpanel
.static_collect): a collection with hashed, compressed files cost 4-6 s of CPU on every start."""

from __future__ import annotations

import os

import pytest

from controlpanel import static_collect


@pytest.fixture
def sources(tmp_path, settings):
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.css").write_text("body { color: black }")
    settings.STATICFILES_DIRS = [src]
    settings.STATICFILES_FINDERS = ["django.contrib.staticfiles.finders.FileSystemFinder"]
    settings.STATIC_ROOT = tmp_path / "static"
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
    }
    return src


def test_a_second_start_skips_what_a_first_collected(sources, settings):
    assert static_collect.collect_if_changed() is True
    assert (settings.STATIC_ROOT / "staticfiles.json").is_file()
    assert static_collect.collect_if_changed() is False


def test_a_changed_new_or_removed_source_collects_again(sources, settings):
    static_collect.collect_if_changed()
    css = sources / "app.css"
    css.write_text("body { color: red }")
    os.utime(css, ns=(1, 1))  # a different size and time: an edit
    assert static_collect.collect_if_changed() is True
    (sources / "new.js").write_text("1")
    assert static_collect.collect_if_changed() is True
    assert static_collect.collect_if_changed() is False
    (sources / "new.js").unlink()
    assert static_collect.collect_if_changed() is True


def test_a_lost_manifest_or_another_storage_collects_again(sources, settings):
    static_collect.collect_if_changed()
    (settings.STATIC_ROOT / "staticfiles.json").unlink()
    assert static_collect.collect_if_changed() is True
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {
            "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage",
        },
    }
    assert static_collect.collect_if_changed() is True
    assert static_collect.collect_if_changed() is False
