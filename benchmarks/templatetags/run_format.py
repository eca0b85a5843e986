"""Number formats of the benchmark pages."""

from __future__ import annotations

import math

from django import template
from django.template.defaultfilters import floatformat
from django.utils.html import format_html

from benchmarks.metrics import CURRENCY, Metric

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


@register.simple_tag
def metric_cell(run, metric: Metric) -> str:
    """The history table's cell of ``metric`` for ``run``: a share as a percentage (a
    non-zero error rate marked), money with its currency, other numbers with the metric's
    decimals."""
    value = getattr(run, metric.key)
    classes = "num"
    if metric.flag_nonzero and value:
        classes += " error"
    if metric.percent:
        text = pct(value)
    elif metric.unit == CURRENCY:
        classes += " nowrap"
        text = "—" if value is None else f"{floatformat(value, metric.digits)} {run.currency}"
    else:
        text = num(value, metric.digits)
    return format_html('<td class="{}">{}</td>', classes, text)
