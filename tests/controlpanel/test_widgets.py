"""QuickSelect renders the markup of Django's Select without a template per option."""

from __future__ import annotations

import pytest
from django import forms
from django.test.html import parse_html
from django.utils.safestring import mark_safe

from controlpanel.widgets import ColumnChoiceField, QuickSelect
from tests.factories import make_host

CHOICES = [("", "any"), ("a", "Alpha & <b>"), ("b", 'Quote "b"'), ("c", "C")]
GROUPED = [("", "any"), ("Fruit", [("apple", "Apple"), ("pear", "Pear")]), ("x", "X")]
# Numbers, a None value, a value listed twice (only the first is selected), a safe label, a
# group name to escape.
ODD = [
    (None, "none"),
    (1, "one"),
    (2, mark_safe("<i>two</i>")),
    ("A&B <g>", [(1, "one again"), ("3", "three")]),
]


@pytest.mark.parametrize("value", [None, "", "a", "b", "zzz", ["c"], 1, "3"])
@pytest.mark.parametrize("choices", [CHOICES, GROUPED, ODD])
def test_same_markup_as_djangos_select(value, choices):
    attrs = {"id": "id_pick", "class": "wide", "data-x": "1"}
    ours = QuickSelect(choices=choices, attrs={"class": "wide"})
    django = forms.Select(choices=choices, attrs={"class": "wide"})
    got = ours.render("pick", value, {"id": "id_pick", "data-x": "1"})
    want = django.render("pick", value, {"id": "id_pick", "data-x": "1"})
    assert parse_html(got) == parse_html(want), (got, want)
    if choices is CHOICES:
        assert "<b>" not in got and "&lt;b&gt;" in got  # labels escaped
    assert attrs["class"] in got


@pytest.mark.django_db
def test_in_a_form_a_model_choice_keeps_its_selection_and_required_attribute():
    hosts = [make_host(name=f"h{i}") for i in range(3)]

    class Pick(forms.Form):
        host = forms.ModelChoiceField(
            queryset=type(hosts[0]).objects.order_by("name"), widget=QuickSelect
        )

    class Plain(forms.Form):
        host = forms.ModelChoiceField(queryset=type(hosts[0]).objects.order_by("name"))

    for data in ({"host": str(hosts[1].pk)}, {}):
        got, want = str(Pick(data)["host"]), str(Plain(data)["host"])
        assert parse_html(got) == parse_html(want), (got, want)
    assert f'value="{hosts[1].pk}" selected' in str(Pick({"host": hosts[1].pk})["host"])
    assert "required" in str(Pick({})["host"])


@pytest.mark.django_db
def test_a_column_choice_field_offers_and_validates_what_a_model_choice_field_does():
    hosts = [make_host(name=name) for name in ("b<2>", "a&1", "c")]
    Host = type(hosts[0])

    class Columns(forms.Form):
        host = ColumnChoiceField(
            Host.objects.order_by("name"), label_column="name", empty_label="any", required=False
        )

    class Models(forms.Form):
        host = forms.ModelChoiceField(
            Host.objects.order_by("name"), empty_label="any", required=False
        )

    for data in ({"host": str(hosts[0].pk)}, {}, {"host": "999999"}, {"host": "x"}):
        ours, theirs = Columns(data), Models(data)
        assert parse_html(str(ours["host"])) == parse_html(str(theirs["host"]))
        assert ours.is_valid() == theirs.is_valid()
        assert ours.errors == theirs.errors
        if ours.is_valid():
            assert ours.cleaned_data == theirs.cleaned_data
    chosen = Columns({"host": str(hosts[0].pk)})
    assert chosen.is_valid() and chosen.cleaned_data["host"] == hosts[0]
    assert not Columns({"host": "999999"}).is_valid()
