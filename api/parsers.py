"""The API's JSON bodies, read by the panel's one parser for user JSON."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from controlpanel.userjson import UserJSONError, parse


class UserJSONParser(JSONParser):
    """DRF's JSON parser catches only ``ValueError``: a body nested 100,000 deep raised
    ``RecursionError`` there (a 500 on every POST). ``controlpanel.userjson.parse`` measures
    the depth first and refuses NUL characters, lone surrogates and non-finite numbers that
    PostgreSQL cannot store, with a message for the caller: a 400 problem."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            return parse(raw, what="The request body")
        except UserJSONError as exc:
            raise ParseError(str(exc)) from None
