"""The rules' registry: each rule module registers its functions with ``@rule("id")`` as it
is imported (``changes.advisor.rules`` imports them all); ``changes.advisor.engine`` runs what
is registered. Below both, so the rules need not import the engine that imports them.

``RULES`` is filled once, at import, under the import lock, and only read after."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from changes.advisor.facts import Snapshot
from changes.advisor.findings import Finding

Rule = Callable[[Snapshot], Iterable[Finding]]

# Filled as the rule modules are imported (each rule registers itself with @rule).
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
