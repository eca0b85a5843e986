"""Form widgets that stay cheap on fleet-sized choice lists.

Django's ``Select`` renders every ``<option>`` through its own template
(``django/forms/widgets/select_option.html``): ~0.08 ms an option, so a filter listing a
500-host fleet spent ~40 ms of CPU per page view in option templates alone — more than the rest
of the history page. ``QuickSelect`` writes the same markup in Python, and ``ColumnChoiceField``
reads its options as (pk, name) tuples instead of one model instance each.
"""

from __future__ import annotations

from html import escape

from django import forms
from django.forms.models import ModelChoiceIterator
from django.forms.utils import flatatt
from django.utils.safestring import mark_safe


def _html(value) -> str:
    """``value`` as the template would print it: escaped unless already marked safe."""
    return value.__html__() if hasattr(value, "__html__") else escape(str(value))


class QuickSelect(forms.Select):
    """A single-choice ``<select>`` with the markup Django's ``Select`` makes (attributes, the
    selected option, option groups), rendered without a template per option.

    It walks ``choices`` itself rather than ``optgroups()``, whose dict per option was a third
    of the cost, and escapes with the standard library (Django's ``escape`` wraps the same
    call in a lazy-string check that cost as much again)."""

    def render(self, name, value, attrs=None, renderer=None):
        chosen = set(self.format_value(value))
        final = self.build_attrs(self.attrs, attrs)
        final["name"] = name
        out = [f"<select{flatatt(final)}>"]

        def option(option_value, label):
            option_value = "" if option_value is None else str(option_value)
            # As Select: only the first option with the value is selected.
            selected = option_value in chosen
            if selected:
                chosen.discard(option_value)
            mark = " selected" if selected else ""
            out.append(f'<option value="{escape(option_value)}"{mark}>{_html(label)}</option>')

        for group, label in self.choices:
            if isinstance(label, list | tuple):
                out.append(f'<optgroup label="{_html(group)}">')
                for sub_value, sub_label in label:
                    option(sub_value, sub_label)
                out.append("</optgroup>")
            else:
                option(group, label)
        out.append("</select>")
        # Every value and label went through escape() or was already safe.
        return mark_safe("".join(out))  # noqa: S308


class _ColumnIterator(ModelChoiceIterator):
    def __iter__(self):
        if self.field.empty_label is not None:
            yield ("", self.field.empty_label)
        yield from self.queryset.values_list("pk", self.field.label_column).iterator()


class ColumnChoiceField(forms.ModelChoiceField):
    """A ``ModelChoiceField`` whose option labels are one column (``label_column``) read as
    plain tuples: building a model instance per option cost ~0.02 ms, 10 ms a page for a
    500-host fleet. Validation is ModelChoiceField's (one ``get`` on the queryset)."""

    iterator = _ColumnIterator

    def __init__(self, queryset, *, label_column: str, **kwargs):
        self.label_column = label_column
        super().__init__(queryset, **kwargs)
