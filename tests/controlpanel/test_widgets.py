"""QuickSelect renders the markup of Django's Select without a template per option."""

from __future__ import annotations

import pytest
from django import forms
from django.test.html import parse_html

from controlpanel.widgets import QuickSelect
from tests.factories import make_host

CHOICES = [("", "any"), ("a", "Alpha & <b>"), ("b", 'Quote "b"'), ("c", "C")]
GROUPED = [("", "any"), ("Fruit", [("apple", "Apple"), ("pear", "Pear")]), ("x", "X")]


@pytest.mark.parametrize("value", [None, "", "a", "b", "zzz", ["c"]])
@pytest.mark.parametrize("choices", [CHOICES, GROUPED])
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
