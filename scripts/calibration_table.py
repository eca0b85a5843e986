#!/usr/bin/env python3
"""Print the simulator-vs-public calibration table (markdown, for the manual, docs/).

Every row is a point of hosts/simulator/calibration.py, re-simulated now in virtual time;
tests/hosts/simulator/test_calibration.py fails when one drifts beyond ±15 %.

    .venv/bin/python scripts/calibration_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hosts.simulator.calibration import POINTS, TOLERANCE, measure, within  # noqa: E402

GPU_NAMES = {"h100-sxm": "H100 SXM", "h200": "H200", "a100-40g": "A100-40GB", "l4": "L4"}


def number(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def render() -> str:
    lines = [
        "| # | Engine | Model | GPU | TP | Workload | Metric | Public | Simulator | Ratio "
        "| Source |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, point in enumerate(POINTS, 1):
        value = measure(point)
        flag = "" if within(point, value) else " ✗"
        model = point.model.rsplit("/", 1)[-1]
        lines.append(
            f"| {i} | {point.engine} | {model} | {GPU_NAMES.get(point.gpu, point.gpu)} | "
            f"{point.tp} | {point.workload} | {point.metric} | {number(point.public)} | "
            f"{number(value)} | {value / point.public:.2f}{flag} | "
            f"[{point.version}]({point.source}) |"
        )
    notes = [f"- {p.key}: {p.note}" for p in POINTS if p.note]
    return "\n".join(
        [*lines, "", f"Tolerance ±{TOLERANCE:.0%}. Notes:", *notes]
        if notes
        else [*lines, "", f"Tolerance ±{TOLERANCE:.0%}."]
    )


if __name__ == "__main__":
    print(render())
