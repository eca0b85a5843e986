"""Run every rule over a snapshot: ``evaluate(snapshot)`` → findings, worst first."""

from __future__ import annotations

from collections.abc import Iterable

from changes.advisor import rules as _rules  # noqa: F401 - importing it registers the rules
from changes.advisor.facts import Snapshot
from changes.advisor.findings import SEVERITY_ORDER, Finding
from changes.advisor.registry import RULES, Rule, rule  # noqa: F401 - the engine's names


def evaluate(snapshot: Snapshot, only: Iterable[str] | None = None) -> list[Finding]:
    """Every registered rule's findings for ``snapshot``, worst first (severity, then rule
    id, so the order is stable). A rule that lacks a fact it needs returns nothing."""
    wanted = set(only) if only is not None else None
    found: list[Finding] = []
    for rule_id, fn in RULES.items():
        if wanted is not None and rule_id not in wanted:
            continue
        found.extend(fn(snapshot))
    return sorted(found, key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), f.rule))
