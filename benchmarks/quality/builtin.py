"""The probe sets that ship with the panel, written for this project (see ``sets/README.md``).

Each ``sets/<name>.jsonl`` is one named set; ``panel-core`` is all of them together (the
default for a quality check) and ``panel-quick`` is ``panel-core`` without the long-context
items, which cost a few thousand prompt tokens each.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from benchmarks.quality.items import ProbeItem, parse_jsonl

SETS_DIR = Path(__file__).with_name("sets")
CORE = "panel-core"
QUICK = "panel-quick"


class BuiltinSetError(ValueError):
    """A shipped set that does not parse: a bug in the data, reported with its line."""


@cache
def _load(name: str) -> tuple[ProbeItem, ...]:
    path = SETS_DIR / f"{name}.jsonl"
    parsed = parse_jsonl(path.read_bytes())
    if parsed.errors:
        first = parsed.errors[0]
        raise BuiltinSetError(f"{path.name} line {first.line}: {first.message}")
    return tuple(parsed.items)


def set_names() -> list[str]:
    """The file-backed set names, sorted (without the two combined sets)."""
    return sorted(p.stem for p in SETS_DIR.glob("*.jsonl"))


def builtin_sets() -> dict[str, list[ProbeItem]]:
    """Every built-in set by name, plus ``panel-core`` (all) and ``panel-quick``."""
    sets = {name: list(_load(name)) for name in set_names()}
    core = [item for items in sets.values() for item in items]
    sets[CORE] = core
    sets[QUICK] = [i for i in core if i.category != "long_context"]
    return sets


def builtin_set(name: str) -> list[ProbeItem]:
    """One built-in set; KeyError naming the choices when there is none by that name."""
    sets = builtin_sets()
    if name not in sets:
        raise KeyError(f"no built-in set {name!r} (one of {', '.join(sorted(sets))})")
    return sets[name]
