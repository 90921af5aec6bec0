"""The document rules every stored JSON document follows (``chronoshard.json_documents``):
exact numbers of at most 1000 digits written out, at most 100 levels of nesting, strings
PostgreSQL can hold, and a size counted as stored. A refusal names the rule and says
where in the document, in words, in a bounded message.

The node checks the bytes it receives (:func:`parse` then :func:`canonical`); the worker
SDK checks the Python value a handler returned (:func:`check`) before encoding it. The
two must agree, or the worker would send what the node refuses: a property below."""

from __future__ import annotations

import json
from decimal import Decimal, localcontext
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chronoshard import exact_json, json_documents
from chronoshard.json_documents import (
    MAX_DEPTH,
    MAX_NUMBER_DIGITS,
    DocumentRefused,
    DocumentTooLarge,
    Rule,
)

LIMIT = 64 * 1024


def _refusal(data: bytes, limit: int = LIMIT, *, object_only: bool = True) -> DocumentRefused:
    with pytest.raises(DocumentRefused) as raised:
        json_documents.canonical(json_documents.parse(data, limit, object_only=object_only), limit)
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
        assert error.rule is Rule.NUMBER
        assert "$.n" in error.problem and f"more than {MAX_NUMBER_DIGITS} digits" in error.problem
        return
    stored = json_documents.canonical(json_documents.parse(data, LIMIT, object_only=True), LIMIT)
    assert json.loads(stored, parse_float=Decimal, parse_int=Decimal)["n"] == Decimal(text)


def test_nesting_is_bounded_with_a_clear_error() -> None:
    nested = b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1)
    json_documents.canonical(
        json_documents.parse(b'{"a":' + nested + b"}", LIMIT, object_only=True), LIMIT
    )
    too_deep = b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
    error = _refusal(too_deep)
    assert error.rule is Rule.DEPTH
    assert f"is nested deeper than {MAX_DEPTH} levels" in error.problem
    # Far deeper than the parser's recursion allows: the same words, no RecursionError.
    error = _refusal(b"[" * 50_000 + b"]" * 50_000, limit=200_000)
    assert error.rule is Rule.DEPTH
    assert f"is nested deeper than {MAX_DEPTH} levels" in error.problem
    assert "recursion" not in error.problem


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
    assert error.rule is Rule.STRING
    assert words in error.problem and where in error.problem


@pytest.mark.parametrize(
    ("data", "rule", "words"),
    [
        (b"\xff", Rule.SYNTAX, "is not UTF-8"),
        (b'{"a": NaN}', Rule.SYNTAX, "NaN is not a JSON number"),
        (b"{", Rule.SYNTAX, "is not valid JSON: Expecting property name"),
        (b"[1]", Rule.TYPE, "must be a JSON object"),
    ],
)
def test_what_is_not_a_json_object_says_so(data: bytes, rule: Rule, words: str) -> None:
    error = _refusal(data)
    assert error.rule is rule and words in error.problem


def test_the_size_limit_counts_numbers_written_out_in_full() -> None:
    # 1e300 is 5 bytes as sent and 301 as PostgreSQL keeps and prints it.
    data = b'{"a":[' + b",".join([b"1e300"] * 100) + b"]}"
    assert len(data) < 1024
    with pytest.raises(DocumentTooLarge) as raised:
        json_documents.canonical(json_documents.parse(data, 4096, object_only=True), 4096)
    assert raised.value.rule is Rule.SIZE
    assert raised.value.size_bytes > 100 * 301 and raised.value.limit_bytes == 4096
    # Without a limit (the worker does not know the node's) the size is not checked.
    json_documents.canonical(json_documents.parse(data, None, object_only=True), None)


def test_a_document_over_the_limit_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(DocumentTooLarge):
        json_documents.parse(b"[" * 5000, 4096, object_only=True)


@pytest.mark.parametrize(
    ("data", "stored"),
    [(b"", None), (b"null", None), (b"[1,2]", "[1,2]"), (b'"ok"', '"ok"'), (b"1e400", "1E+400")],
)
def test_a_result_is_any_json_value(data: bytes, stored: str | None) -> None:
    assert json_documents.stored_form(data, LIMIT) == stored


