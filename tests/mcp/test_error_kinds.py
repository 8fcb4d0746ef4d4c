"""Error kinds in MCP answers (gateway/model.py ErrorKind, gateway/mcp/results.py failure):
a stored kind is looked up, one from a newer gateway sharing the store is kept as it is."""

from __future__ import annotations

from gateway.mcp.results import failure
from gateway.model import ErrorKind
from tests.mcp.conftest import first_text


def test_a_known_kind_is_looked_up_and_an_unknown_one_is_none() -> None:
    assert ErrorKind.of("saturated") is ErrorKind.SATURATED
    assert ErrorKind.of("internal_error") is ErrorKind.INTERNAL_ERROR
    assert ErrorKind.of("a_newer_gateways_kind") is None


def test_a_stored_kind_answers_as_its_member_and_an_unknown_one_as_it_is() -> None:
    known = failure("saturated", "busy")
    assert known.is_error and known.structured_content == {
        "error_kind": "saturated", "error": "busy", "retryable": True}
    unknown = failure("a_newer_gateways_kind", "odd")
    assert unknown.structured_content == {
        "error_kind": "a_newer_gateways_kind", "error": "odd", "retryable": False}
    assert first_text(unknown) == "Error (a_newer_gateways_kind): odd"
