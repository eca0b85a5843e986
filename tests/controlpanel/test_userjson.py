"""The one parser for JSON from users (issue 14, item 8): NUL characters, deep nesting,
non-finite numbers and bad syntax are refused with a message for the user, never a crash."""

from __future__ import annotations

import pytest

from controlpanel.userjson import UserJSONError, check_value, parse


def test_valid_json_is_returned_as_json_loads_would():
    assert parse('{"a": [1, 2.5, "x", null, true], "b": {"c": "[{"}}') == {
        "a": [1, 2.5, "x", None, True],
        "b": {"c": "[{"},
    }
    assert parse(b'\xef\xbb\xbf{"a": "\xc3\xa9"}') == {"a": "é"}


@pytest.mark.parametrize(
    "text",
    ['{"name": "a\\u0000b"}', '{"a\\u0000": 1}', '["ok", {"deep": ["\\u0000"]}]'],
)
def test_nul_character_anywhere_is_refused(text):
    with pytest.raises(UserJSONError, match="NUL character"):
        parse(text, what="Profile JSON")


def test_escaped_backslash_before_u0000_is_not_a_nul():
    assert parse('{"a": "\\\\u0000"}') == {"a": "\\u0000"}


def test_json_nested_100k_deep_is_refused_without_recursion_error():
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(UserJSONError, match="nested too deeply: more than 64 levels") as info:
        parse(text, what="Labels")
    assert "line 1, column 65" in str(info.value)
    assert str(info.value).startswith("Labels ")


def test_depth_limit_counts_only_brackets_outside_strings():
    assert parse('{"a": "' + "[" * 500 + '"}', max_depth=2) == {"a": "[" * 500}
    assert parse("[" * 3 + "]" * 3, max_depth=3) == [[[]]]
    with pytest.raises(UserJSONError, match="more than 3 levels"):
        parse("[" * 4 + "]" * 4, max_depth=3)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"x": -Infinity}', "[1e999]"])
def test_non_finite_numbers_are_refused(text):
    with pytest.raises(UserJSONError, match="must be finite"):
        parse(text)


def test_invalid_json_names_line_and_column():
    with pytest.raises(UserJSONError) as info:
        parse('{\n  "a": 1,\n  "b" 2\n}', what="Profile JSON")
    assert str(info.value) == (
        "Profile JSON is not valid JSON: Expecting ':' delimiter (line 3, column 7)."
    )


def test_unpaired_surrogate_and_bad_utf8_are_refused():
    with pytest.raises(UserJSONError, match="unpaired surrogate"):
        parse('"\\ud800"')
    with pytest.raises(UserJSONError, match="not UTF-8"):
        parse(b'{"a": "\xff"}')


def test_huge_integer_is_refused_with_a_short_message():
    with pytest.raises(UserJSONError, match="too many digits"):
        parse("1" * 5000)


def test_user_json_error_is_a_value_error():
    assert issubclass(UserJSONError, ValueError)


def test_check_value_finds_nul_in_nested_keys_and_values():
    check_value({"a": ["fine", {"b": 1}]})
    with pytest.raises(UserJSONError, match=r"at a\[1\]\.b"):
        check_value({"a": ["fine", {"b": "x\x00"}]}, what="The imported run")
    with pytest.raises(UserJSONError, match="in a key under a"):
        check_value({"a": {"k\x00": 1}})


def test_user_json_form_field_turns_bad_json_into_form_errors():
    from django import forms

    from controlpanel.forms import UserJSONField

    class LabelsForm(forms.Form):
        labels = UserJSONField(what="Labels", required=False)

    for text, message in [
        ('{"env": "prod\\u0000"}', "NUL character"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"x": NaN}', "must be finite"),
        ('{"x": ', "not valid JSON"),
    ]:
        form = LabelsForm(data={"labels": text})
        assert not form.is_valid()
        assert message in form.errors["labels"][0]
        assert form.errors["labels"][0].startswith("Labels ")
        form.as_p()  # re-rendering the bad input must not raise either
    form = LabelsForm(data={"labels": '{"env": "production"}'})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["labels"] == {"env": "production"}
