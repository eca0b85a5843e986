"""Run every rule over a snapshot: ``evaluate(snapshot)`` → findings, worst first."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from changes.advisor.facts import Snapshot
from changes.advisor.findings import SEVERITY_ORDER, Finding

Rule = Callable[[Snapshot], Iterable[Finding]]

# Filled by changes.advisor.rules (each rule registers itself with @rule).
RULES: dict[str, Rule] = {}


def rule(rule_id: str):
    """Register a rule function under its stable id."""

    def register(fn: Rule) -> Rule:
        if rule_id in RULES:
            raise ValueError(f"two rules named {rule_id!r}")
        RULES[rule_id] = fn
        fn.rule_id = rule_id
        return fn

    return register


def evaluate(snapshot: Snapshot, only: Iterable[str] | None = None) -> list[Finding]:
    """Every registered rule's findings for ``snapshot``, worst first (severity, then rule
    id, so the order is stable). A rule that lacks a fact it needs returns nothing."""
    from changes.advisor import rules as _rules  # noqa: F401 - registers the rules

    wanted = set(only) if only is not None else None
    found: list[Finding] = []
    for rule_id, fn in RULES.items():
        if wanted is not None and rule_id not in wanted:
            continue
        found.extend(fn(snapshot))
    return sorted(found, key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), f.rule))
