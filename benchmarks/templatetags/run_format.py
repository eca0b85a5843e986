"""Number formats of the benchmark pages."""

from __future__ import annotations

import math

from django import template

register = template.Library()


@register.filter
def pct(value, digits: int = 1) -> str:
    """A fraction as a percentage (0.0123 → '1.2 %'); '—' when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{float(value) * 100:.{int(digits)}f} %"


@register.filter
def num(value, digits: int = 0) -> str:
    """A number with thousands separators and ``digits`` decimals; '—' when unknown."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return "—"
    try:
        return f"{float(value):,.{int(digits)}f}"
    except (TypeError, ValueError):
        return str(value)
