"""The hosts list's GPU cells, built in Python: a page of 50 hosts x 8 GPUs has four columns
of eight readings each, and the template engine spent ~0.1 ms a reading resolving and
rendering them one variable at a time (56 ms of a 60 ms page at 500 hosts, issue 22). Here
each column of a row is one string: text from the database escaped with the standard
library's ``html.escape`` (what Django's own ``escape`` calls, without its lazy-string wrapper,
which was itself half the cost), numbers formatted here."""

from html import escape

from django import template
from django.utils.safestring import mark_safe

register = template.Library()

DASH = "—"


def _num(value, digits: int = 0) -> str:
    """``value`` to ``digits`` decimals; a dash for a reading that is missing or not a number
    (an agent's "N/A" must not break the page)."""
    if isinstance(value, bool):
        return DASH
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return DASH


def _pct(value) -> str:
    text = _num(value)
    return text if text == DASH else f"{text} %"


def _memory(gpu) -> str:
    used = gpu.last_sample.get("memory_used_bytes")
    used_gib = _num(used / 2**30, 1) if isinstance(used, int | float) else DASH
    return f"{used_gib} / {_num(gpu.memory_gib)} GiB"


def _power(sample: dict) -> str:
    watts = _num(sample.get("power_w"))
    if watts == DASH:
        return DASH
    return f"{watts} / {_num(sample.get('power_limit_w'))} W"


def _name(gpu) -> str:
    text = f"{gpu.index}: {escape(gpu.name)}"
    events = gpu.throttle_reasons
    if events:
        reasons = escape(", ".join(str(e) for e in events))
        text += f' <span class="badge amber" title="clock events">{reasons}</span>'
    return text


def _divs(texts, attrs: str = "") -> str:
    return "".join(f"<div{attrs}>{t}</div>" for t in texts)


@register.simple_tag
def gpu_cells(host):
    """The four GPU columns of ``host``'s row (GPUs prefetched in index order)."""
    gpus = list(host.gpus.all())
    if not gpus:
        empty = f'<td><span class="muted">{DASH}</span></td>' + '<td class="num"></td>' * 3
        return mark_safe(empty)  # noqa: S308 - constant text
    names = _divs(_name(g) for g in gpus)
    util = _divs((_pct(g.last_sample.get("utilization_gpu_pct")) for g in gpus), " data-gpu-util")
    memory = _divs(_memory(g) for g in gpus)
    power = _divs(_power(g.last_sample) for g in gpus)
    # Everything from the database went through escape() above; the numbers are our own text.
    return mark_safe(  # noqa: S308
        f'<td>{names}</td><td class="num">{util}</td><td class="num">{memory}</td>'
        f'<td class="num">{power}</td>'
    )
