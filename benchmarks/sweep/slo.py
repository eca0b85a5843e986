"""The service-level objective a sweep tunes for: latency limits, a per-user speed floor and an
error ceiling, and the check of one measurement against them.

The same check judges a simulator probe and a real benchmark, so its inputs are plain numbers
under fixed names (``ttft_p95_ms``, ``itl_p95_ms``, ``error_rate``, ...). ``margin`` says how
far inside (positive) or outside (negative) the tightest limit a measurement is, which ranks
configs that all fail.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

# (field, label for messages): latency limits, all "≤".
LATENCY_LIMITS = (
    ("ttft_p95_ms", "p95 TTFT"),
    ("ttft_p99_ms", "p99 TTFT"),
    ("itl_p95_ms", "p95 ITL"),
    ("tpot_p95_ms", "p95 TPOT"),
)
# A limit with no measured number counts as violated by this much: worse than any measured
# violation up to twice the limit, so a probe that measured something ranks above it.
MISSING_MARGIN = -1.0


class SloError(ValueError):
    """An SLO that cannot be checked against."""


@dataclass(frozen=True)
class SloCheck:
    ok: bool
    violations: list[str]
    margin: float | None


@dataclass(frozen=True)
class Slo:
    """Limits a config must hold at a load; ``None`` leaves a number unbounded."""

    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    min_output_tps_per_user: float | None = None
    max_error_rate: float = 0.01

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Slo:
        if not isinstance(data, Mapping):
            raise SloError("the SLO must be an object such as {'ttft_p95_ms': 500}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SloError(
                f"unknown SLO field(s) {', '.join(map(str, unknown))} "
                f"(use {', '.join(sorted(names))})"
            )
        values: dict[str, float] = {}
        for name, value in data.items():
            if value is None or value == "":
                continue
            number = _number(name, value)
            if name == "max_error_rate":
                if not 0 <= number <= 1:
                    raise SloError(f"max_error_rate must be between 0 and 1, got {value!r}")
            elif number <= 0:
                raise SloError(f"{name} must be above 0, got {value!r}")
            values[name] = number
        slo = cls(**values)
        if not slo.limits():
            raise SloError(
                "set at least one latency limit (ttft_p95_ms, ttft_p99_ms, itl_p95_ms, "
                "tpot_p95_ms) or min_output_tps_per_user"
            )
        return slo

    def limits(self) -> dict[str, float]:
        """The latency limits and the speed floor that are set."""
        keys = [k for k, _ in LATENCY_LIMITS] + ["min_output_tps_per_user"]
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def describe(self) -> str:
        parts = [
            f"{label} ≤ {getattr(self, key):g} ms"
            for key, label in LATENCY_LIMITS
            if getattr(self, key) is not None
        ]
        if self.min_output_tps_per_user is not None:
            parts.append(f"≥ {self.min_output_tps_per_user:g} tok/s per user")
        parts.append(f"errors ≤ {self.max_error_rate * 100:g} %")
        return ", ".join(parts)

    def scaled(self, time_scale: float) -> Slo:
        """This SLO in the virtual time of a simulator running ``time_scale`` × real time
        (0.25: four times faster): a wall-clock latency L is L / time_scale of its time, and a
        per-user speed S is S × time_scale."""
        if not time_scale > 0:
            raise SloError(f"time_scale must be above 0, got {time_scale!r}")
        changes: dict[str, float] = {
            k: getattr(self, k) / time_scale
            for k, _ in LATENCY_LIMITS
            if getattr(self, k) is not None
        }
        if self.min_output_tps_per_user is not None:
            changes["min_output_tps_per_user"] = self.min_output_tps_per_user * time_scale
        return replace(self, **changes)

    def check(self, numbers: Mapping[str, Any]) -> SloCheck:
        """Whether ``numbers`` meet every limit, what each violation is, and the margin."""
        violations: list[str] = []
        margins: list[float] = []
        for key, label in LATENCY_LIMITS:
            limit = getattr(self, key)
            if limit is None:
                continue
            value = _measured(numbers, key)
            if value is None:
                violations.append(f"no {label} measured")
                margins.append(MISSING_MARGIN)
                continue
            margins.append((limit - value) / limit)
            if value > limit:
                violations.append(f"{label} {value:.0f} ms > {limit:g} ms")
        floor = self.min_output_tps_per_user
        if floor is not None:
            value = _measured(numbers, "output_tps_per_user")
            if value is None:
                violations.append("no output tokens/s per user measured")
                margins.append(MISSING_MARGIN)
            else:
                margins.append((value - floor) / floor)
                if value < floor:
                    violations.append(f"{value:.1f} tok/s per user < {floor:g}")
        errors = _measured(numbers, "error_rate")
        ceiling = self.max_error_rate
        if errors is None:
            violations.append("no error rate measured")
            margins.append(MISSING_MARGIN)
        else:
            if ceiling > 0:
                margins.append((ceiling - errors) / ceiling)
            elif errors > 0:
                # No error allowed: any error is as bad as a missing number.
                margins.append(MISSING_MARGIN)
            if errors > ceiling:
                violations.append(f"errors {errors * 100:.1f} % > {ceiling * 100:g} %")
        return SloCheck(not violations, violations, min(margins) if margins else None)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise SloError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SloError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise SloError(f"{name} must be a finite number, got {value!r}")
    return number


def _measured(numbers: Mapping[str, Any], key: str) -> float | None:
    value = numbers.get(key)
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
