"""A probe item's JSON Schema reaches nothing (benchmarks.quality.schemas): a ``$ref`` to a
URL or a file was fetched by jsonschema's default resolver and its content came back in the
validation message; an unresolvable one was a 500, a recursive one a RecursionError 500."""

from __future__ import annotations

import json

import pytest

from benchmarks.quality.items import AnswerKey, ProbeItem, parse_jsonl
from benchmarks.quality.scorers import score
from tests.benchmarks.quality.test_items import line
from tests.httpserver import Handler, serve

SECRET = "internal-only-4711"


@pytest.fixture(scope="module")
def internal():
    """A server on the panel's loopback with something it must never pass on; its URL and
    the paths asked of it."""
    asked: list[str] = []

    class Internal(Handler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            asked.append(self.path)
            self.reply(200, json.dumps({"type": "string", "const": SECRET}).encode())

    with serve(Internal) as port:
        yield f"http://127.0.0.1:{port}", asked


def json_line(schema) -> str:
    return line(answer={"scorer": "json", "schema": schema}, reference='{"a": 1}', wrong=None)


def upload_error(schema) -> str:
    parsed = parse_jsonl(json_line(schema))
    assert not parsed.items
    (error,) = parsed.errors
    return error.message


def test_an_upload_naming_a_url_or_a_file_is_refused_and_nothing_is_fetched(internal):
    url, asked = internal
    for ref in (f"{url}/internal.json", "file:///etc/passwd", "other.json#/a"):
        message = upload_error({"$ref": ref})
        assert "only references within the schema itself" in message, message
        assert ref in message
    nested = {"type": "object", "properties": {"a": {"$ref": f"{url}/deep.json"}}}
    assert "only references within the schema itself" in upload_error(nested)
    assert asked == []


def test_a_reference_cycle_is_refused_at_upload_not_a_500():
    assert "recurse without end" in upload_error({"$ref": "#"})
    assert "recurse without end" in upload_error(
        {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    )


def test_references_within_the_schema_still_work():
    schema = {
        "$defs": {"count": {"type": "integer", "minimum": 0}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/count"}},
        "required": ["a"],
    }
    (item,) = parse_jsonl(json_line(schema)).items
    assert score(item, '{"a": 3}').correct is True
    bad = score(item, '{"a": -1}')
    assert bad.correct is False and bad.detail.startswith("schema: a: -1 is less than")


def test_scoring_a_stored_item_with_a_foreign_reference_fetches_nothing(internal):
    # An item stored before the upload check: the worker scoring answers refuses it in words.
    url, asked = internal
    item = ProbeItem(
        id="old",
        category="json",
        language="en",
        answer=AnswerKey(scorer="json", schema={"$ref": f"{url}/internal.json"}),
        messages=({"role": "user", "content": "q"},),
    )
    result = score(item, '{"a": 1}')
    assert result.correct is False and result.schema_ok is False
    assert "the schema cannot be used" in result.detail and SECRET not in result.detail
    looping = ProbeItem(
        id="loop",
        category="json",
        language="en",
        answer=AnswerKey(scorer="json", schema={"$ref": "#"}),
        messages=({"role": "user", "content": "q"},),
    )
    assert "recurse" in score(looping, "{}").detail
    assert asked == []
