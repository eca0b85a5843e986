"""Number formats of the benchmark pages.

Every filter here is total: a result field may be missing from a run (an SGLang engine has no
prefix-cache counters, an imported file leaves columns empty, a failed run has none), and a
missing key in a template reaches a filter as ``''``. None, ``''``, NaN, infinities and
anything that is not a number show as "—" instead of raising (a 500 on the run page).
"""

from __future__ import annotations

import json
import math
from decimal import Decimal

from django import template
from django.utils.html import format_html

from benchmarks.metrics import CURRENCY, Metric
from benchmarks.services.results import status_badge

register = template.Library()

DASH = "—"


def number(value) -> float | None:
    """``value`` as a finite float, or None when it is missing or not a number (booleans
    are not numbers here: ``True`` is no latency)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float | Decimal):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return result if math.isfinite(result) else None


def _digits(digits, default: int) -> int:
    try:
        return max(0, min(int(digits), 10))
    except (TypeError, ValueError):
        return default


@register.filter
def pct(value, digits: int = 1) -> str:
    """A fraction as a percentage (0.0123 → '1.2 %'); '—' when unknown."""
    x = number(value)
    return DASH if x is None else f"{x * 100:.{_digits(digits, 1)}f} %"


@register.filter
def num(value, digits: int = 0) -> str:
    """A number with thousands separators and ``digits`` decimals; '—' when unknown."""
    x = number(value)
    return DASH if x is None else f"{x:,.{_digits(digits, 0)}f}"


@register.filter
def ms(value, digits: int = 0) -> str:
    """A latency in milliseconds with its unit ('412 ms'); '—' when unknown."""
    x = number(value)
    return DASH if x is None else f"{x:,.{_digits(digits, 0)}f} ms"


@register.filter
def total(value, other) -> str:
    """The sum of two counts ('failed of completed + failed'); '—' when either is unknown."""
    a, b = number(value), number(other)
    return DASH if a is None or b is None else f"{a + b:,.0f}"


@register.filter
def money(value, currency: str = "") -> str:
    """An amount with its currency and three decimals; '—' when unknown."""
    x = number(value)
    return DASH if x is None else f"{x:,.3f} {currency or ''}".rstrip()


@register.simple_tag
def metric_cell(run, metric: Metric) -> str:
    """The history table's cell of ``metric`` for ``run``: a share as a percentage (a
    non-zero error rate marked), money with its currency, other numbers with the metric's
    decimals."""
    value = getattr(run, metric.key, None)
    classes = "num"
    if metric.flag_nonzero and number(value):
        classes += " error"
    if metric.percent:
        text = pct(value)
    elif metric.unit == CURRENCY:
        classes += " nowrap"
        x = number(value)
        text = DASH if x is None else f"{x:,.{metric.digits}f} {run.currency}".rstrip()
    else:
        text = num(value, metric.digits)
    return format_html('<td class="{}">{}</td>', classes, text)


@register.simple_tag
def run_status(run, testid: str = "") -> str:
    """A run's status badge (``status_badge``: "Succeeded with errors" when any request
    failed), carrying its status for the live page's script."""
    badge = status_badge(run)
    return format_html(
        '<span class="badge {}" data-run-status="{}" title="{}"{}>{}</span>',
        badge.colour,
        run.status,
        badge.title,
        format_html(' data-testid="{}"', testid) if testid else "",
        badge.label,
    )


@register.filter
def duration(value) -> str:
    """A duration as people read it: '1 min 14 s', '2 h 5 min', '850 ms'; a timedelta or
    seconds; '—' when unknown."""
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    seconds = number(value)
    if seconds is None or seconds < 0:
        return DASH
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


@register.filter
def flag_value(value) -> str:
    """An engine flag's value as written on a command line: true/false, lists and tables as
    JSON, text as it is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return DASH
    if isinstance(value, dict | list | tuple):
        return json.dumps(value)
    return str(value)
