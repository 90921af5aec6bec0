"""What the scheduler accepts as a JSON document (payloads, results) and the text it stores.

Payloads (``payload_json`` at submit) and results (``result_json`` from workers) are
stored as ``jsonb``. The rules here make every accepted document round-trip exactly and
every refused one fail early, with ``INVALID_ARGUMENT`` naming the request field (and,
in the message, where in the document), never later as a driver error:

- **Exact numbers.** Documents are parsed by :mod:`chronoshard.exact_json`: no number
  goes through a float unless the float is that number, so ``-0.46211904005971607552``
  and ``1e400`` are stored as sent. A number may have at most :data:`MAX_NUMBER_DIGITS`
  digits *written out in full*, because that is how PostgreSQL keeps and prints
  ``numeric`` (``1e400`` is stored as a 1 followed by 400 zeros): every double fits
  (the longest, ``5e-324``, has 325), ``1e1001`` does not.
- **Bounded nesting**: at most :data:`MAX_DEPTH` levels of arrays and objects, checked
  here rather than left to the parser's "maximum recursion depth exceeded".
- **Storable strings**: no NUL (``\\u0000``; PostgreSQL text cannot hold it) and no lone
  surrogate (``\\ud800``; not Unicode), in values or keys.
- **Size as stored**: the limit bounds the canonical text (compact, sorted keys) with
  its numbers written out in full, so a small document of huge exponents cannot grow
  past it once stored.

Pure: :func:`parse` reads what a request carries, :func:`canonical` checks a value and
gives the text to store (and to fingerprint).
"""

from __future__ import annotations

import decimal
import json
import re
from typing import Any

from chronoshard import exact_json
from chronoshard.scheduler.errors import InvalidArgument, PayloadTooLarge, shown

