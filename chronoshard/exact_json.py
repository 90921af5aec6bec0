"""JSON with exact numbers, for every end that reads or writes a payload, result or checkpoint.

PostgreSQL keeps JSON numbers as ``numeric`` in ``jsonb``: exact, whatever their size or
number of digits. Python's :mod:`json` keeps integers exact but reads every other number
as a ``float``, so ``-0.46211904005971607552`` came back as ``-0.4621190400597161``, and
``1e400`` became ``inf``, which it then refused to write ("not JSON-serialisable"). This
module is the one codec the client, the worker SDK and the scheduler use instead:

- :func:`loads` reads an integer as ``int`` and any other number as ``float`` when the
  float *is* that number (its shortest text denotes the same decimal value: ``0.1``,
  ``1.5e-7``, ``5e-324``), else as :class:`decimal.Decimal`, which holds it exactly
  (``-0.46211904005971607552``, ``1e400``), without trailing zeros (``1.2300...0001``
  keeps them all, ``0.1000...000`` is ``0.1``). Most payloads therefore still read as
  plain floats, and only numbers a double cannot hold arrive as ``Decimal``. An integer too
  long for ``int()`` (over 4,000 digits, Python's conversion limit) arrives as a Decimal too.
  ``NaN`` and ``Infinity`` are not JSON and are refused.
- :func:`dumps` writes compact text (non-ASCII kept) and accepts ``Decimal`` besides
  what :func:`json.dumps` takes, writing it exactly. Non-finite numbers are refused.

A number read by :func:`loads` and written by :func:`dumps` keeps its value exactly (not
always its notation: ``1E5`` reads as ``100000.0``). Pure and dependency-free.
"""

from __future__ import annotations

import decimal
import json
import re
import secrets
from typing import Any

__all__ = ["dumps", "is_exact_float", "loads"]

MAX_INT_CHARS = 4000
"""Longer integer literals are read as Decimal: ``int()`` refuses more than 4,300 digits."""

_Decimal = decimal.Decimal


def is_exact_float(text: str, value: float) -> bool:
    """Whether ``value`` (``float(text)``) is exactly the number ``text`` denotes."""
    shortest = float.__repr__(value)
    if shortest == text:
        return True
    if value != value or value in (float("inf"), float("-inf")):
        return False
    return _Decimal(shortest) == _Decimal(text)


def _number(text: str) -> float | decimal.Decimal:
    value = float(text)
    return value if is_exact_float(text, value) else _without_trailing_zeros(_Decimal(text))


def _without_trailing_zeros(number: decimal.Decimal) -> decimal.Decimal:
    """The same value without the zeros that end its digits (``1.2300`` -> ``1.23``,
    ``1.5E+3`` stays): exact, unlike ``Decimal.normalize``, which rounds to the context's
    28 digits."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # parsed from a JSON number: finite
    kept = len(digits)
    while kept > 1 and digits[kept - 1] == 0:
        kept -= 1
    if kept == len(digits):
        return number
    return _Decimal((sign, digits[:kept], exponent + len(digits) - kept))


def _integer(text: str) -> int | decimal.Decimal:
    return int(text) if len(text) <= MAX_INT_CHARS else _Decimal(text)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(data: str | bytes | bytearray) -> Any:
    """Parse JSON with exact numbers (see the module docstring).

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), not UTF-8
            (``UnicodeDecodeError``), or ``NaN``/``Infinity``.
        RecursionError: nested deeper than the interpreter's recursion limit allows.
    """
    # What json.loads does before it decodes, to the letter.
    if isinstance(data, str):
        if data.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
    else:
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    return _DECODER.decode(data)


# One decoder for every call: json.loads builds a new JSONDecoder (and its scanner) for
# each call given hooks, which was a tenth of decoding a small payload (issue 14).
_DECODER = json.JSONDecoder(
    parse_float=_number, parse_int=_integer, parse_constant=_refuse_constant
)


def dumps(
    value: Any,
    *,
    sort_keys: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] = (",", ":"),
) -> str:
    """JSON text (compact by default, non-ASCII kept) with exact numbers.

    Raises:
        TypeError: a value JSON has no form for (a set, an object, a non-string key
            other than int/float/bool/None).
        ValueError: NaN or an infinity (float or Decimal), or a circular reference.
    """
    numbers: list[str] = []
    nonce = ""

    def exact(item: object) -> Any:
        # json's C encoder writes floats as floats and knows no Decimal, so each Decimal
        # goes out as a placeholder string and is put back as a number below. The
        # placeholder holds a random nonce: no string of the document can be mistaken
        # for one.
        nonlocal nonce
        if not isinstance(item, _Decimal):
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
        if not item.is_finite():
            raise ValueError(f"{item} is not a JSON number")
        if not nonce:
            nonce = secrets.token_hex(16)
        written = str(item)  # str() of a finite Decimal is a JSON number: "1E+400"
        if "." not in written and "E" not in written:
            # An integral Decimal ("10000000000000001", read from "10000000000000001.0")
            # would be read back as an int: the fraction keeps it a Decimal.
            written += ".0"
        numbers.append(written)
        return f"{nonce}:{len(numbers) - 1}"

    text = json.dumps(
        value,
        separators=separators,
        indent=indent,
        ensure_ascii=False,
        allow_nan=False,
        sort_keys=sort_keys,
        default=exact,
    )
    if not numbers:
        return text
    placeholder = re.compile(f'"{nonce}:([0-9]+)"')
    return placeholder.sub(lambda found: numbers[int(found.group(1))], text)
