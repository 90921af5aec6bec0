"""What the scheduler stores as a payload or result (``chronoshard.scheduler.api.payloads``):
exact numbers of at most 1000 digits written out, at most 100 levels of nesting, strings
PostgreSQL can hold, and a size counted as stored. Refusals name the request field and
say where in the document, in words, in a bounded message."""

from __future__ import annotations

import json
from decimal import Decimal, localcontext
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chronoshard import exact_json
from chronoshard.scheduler.api import payloads
from chronoshard.scheduler.api.payloads import MAX_DEPTH, MAX_NUMBER_DIGITS
from chronoshard.scheduler.errors import InvalidArgument, PayloadTooLarge

LIMIT = 64 * 1024
FIELD = "payload_json"


def _refusal(data: bytes, limit: int = LIMIT) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as raised:
        payloads.canonical(payloads.parse(data, FIELD, limit, object_only=True), FIELD, limit)
    assert raised.value.field == FIELD
    assert len(str(raised.value)) < 300, str(raised.value)
    return raised.value


def _digits(text: str) -> int:
    with localcontext() as context:
        context.prec = 100_000
        number = context.normalize(Decimal(text))
    return len(format(abs(number), "f").replace(".", ""))


NUMBER_TEXT = st.one_of(
    st.from_regex(r"-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,30})?([eE][-+]?[0-9]{1,4})?", fullmatch=True),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=-(2**128), max_value=2**128).map(str),
)


@settings(max_examples=400, deadline=None)
@example("1e999")
@example("1e1000")
@example("-0.46211904005971607552")
@example("5e-324")
@example("0E-5000")
@given(NUMBER_TEXT)
def test_a_number_is_stored_exactly_or_refused_for_its_digits(text: str) -> None:
    data = b'{"n":' + text.encode() + b"}"
    if _digits(text) > MAX_NUMBER_DIGITS:
        error = _refusal(data)
        assert "$.n" in error.message and f"more than {MAX_NUMBER_DIGITS} digits" in error.message
        return
    stored = payloads.canonical(payloads.parse(data, FIELD, LIMIT, object_only=True), FIELD, LIMIT)
    assert json.loads(stored, parse_float=Decimal, parse_int=Decimal)["n"] == Decimal(text)


def test_nesting_is_bounded_with_a_clear_error() -> None:
    nested = b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1)
    payloads.canonical(
        payloads.parse(b'{"a":' + nested + b"}", FIELD, LIMIT, object_only=True), FIELD, LIMIT
    )
    too_deep = b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
    error = _refusal(too_deep)
    assert f"is nested deeper than {MAX_DEPTH} levels" in error.message
    # Far deeper than the parser's recursion allows: the same words, no RecursionError.
    error = _refusal(b"[" * 50_000 + b"]" * 50_000, limit=200_000)
    assert f"is nested deeper than {MAX_DEPTH} levels" in error.message
    assert "recursion" not in error.message


@pytest.mark.parametrize(
    ("document", "words", "where"),
    [
        (b'{"a":{"b":["x\\u0000y"]}}', "NUL character", "$.a.b[0]"),
        (b'{"k\\u0000":1}', "NUL character", "a key at $"),
        (b'{"s":"\\ud800"}', "lone surrogate (\\ud800)", "$.s"),
        (b'{"weird key!":{"x":"\\u0000"}}', "NUL character", "$['weird key!'].x"),
    ],
)
def test_unstorable_strings_are_refused_naming_where(
    document: bytes, words: str, where: str
) -> None:
    error = _refusal(document)
    assert words in error.message and where in error.message


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\xff", "is not UTF-8"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b"{", "is not valid JSON: Expecting property name"),
        (b"[1]", "must be a JSON object"),
    ],
)
def test_what_is_not_a_json_object_says_so(data: bytes, words: str) -> None:
    assert words in _refusal(data).message


def test_the_size_limit_counts_numbers_written_out_in_full() -> None:
    # 1e300 is 5 bytes as sent and 301 as PostgreSQL keeps and prints it.
    data = b'{"a":[' + b",".join([b"1e300"] * 100) + b"]}"
    assert len(data) < 1024
    with pytest.raises(PayloadTooLarge) as raised:
        payloads.canonical(payloads.parse(data, FIELD, 4096, object_only=True), FIELD, 4096)
    assert raised.value.size_bytes > 100 * 301
    assert str(raised.value).startswith(f"{FIELD}: ")


def test_a_payload_over_the_limit_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(PayloadTooLarge):
        payloads.parse(b"[" * 5000, FIELD, 4096, object_only=True)


@pytest.mark.parametrize(
    ("data", "stored"),
    [(b"", None), (b"null", None), (b"[1,2]", "[1,2]"), (b'"ok"', '"ok"'), (b"1e400", "1E+400")],
)
def test_a_result_is_any_json_value(data: bytes, stored: str | None) -> None:
    assert payloads.stored_form(data, "complete.result_json", LIMIT) == stored


def test_a_result_follows_the_payload_rules() -> None:
    with pytest.raises(InvalidArgument) as raised:
        payloads.stored_form(b'{"r":1e5000}', "complete.result_json", LIMIT)
    assert raised.value.field == "complete.result_json"


def test_canonical_text_sorts_keys_and_keeps_numbers_exact() -> None:
    value = exact_json.loads('{"b":1.10,"a":-0.46211904005971607552,"c":12345678901234567890}')
    assert (
        payloads.canonical(value, FIELD, LIMIT)
        == '{"a":-0.46211904005971607552,"b":1.1,"c":12345678901234567890}'
    )


@pytest.mark.parametrize("value", [{"x": {1, 2}}, {"x": object()}])
def test_values_json_has_no_form_for_are_refused(value: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match="is not JSON-serialisable"):
        payloads.canonical(value, "payload", LIMIT)


def test_a_long_path_is_cut_in_the_message() -> None:
    data = b'{"a":' + b'{"abcdefghij":' * 30 + b'"\\u0000"' + b"}" * 30 + b"}"
    error = _refusal(data)
    assert "..." in error.message and len(error.message) < 300
