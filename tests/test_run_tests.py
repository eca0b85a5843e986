"""`make test`'s steps (scripts/run_tests.py): the timing lane and the SQLite step collect only
the files that name their mark, and a timing test outside them is caught, not lost."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

spec = importlib.util.spec_from_file_location("run_tests", ROOT / "scripts" / "run_tests.py")
run_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_tests)


@pytest.mark.parametrize("marker", ["timing", "sqlite"])
def test_the_marked_files_are_those_that_name_the_mark(marker):
    found = run_tests.files_marked(marker, [])
    assert found and all(f.startswith("tests/") for f in found)
    named = re.compile(rf"\bmark\.{marker}\b")
    every = sorted((ROOT / "tests").rglob("test_*.py"))
    expected = [str(f.relative_to(ROOT)) for f in every if named.search(f.read_text())]
    assert found == expected
    assert "tests/test_run_tests.py" not in found  # named in a regex here, not as a mark


def test_a_narrowed_run_collects_as_asked():
    assert run_tests.files_marked("timing", ["tests/benchmarks"]) == []
    assert run_tests.files_marked("timing", ["-x"]) != []


def test_a_timing_test_the_lane_did_not_collect_fails_the_run():
    assert (
        run_tests.timing_count_problem("5048 passed, 25 deselected", "25 passed, 123 deselected")
        is None
    )
    assert (
        run_tests.timing_count_problem("5048 passed, 25 deselected", "24 passed, 1 failed, 2 rerun")
        is None
    )
    problem = run_tests.timing_count_problem("5047 passed, 26 deselected", "25 passed")
    assert problem and "left 26 timing tests to the lane, which ran 25" in problem
