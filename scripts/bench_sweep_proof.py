#!/usr/bin/env python3
"""The tuning sweep's two promises, measured through the panel's whole path (docs/:
"Benchmarks"): with a third of a grid's real trials the sweep's winner is within 5 % of the
best config the full grid finds, and each trial's measured max rate at the SLO is within 15 %
of the simulator's prediction.

It runs ``tests/changes/test_sweep_proof.py`` (a real host agent supervising simulated H100
engines at half real time; a 6-point grid of max_num_seqs × max_num_batched_tokens; real
benchmarks at the searched loads) on a throwaway SQLite database and prints its table. About
2.5 minutes on a 2-core machine. Exit status: the test's.

    .venv/bin/python scripts/bench_sweep_proof.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="sweep-proof-") as var:
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
            "VAR_DIR": var,
            "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-" + "x" * 50),
        }
        command = [
            sys.executable,
            "-m",
            "pytest",
            "tests/changes/test_sweep_proof.py",
            "-s",
            "-q",
            "-p",
            "no:cacheprovider",
        ]
        return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
