"""The advisor's confusion matrix: every scenario (changes/advisor/scenarios) × every rule,
as a markdown table, with the time evaluate() takes on each scenario's snapshot.

    .venv/bin/python scripts/advisor_matrix.py [--repeat 50]

✔ expected and raised · ✘ expected and missed · ! raised, not expected (bold when the
scenario says it must not) · · neither. The healthy scenario's row marks any critical or
warning finding with !!."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from changes.advisor.engine import RULES, evaluate  # noqa: E402
from changes.advisor.scenarios import SCENARIOS, build  # noqa: E402


def cell(scenario, rule: str, severities: set[str]) -> str:
    expected, raised = rule in scenario.expect, bool(severities)
    if expected:
        return "✔" if raised else "✘"
    if not raised:
        return "·"
    if severities & scenario.quiet:
        return "!!"
    return "**!**" if rule in scenario.must_not else "!"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=50, help="evaluate() calls per scenario")
    args = parser.parse_args()

    started = time.perf_counter()
    snapshots = {name: build(name) for name in SCENARIOS}
    built_s = time.perf_counter() - started
    evaluate(snapshots["healthy"])  # registers the rules
    rules = sorted(RULES)
    print("| scenario | " + " | ".join(rules) + " | evaluate() median / p95 |")
    print("|---" * (len(rules) + 2) + "|")
    misses = []
    for name, scenario in SCENARIOS.items():
        snap = snapshots[name]
        raised: dict[str, set[str]] = {}
        for finding in evaluate(snap):
            raised.setdefault(finding.rule, set()).add(finding.severity)
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            evaluate(snap)
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        p95 = times[max(0, round(0.95 * len(times)) - 1)]
        cells = [cell(scenario, rule, raised.get(rule, set())) for rule in rules]
        misses += [
            f"{name}: {rule} {c} {sorted(raised.get(rule, ()))}"
            for rule, c in zip(rules, cells, strict=True)
            if c != "·" and c != "✔"
        ]
        print(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {statistics.median(times):.2f} / {p95:.2f} ms |"
        )
    print()
    print(f"{len(SCENARIOS)} scenarios built from the simulator in {built_s:.2f} s.")
    if misses:
        print("Not as expected: " + "; ".join(misses) + ".")


if __name__ == "__main__":
    main()