def test_canonical_text_sorts_keys_and_keeps_numbers_exact() -> None:
    value = exact_json.loads('{"b":1.10,"a":-0.46211904005971607552,"c":12345678901234567890}')
    assert (
        json_documents.canonical(value, LIMIT)
        == '{"a":-0.46211904005971607552,"b":1.1,"c":12345678901234567890}'
    )


@pytest.mark.parametrize("value", [{"x": {1, 2}}, {"x": object()}])
def test_values_json_has_no_form_for_are_refused(value: dict[str, Any]) -> None:
    with pytest.raises(DocumentRefused, match="is not JSON-serialisable") as raised:
        json_documents.canonical(value, LIMIT)
    assert raised.value.rule is Rule.TYPE


def test_a_long_path_is_cut_in_the_message() -> None:
    data = b'{"a":' + b'{"abcdefghij":' * 30 + b'"\\u0000"' + b"}" * 30 + b"}"
    error = _refusal(data)
    assert "..." in error.problem and len(error.problem) < 300


# ---- Python values, as a handler returns them (the worker SDK's side) -------------------


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "rule", "words"),
    [
        ({"x": "\u0000"}, Rule.STRING, "a string at $.x contains a NUL"),
        ({"\ud800": 1}, Rule.STRING, "a key at $ contains a lone surrogate"),
        ((1, ("a\u0000",)), Rule.STRING, "$[1][0]"),  # a tuple is written as an array
        (_nested(200), Rule.DEPTH, f"is nested deeper than {MAX_DEPTH} levels"),
        ({"n": 10**1500}, Rule.NUMBER, "the number at $.n ('1000"),
        # Longer than str() may print: described, not quoted.
        ({"n": -(10**20_000)}, Rule.NUMBER, "an integer of at least 20000 digits"),
        ({"n": Decimal("1e5000")}, Rule.NUMBER, "('1E+5000')"),
        ({"n": Decimal("NaN")}, Rule.SYNTAX, "at $.n: NaN is not a JSON number"),
    ],
)
def test_a_python_value_is_refused_by_the_same_rules(value: Any, rule: Rule, words: str) -> None:
    with pytest.raises(DocumentRefused) as raised:
        json_documents.check(value)
    assert raised.value.rule is rule
    assert words in raised.value.problem, raised.value.problem
    assert len(raised.value.problem) < 300


def test_a_circular_value_is_refused_for_its_depth_not_hung_on() -> None:
    loop: dict[str, Any] = {}
    loop["again"] = loop
    with pytest.raises(DocumentRefused) as raised:
        json_documents.check(loop)
    assert raised.value.rule is Rule.DEPTH


def test_what_encodes_but_is_not_json_is_left_to_the_encoder() -> None:
    # check() refuses only what would encode and not be stored; sets, objects and NaN
    # floats are the encoder's to refuse (TypeError/ValueError).
    assert json_documents.check({"s": {1, 2}, "o": object(), "f": float("nan")}) == 0


def test_growth_is_what_numbers_gain_written_out() -> None:
    # "1e+300" (float repr) is 6 characters, 301 written out; Decimal 1E+3 is 4, then 4.
    assert json_documents.check([1e300]) == 301 - len("1e+300")
    assert json_documents.check([Decimal("1E+3")]) == 0


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**1100), max_value=10**1100),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
        lambda d: abs(d.adjusted()) < 1500
    ),
    st.text(max_size=5),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=20,
)


def _verdict(step: Any) -> Rule | None:
    try:
        step()
    except DocumentRefused as exc:
        return exc.rule
    return None


@settings(max_examples=300, deadline=None)
@example(_nested(MAX_DEPTH))
@example(_nested(MAX_DEPTH - 1))
@example({"k": "\ud83d"})
@example(10**999)
@example(10**1000)
@given(JSON_VALUES)
def test_the_worker_s_check_of_a_value_agrees_with_the_node_s_check_of_its_bytes(
    value: Any,
) -> None:
    # The SDK checks what the handler returned; the node checks the bytes the SDK sent.
    # A value the SDK lets through must be stored, and one it refuses must be refused by
    # the node for the same rule: the worker never sends what the node refuses, and never
    # fails what the node would have stored.
    on_worker = _verdict(lambda: json_documents.check(value))
    if on_worker is Rule.STRING:
        return  # a lone surrogate cannot even be encoded as UTF-8 to be sent
    data = exact_json.dumps(value).encode()
    on_node = _verdict(lambda: json_documents.stored_form(data, None))
    assert on_worker == on_node
