"""The scheduler's side of the document rules (``chronoshard.scheduler.api.payloads``): every
refusal of :mod:`chronoshard.json_documents` (the rules themselves are tested in
``test_json_documents.py``) becomes ``InvalidArgument`` naming the request field, with the
rule's words and the place in the document in its message, or ``PayloadTooLarge``
carrying the sizes."""

from __future__ import annotations

import pytest

from chronoshard import json_documents
from chronoshard.scheduler.api import payloads
from chronoshard.scheduler.errors import InvalidArgument, PayloadTooLarge

LIMIT = 64 * 1024
FIELD = "payload_json"


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",
        b"{",
        b"[1]",
        b'{"a":{"b":["x\\u0000y"]}}',
        b'{"r":1e5000}',
        b'{"a":' + b"[" * 200 + b"]" * 200 + b"}",
    ],
)
def test_a_refusal_names_the_field_and_says_what_the_rules_say(data: bytes) -> None:
    with pytest.raises(json_documents.DocumentRefused) as rule:
        json_documents.canonical(json_documents.parse(data, LIMIT, object_only=True), LIMIT)
    with pytest.raises(InvalidArgument) as raised:
        payloads.canonical(payloads.parse(data, FIELD, LIMIT, object_only=True), FIELD, LIMIT)
    assert type(raised.value) is InvalidArgument
    assert raised.value.field == FIELD
    assert raised.value.message == rule.value.problem
    assert str(raised.value) == f"{FIELD}: {rule.value.problem}"


def test_over_the_limit_is_payload_too_large_with_the_sizes() -> None:
    # As sent (before parsing), and as stored (1e300 is 301 bytes written out).
    with pytest.raises(PayloadTooLarge) as raised:
        payloads.parse(b"[" * 5000, FIELD, 4096, object_only=True)
    assert (raised.value.size_bytes, raised.value.limit_bytes) == (5000, 4096)
    data = b'{"a":[' + b",".join([b"1e300"] * 100) + b"]}"
    with pytest.raises(PayloadTooLarge) as raised:
        payloads.canonical(payloads.parse(data, FIELD, 4096, object_only=True), FIELD, 4096)
    assert raised.value.size_bytes > 100 * 301
    assert str(raised.value).startswith(f"{FIELD}: ")
    assert raised.value.reason == "PAYLOAD_TOO_LARGE"


@pytest.mark.parametrize(
    ("data", "stored"),
    [(b"", None), (b"null", None), (b"[1,2]", "[1,2]"), (b"1e400", "1E+400")],
)
def test_a_result_is_any_json_value(data: bytes, stored: str | None) -> None:
    assert payloads.stored_form(data, "complete.result_json", LIMIT) == stored


def test_a_result_follows_the_payload_rules() -> None:
    with pytest.raises(InvalidArgument) as raised:
        payloads.stored_form(b'{"r":1e5000}', "complete.result_json", LIMIT)
    assert raised.value.field == "complete.result_json"
    with pytest.raises(PayloadTooLarge) as too_large:
        payloads.stored_form(b'"' + b"x" * 2000 + b'"', "complete.result_json", 1024)
    assert too_large.value.field == "complete.result_json"
