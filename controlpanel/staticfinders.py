"""Serve plotly.js from the installed plotly package rather than a copy in the repo."""

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
STATIC_PATH = "vendor/plotly.min.js"


class PlotlyJsFinder(BaseFinder):
    """Finds ``vendor/plotly.min.js`` (the one file, not plotly's whole package_data)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=str(PLOTLY_JS.parent))

    def check(self, **kwargs):
        from django.core.checks import Error

        if not PLOTLY_JS.is_file():
            return [Error(f"plotly.js not found at {PLOTLY_JS}", id="controlpanel.E001")]
        return []

    def find(self, path, find_all=False, **kwargs):
        if path == STATIC_PATH:
            return [str(PLOTLY_JS)] if find_all else str(PLOTLY_JS)
        return [] if find_all else None

    def list(self, ignore_patterns):
        # (relative path inside storage, storage); storage prefix maps it under vendor/.
        self.storage.prefix = "vendor"
        yield PLOTLY_JS.name, self.storage
