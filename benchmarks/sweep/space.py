"""The search space of a tuning sweep: which engine flags vary, and over which values.

Every value goes through the engine's own flag table (``Flag.coerce`` and ``Flag.check``), so
a space refuses what the engine would refuse, in the engine's words, before anything is
simulated or run. Only flags that can change speed may vary: a sweep over a log setting would
measure the same engine many times, and credentials or code-loading switches are not tuning.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from hosts.engines import EngineArgError, get_spec
from hosts.engines.flags import Flag

MAX_VALUES_PER_FLAG = 64
# Each point costs ~0.1-0.2 s of CPU to predict; 5000 points is minutes, not hours.
MAX_POINTS = 5000


class SpaceError(ValueError):
    """A search space that cannot be swept; ``errors`` maps a flag (or "" for the whole space)
    to what is wrong with it."""

    def __init__(self, errors: Mapping[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{k}: {v}" if k else v for k, v in self.errors.items()))


@dataclass(frozen=True)
class Dimension:
    """One varied flag and its values, in the order they are tried."""

    flag: str
    values: tuple


@dataclass(frozen=True)
class SearchSpace:
    """The cartesian product of its dimensions."""

    engine: str
    dimensions: tuple[Dimension, ...]

    @property
    def size(self) -> int:
        return math.prod(len(d.values) for d in self.dimensions)

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(d.flag for d in self.dimensions)

    def points(self) -> Iterator[dict]:
        """Every point as ``{flag: value}``; the last dimension varies fastest."""
        for combo in itertools.product(*(d.values for d in self.dimensions)):
            yield dict(zip(self.flags, combo, strict=True))

    def to_dict(self) -> dict:
        return {d.flag: list(d.values) for d in self.dimensions}

    def describe(self) -> str:
        parts = [f"{d.flag} ∈ {{{', '.join(_show(v) for v in d.values)}}}" for d in self.dimensions]
        noun = "point" if self.size == 1 else "points"
        return f"{' × '.join(parts)} ({self.size} {noun})"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def parse_space(engine: str, engine_version: str | None, raw: Mapping[str, Any]) -> SearchSpace:
    """The search space ``raw`` describes, or SpaceError naming every bad flag.

    ``raw`` maps a flag's dest to a list of values, ``{"values": [...]}``, a range
    ``{"min": a, "max": b, "step": s}`` (inclusive, int and float flags) or text as
    ``parse_dimension_text`` reads it.
    """
    try:
        spec = get_spec(engine)
    except EngineArgError as exc:
        raise SpaceError({"": str(exc)}) from None
    if not isinstance(raw, Mapping) or not raw:
        raise SpaceError({"": "choose at least one flag"})
    errors: dict[str, str] = {}
    dimensions = []
    for dest, given in raw.items():
        flag = spec.by_dest.get(dest)
        try:
            if flag is None:
                raise EngineArgError(f"{spec.prog} has no setting {dest!r}")
            reason = spec.missing(flag, engine_version)
            if reason is not None:
                raise EngineArgError(reason)
            _sweepable(flag)
            values = _values(flag, given)
        except (EngineArgError, ValueError) as exc:
            errors[str(dest)] = str(exc)
            continue
        dimensions.append(Dimension(dest, values))
    if errors:
        raise SpaceError(errors)
    space = SearchSpace(engine, tuple(dimensions))
    if space.size > MAX_POINTS:
        raise SpaceError({"": f"the space has {space.size} points; at most {MAX_POINTS}"})
    return space


def _sweepable(flag: Flag) -> None:
    if flag.secret:
        raise ValueError(f"{flag.option} is a credential, not a tuning setting")
    if flag.loads_code:
        raise ValueError(f"{flag.option} makes the engine load code; a sweep cannot vary it")
    if not flag.performance:
        raise ValueError(
            f"{flag.option} has no effect on speed: every value would measure the same engine"
        )


def _values(flag: Flag, given: Any) -> tuple:
    if isinstance(given, str):
        given = parse_dimension_text(flag, given)
    if isinstance(given, Mapping):
        if "values" in given:
            if set(given) != {"values"}:
                raise ValueError('give either {"values": [...]} or {"min", "max", "step"}')
            given = given["values"]
        else:
            given = _range(flag, given)
    if not isinstance(given, list | tuple):
        raise ValueError("give a list of values, a range or text such as 16,32,64")
    if not given:
        raise ValueError("give at least one value")
    if len(given) > MAX_VALUES_PER_FLAG:
        raise ValueError(f"{len(given)} values; at most {MAX_VALUES_PER_FLAG} per flag")
    out: list = []
    for value in given:
        if value is None:
            raise ValueError(f"argument {flag.option}: expected one argument")
        coerced = flag.coerce(value)  # Flag.coerce runs Flag.check too
        # Compare with the type: True == 1 and 1 == 1.0 would otherwise collapse.
        if not any(type(c) is type(coerced) and c == coerced for c in out):
            out.append(coerced)
    return tuple(out)


def _range(flag: Flag, given: Mapping) -> list:
    if flag.type not in ("int", "float"):
        raise ValueError(f"a range needs a number flag; {flag.option} takes {flag.type} values")
    unknown = sorted(set(given) - {"min", "max", "step"})
    if unknown:
        raise ValueError(f"unknown range key(s) {', '.join(unknown)} (use min, max, step)")
    if "min" not in given or "max" not in given:
        raise ValueError("a range needs min and max")
    if "step" not in given and flag.type == "float":
        raise ValueError("a range of a float flag needs a step")
    try:
        # Decimal of the text: 0.8 + 3 × 0.05 is 0.95 exactly, not 0.9500000000000001.
        low, high, step = (
            Decimal(str(given[k])) if k in given else Decimal(1) for k in ("min", "max", "step")
        )
    except (InvalidOperation, ValueError, TypeError):
        raise ValueError("range min, max and step must be numbers") from None
    if any(isinstance(given.get(k), bool) for k in ("min", "max", "step")) or not all(
        x.is_finite() for x in (low, high, step)
    ):
        raise ValueError("range min, max and step must be numbers")
    if step <= 0:
        raise ValueError("the range step must be above 0")
    if high < low:
        raise ValueError(f"the range goes down: min {low} is above max {high}")
    count = int((high - low) / step) + 1
    if count > MAX_VALUES_PER_FLAG:
        raise ValueError(f"{count} values; at most {MAX_VALUES_PER_FLAG} per flag")
    kind = int if flag.type == "int" else float
    values = []
    for i in range(count):
        value = low + i * step
        if kind is int and value != value.to_integral_value():
            raise ValueError(f"argument {flag.option}: invalid int value: '{value}'")
        values.append(kind(value))
    return values


def parse_dimension_text(flag: Flag | str, text: str) -> list | dict:
    """Text from a form or the command line: ``16,32,64``, ``0.80:0.95:0.05`` (min:max:step,
    number flags only; ``a:b`` steps by 1 for int flags) or ``true,false``. Values stay text:
    the flag's own parser reads them (``32k`` for vLLM's integers)."""
    text = text.strip()
    kind = flag.type if isinstance(flag, Flag) else "str"
    if kind in ("int", "float") and ":" in text:
        parts = [p.strip() for p in text.split(":")]
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"read {text!r} as min:max:step, e.g. 0.80:0.95:0.05")
        keys = ("min", "max", "step")[: len(parts)]
        return dict(zip(keys, parts, strict=True))
    values = [v.strip() for v in text.split(",")]
    if not text or not all(values):
        raise ValueError("give values separated by commas, e.g. 16,32,64")
    return values
