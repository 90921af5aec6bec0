"""The exact JSON codec every end shares (``chronoshard.exact_json``): numbers keep their
value through any number of reads and writes, floats only where a float is the number."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chronoshard import exact_json

PROPERTY = settings(max_examples=400, deadline=None)

NUMBER_TEXT = st.one_of(
    st.from_regex(r"-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][-+]?[0-9]{1,3})?", fullmatch=True),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=-(2**256), max_value=2**256).map(str),
)


def _value(text: str) -> Decimal:
    return Decimal(text)


def _as_decimal(value: object) -> Decimal:
    """The number a decoded value stands for (a float stands for its shortest text)."""
    if isinstance(value, float):
        return Decimal(repr(value))
    assert isinstance(value, int | Decimal) and not isinstance(value, bool)
    return Decimal(value)


@PROPERTY
@example("-0.46211904005971607552")
@example("1e400")
@example("9007199254740993")
@example("18446744073709551617")
@example("2.5e-324")
@example("5e-324")
@example("-0.0")
@example("1.2300000000000000000000000000000000001")
@example("10000000000000001.0")
@given(NUMBER_TEXT)
def test_a_number_keeps_its_value_through_reads_and_writes(text: str) -> None:
    read = exact_json.loads(text)
    assert _as_decimal(read) == _value(text)
    again = exact_json.loads(exact_json.dumps(read))
    assert _as_decimal(again) == _value(text)
    assert type(again) is type(read)


@PROPERTY
@given(NUMBER_TEXT)
def test_a_float_only_where_the_float_is_the_number(text: str) -> None:
    read = exact_json.loads(text)
    plain = json.loads(text)
    if isinstance(plain, int):
        assert read == plain and isinstance(read, int)  # ints were always exact
    elif Decimal(repr(plain)) == Decimal(text):
        assert isinstance(read, float) and read == plain  # most payloads: no change
    else:
        assert isinstance(read, Decimal)  # what json would have rounded (or made inf)


def test_a_decimal_has_no_trailing_zeros_but_keeps_every_other_digit() -> None:
    assert str(exact_json.loads("1.23456789012345678900000")) == "1.234567890123456789"
    assert str(exact_json.loads("1.50000000000000000000001")) == "1.50000000000000000000001"
    assert exact_json.loads("0E-2244") == 0.0  # zero is a float whatever its exponent


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.text() | NUMBER_TEXT.map(exact_json.loads),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _exact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exact(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    return _as_decimal(value)


@PROPERTY
@example({"n": Decimal("1E+400"), "s": "a0123456789abcdef0123456789abcdef:0"})
@given(JSON_VALUES)
def test_documents_round_trip_with_strings_untouched(value: Any) -> None:
    # Strings that look like the encoder's Decimal placeholders stay strings.
    text = exact_json.dumps(value)
    assert _exact(exact_json.loads(text)) == _exact(value)
    assert _exact(json.loads(text, parse_float=Decimal, parse_int=Decimal)) == _exact(value)


def test_dumps_is_compact_keeps_non_ascii_and_sorts_on_request() -> None:
    value = {"b": [1, 2.5, Decimal("-0.46211904005971607552")], "a": "é"}
    assert exact_json.dumps(value) == '{"b":[1,2.5,-0.46211904005971607552],"a":"é"}'
    assert exact_json.dumps(value, sort_keys=True).startswith('{"a":"é",')
    assert exact_json.dumps([Decimal("1.5")], indent=2, separators=(",", ": ")) == "[\n  1.5\n]"


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), Decimal("NaN"), Decimal("-Infinity"), {"x": [Decimal("sNaN")]}],
)
def test_non_finite_numbers_are_not_json(value: Any) -> None:
    with pytest.raises(ValueError):
        exact_json.dumps(value)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", '{"a": NaN}'])
def test_non_finite_literals_are_refused_when_read(text: str) -> None:
    with pytest.raises(ValueError, match="is not a JSON number"):
        exact_json.loads(text)


def test_what_json_cannot_hold_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="set"):
        exact_json.dumps({"s": {1, 2}})


def test_an_integer_too_long_for_int_is_read_as_a_decimal() -> None:
    text = "7" * 5000  # int() refuses more than 4,300 digits
    read = exact_json.loads(text)
    assert isinstance(read, Decimal) and read == Decimal(text)
    # Written with a fraction, so that it is read back as the same Decimal.
    assert exact_json.dumps(read) == text + ".0"
    assert exact_json.loads(exact_json.dumps(read)) == read
