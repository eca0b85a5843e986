"""The load generator: drives an OpenAI-compatible endpoint and measures it (pure: no Django).

from benchmarks.loadgen import LoadSpec, Stage, run
result = run(LoadSpec(base_url="http://127.0.0.1:8000", model="m", stages=(Stage(),)))
"""

from importlib import metadata

from benchmarks.loadgen.entry import run
from benchmarks.loadgen.runner import LoadGenError, LoadRun, Result, arun
from benchmarks.loadgen.spec import Dataset, LengthDist, LoadSpec, SpecError, Stage, Trace

try:
    # The load generator ships with the panel: its version is the package's.
    __version__ = metadata.version("llm-control-panel")
except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
    __version__ = "0+unknown"

__all__ = [
    "Dataset",
    "LengthDist",
    "LoadGenError",
    "LoadRun",
    "LoadSpec",
    "Result",
    "SpecError",
    "Stage",
    "Trace",
    "arun",
    "run",
]
