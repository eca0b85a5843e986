"""What a rule returns: a finding with its evidence and, where one exists, the change that
would address it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CRITICAL, WARNING, INFO = "critical", "warning", "info"
SEVERITY_ORDER = {CRITICAL: 0, WARNING: 1, INFO: 2}


@dataclass(frozen=True)
class Suggestion:
    """The fix: flag changes (dest → new value, as the engine's spec names them), or an
    action outside the config (``action`` text), or both."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    action: str = ""

    @property
    def is_config_change(self) -> bool:
        return bool(self.settings)


@dataclass(frozen=True)
class Finding:
    """One problem a rule saw, with the numbers that show it.

    ``rule``: a stable id (``queue-bound``); ``seen``: the numbers in words, with the window
    they cover ("12 requests waiting on average over the last 60 s while 4 of 4 sequences ran
    and KV use was 31 %"); ``evidence``: the same numbers as data for a chart or an API;
    ``why``: why it matters; ``source``: where the numbers came from (live window, run N)."""

    rule: str
    severity: str
    title: str
    seen: str
    why: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    suggestion: Suggestion | None = None

    def as_dict(self) -> dict:
        suggestion = self.suggestion
        return {
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "seen": self.seen,
            "why": self.why,
            "evidence": dict(self.evidence),
            "source": self.source,
            "suggestion": None
            if suggestion is None
            else {"settings": dict(suggestion.settings), "action": suggestion.action},
        }