MAX_DEPTH = 100
"""Levels of nested arrays/objects a document may have (the outermost is level 1)."""
MAX_NUMBER_DIGITS = 1000
"""Digits a number may have written out in full (``1e999`` has 1000)."""
MAX_PATH_CHARS = 80
"""How much of a document path (``$.a[3].b``) an error message shows."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")
_EXPONENT_DIGITS_BITS = 3300
"""An int with fewer bits has fewer than 1000 digits: no need to print it to count."""

# A path is a linked list (parent, key): built per item only as a pointer, spelled out
# only for an error.
_Path = tuple[Any, str | int] | None


def parse(data: bytes, field: str, limit_bytes: int, *, object_only: bool) -> Any:
    """The JSON document in ``data``, numbers exact. Checked only as far as parsing goes:
    :func:`canonical` checks the value.

    Raises:
        PayloadTooLarge: ``data`` is over ``limit_bytes`` (checked before parsing).
        InvalidArgument: not UTF-8, not JSON, nested too deep, or (``object_only``) not
            a JSON object.
    """
    if len(data) > limit_bytes:
        raise PayloadTooLarge(field, len(data), limit_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(field, "is not UTF-8") from None
    try:
        value = exact_json.loads(text)
    except RecursionError:
        raise InvalidArgument(field, _too_deep(None)) from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(field, f"is not valid JSON: {exc}") from None
    except ValueError as exc:  # NaN, Infinity
        raise InvalidArgument(field, f"is not valid JSON: {exc}") from None
    if object_only and not isinstance(value, dict):
        raise InvalidArgument(field, "must be a JSON object")
    return value


def canonical(value: Any, field: str, limit_bytes: int) -> str:
    """The text to store for ``value``: compact JSON, keys sorted, numbers exact.

    Raises:
        InvalidArgument: a rule of the module docstring is broken (the message says
            where, as a path like ``$.items[3].price``), or ``value`` holds something
            JSON has no form for.
        PayloadTooLarge: the text, with numbers written out in full, is over
            ``limit_bytes``.
    """
    growth = _inspect(value, field)
    try:
        text = exact_json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(field, f"is not JSON-serialisable: {exc}") from None
    size = len(text.encode("utf-8")) + growth
    if size > limit_bytes:
        raise PayloadTooLarge(field, size, limit_bytes)
    return text


def stored_form(data: bytes, field: str, limit_bytes: int) -> str | None:
    """A worker's ``result_json``: any JSON value (empty means null), as :func:`canonical`
    text; None for null."""
    if not data:
        return None
    value = parse(data, field, limit_bytes, object_only=False)
    return None if value is None else canonical(value, field, limit_bytes)


def _inspect(root: Any, field: str) -> int:
    """Check every item of ``root``; how many bytes its numbers gain written out in full."""
    growth = 0
    stack: list[tuple[Any, int, _Path]] = [(root, 1, None)]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _check_string(value, field, path, "string")
        elif isinstance(value, dict):
            if depth > MAX_DEPTH:
                raise InvalidArgument(field, _too_deep(path))
            for key, item in value.items():
                if isinstance(key, str):
                    _check_string(key, field, path, "key")
                stack.append((item, depth + 1, (path, key)))
        elif isinstance(value, list | tuple):
            if depth > MAX_DEPTH:
                raise InvalidArgument(field, _too_deep(path))
            stack.extend((item, depth + 1, (path, i)) for i, item in enumerate(value))
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            if value.bit_length() > _EXPONENT_DIGITS_BITS and len(str(abs(value))) > (
                MAX_NUMBER_DIGITS
            ):
                raise InvalidArgument(field, _too_many_digits(path, str(value)))
        elif isinstance(value, float):
            text = float.__repr__(value)
            if "e" in text:  # only then does the stored form differ from the text
                growth += _written_out(decimal.Decimal(text), field, path, text) - len(text)
        elif isinstance(value, decimal.Decimal):
            if not value.is_finite():
                raise InvalidArgument(field, f"at {_spelled(path)}: {value} is not a JSON number")
            text = str(value)
            growth += _written_out(value, field, path, text) - len(text)
    return growth


def _written_out(number: decimal.Decimal, field: str, path: _Path, text: str) -> int:
    """The length of ``number`` as PostgreSQL prints it (no exponent); refuses one with
    more than :data:`MAX_NUMBER_DIGITS` digits."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite
    if not any(digits):
        written = 1 + max(0, -exponent)
    elif exponent >= 0:
        written = len(digits) + exponent
    else:
        written = max(len(digits) + exponent, 1) - exponent
    if written > MAX_NUMBER_DIGITS:
        raise InvalidArgument(field, _too_many_digits(path, text))
    # Sign, and the point of a fraction.
    return written + sign + (1 if exponent < 0 else 0)


def _check_string(value: str, field: str, path: _Path, what: str) -> None:
    found = _UNSTORABLE.search(value)
    if found is None:
        return
    if found.group() == "\x00":
        problem = "contains a NUL character (\\u0000), which PostgreSQL cannot store"
    else:
        problem = f"contains a lone surrogate (\\u{ord(found.group()):04x}), which is not Unicode"
    raise InvalidArgument(field, f"a {what} at {_spelled(path)} {problem}")


def _too_deep(path: _Path) -> str:
    where = "" if path is None else f" (at {_spelled(path)})"
    return f"is nested deeper than {MAX_DEPTH} levels of arrays and objects{where}"


def _too_many_digits(path: _Path, text: str) -> str:
    return (
        f"the number at {_spelled(path)} ({shown(text, 20)}) has more than "
        f"{MAX_NUMBER_DIGITS} digits written out in full, as PostgreSQL stores it"
    )


def _spelled(path: _Path) -> str:
    """``$.items[3].price``-style, at most :data:`MAX_PATH_CHARS` characters."""
    steps: list[str] = []
    while path is not None:
        path, key = path
        if isinstance(key, int):
            steps.append(f"[{key}]")
        elif _NAME.match(key):
            steps.append(f".{key}")
        else:
            steps.append(f"[{shown(key, 20)}]")
    text = "$" + "".join(reversed(steps))
    if len(text) > MAX_PATH_CHARS:
        return text[: MAX_PATH_CHARS - 3] + "..."
    return text
