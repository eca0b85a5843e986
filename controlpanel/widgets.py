"""Form widgets that stay cheap on fleet-sized choice lists.

Django's ``Select`` renders every ``<option>`` through its own template
(``django/forms/widgets/select_option.html``): ~0.08 ms an option, so a filter listing a
500-host fleet spent ~40 ms of CPU per page view in option templates alone — more than the rest
of the history page. ``QuickSelect`` writes the same markup in Python.
"""

from __future__ import annotations

from django import forms
from django.forms.utils import flatatt
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe


class QuickSelect(forms.Select):
    """A single-choice ``<select>`` with the markup Django's ``Select`` makes (attributes, the
    selected option, option groups), rendered without a template per option."""

    def render(self, name, value, attrs=None, renderer=None):
        chosen = set(self.format_value(value))
        final = self.build_attrs(self.attrs, attrs)
        final["name"] = name
        parts = []
        for group, options, _ in self.optgroups(name, [], attrs):
            rows = []
            for option in options:
                # As Select: only the first option with the value is selected.
                selected = str(option["value"]) in chosen
                if selected:
                    chosen.discard(str(option["value"]))
                rows.append(
                    format_html(
                        '<option value="{}"{}>{}</option>',
                        option["value"],
                        mark_safe(" selected") if selected else "",
                        option["label"],
                    )
                )
            html = format_html_join("", "{}", ((row,) for row in rows))
            parts.append(
                format_html('<optgroup label="{}">{}</optgroup>', group, html) if group else html
            )
        return format_html(
            "<select{}>{}</select>",
            flatatt(final),
            format_html_join("", "{}", ((part,) for part in parts)),
        )
