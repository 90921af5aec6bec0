"""The rules a JSON document (payload, result, checkpoint) must follow to be stored.

Payloads (``payload_json`` at submit) and results (``result_json`` from workers) are
stored as ``jsonb``. The rules here make every accepted document round-trip exactly and
every refused one fail early, with a message that says which rule and where in the
document, never later as a driver error:

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

This is the one implementation of the rules. The scheduler (``chronoshard.scheduler.api.payloads``)
maps a refusal to ``INVALID_ARGUMENT`` naming the request field; the worker SDK checks a
handler's result and checkpoints with :func:`check` before sending them, so a document the
node would refuse is settled as a failure the handler can be told about. The size limit
is the node's (``limits.payload_limit_bytes``), which a worker does not know: every
function takes it as an argument, ``None`` meaning "not checked here".

Pure and I/O free: :func:`parse` reads bytes, :func:`check` checks a value, and
:func:`canonical` checks a value and gives the text to store (and to fingerprint).
"""

from __future__ import annotations

import decimal
import enum
import math
import re
from typing import Any

from chronoshard import exact_json
from chronoshard.quoting import shown

__all__ = [
    "MAX_DEPTH",
    "MAX_NUMBER_DIGITS",
    "DocumentRefused",
    "DocumentTooLarge",
    "Rule",
    "canonical",
    "check",
    "parse",
    "stored_form",
]

MAX_DEPTH = 100
"""Levels of nested arrays/objects a document may have (the outermost is level 1)."""
MAX_NUMBER_DIGITS = 1000
"""Digits a number may have written out in full (``1e999`` has 1000)."""
MAX_PATH_CHARS = 80
"""How much of a document path (``$.a[3].b``) a message shows."""
SHOWN_CHARS = 20
"""How much of a key or a number a message quotes."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")
_EXPONENT_DIGITS_BITS = 3300
"""An int with fewer bits has fewer than 1000 digits: no need to print it to count."""
_PRINTABLE_INT_BITS = 4000 * 3
"""An int with fewer bits prints within Python's 4,300-digit ``str()`` limit."""

# A path is a linked list (parent, key): built per item only as a pointer, spelled out
# only for an error.
_Path = tuple[Any, str | int] | None


class Rule(enum.StrEnum):
    """Which rule a refused document broke."""

    SYNTAX = "syntax"  # not UTF-8, not JSON, NaN/Infinity
    TYPE = "type"  # not an object where one is required, or a value JSON has no form for
    DEPTH = "depth"  # nested deeper than MAX_DEPTH
    STRING = "string"  # a NUL or a lone surrogate in a string or key
    NUMBER = "number"  # more than MAX_NUMBER_DIGITS digits written out in full
    SIZE = "size"  # over the size limit as stored


class DocumentRefused(ValueError):
    """A document breaks a rule. ``rule`` says which; ``problem`` (also ``str()``) says
    what and where, as a predicate of the document ("is nested deeper than...", "a
    string at $.a contains..."), bounded: it quotes no more than a few characters of
    the document."""

    def __init__(self, rule: Rule, problem: str) -> None:
        super().__init__(problem)
        self.rule = rule
        self.problem = problem


class DocumentTooLarge(DocumentRefused):
    """A document is over the size limit (as sent, or as stored)."""

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(Rule.SIZE, f"{size_bytes} bytes is over the limit of {limit_bytes} bytes")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


def parse(data: bytes, limit_bytes: int | None, *, object_only: bool) -> Any:
    """The JSON document in ``data``, numbers exact. Checked only as far as parsing goes:
    :func:`check` (or :func:`canonical`) checks the value.

    Raises:
        DocumentTooLarge: ``data`` is over ``limit_bytes`` (checked before parsing).
        DocumentRefused: not UTF-8, not JSON, nested too deep, or (``object_only``) not
            a JSON object.
    """
    if limit_bytes is not None and len(data) > limit_bytes:
        raise DocumentTooLarge(len(data), limit_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DocumentRefused(Rule.SYNTAX, "is not UTF-8") from None
    try:
        value = exact_json.loads(text)
    except RecursionError:
        raise DocumentRefused(Rule.DEPTH, _too_deep(None)) from None
    except ValueError as exc:  # json.JSONDecodeError; NaN, Infinity
        raise DocumentRefused(Rule.SYNTAX, f"is not valid JSON: {exc}") from None
    if object_only and not isinstance(value, dict):
        raise DocumentRefused(Rule.TYPE, "must be a JSON object")
    return value


def check(value: Any) -> int:
    """Check every item of ``value`` against the rules but the size limit; how many bytes
    its numbers gain written out in full (what :func:`canonical` adds to the text's size).

    Values JSON has no form for (a set, an object) are left to the encoder: this only
    refuses what would encode but not be stored. Iterative, so a document of any depth
    (even a circular one) is refused for its depth rather than crashing the checker.

    Raises:
        DocumentRefused: a rule of the module docstring is broken (the message says
            where, as a path like ``$.items[3].price``).
    """
    growth = 0
    stack: list[tuple[Any, int, _Path]] = [(value, 1, None)]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            _check_string(item, path, "string")
        elif isinstance(item, dict):
            if depth > MAX_DEPTH:
                raise DocumentRefused(Rule.DEPTH, _too_deep(path))
            for key, child in item.items():
                if isinstance(key, str):
                    _check_string(key, path, "key")
                stack.append((child, depth + 1, (path, key)))
        elif isinstance(item, list | tuple):
            if depth > MAX_DEPTH:
                raise DocumentRefused(Rule.DEPTH, _too_deep(path))
            stack.extend((child, depth + 1, (path, i)) for i, child in enumerate(item))
        elif isinstance(item, bool) or item is None:
            pass
        elif isinstance(item, int):
            _check_int(item, path)
        elif isinstance(item, float):
            text = float.__repr__(item)
            if "e" in text:  # only then does the stored form differ from the text
                growth += _written_out(decimal.Decimal(text), path, text) - len(text)
        elif isinstance(item, decimal.Decimal):
            if not item.is_finite():
                raise DocumentRefused(
                    Rule.SYNTAX, f"at {_spelled(path)}: {item} is not a JSON number"
                )
            text = str(item)
            growth += _written_out(item, path, text) - len(text)
    return growth


def canonical(value: Any, limit_bytes: int | None) -> str:
    """The text to store for ``value``: compact JSON, keys sorted, numbers exact.

    Raises:
        DocumentRefused: a rule is broken (see :func:`check`), or ``value`` holds
            something JSON has no form for.
        DocumentTooLarge: the text, with numbers written out in full, is over
            ``limit_bytes``.
    """
    growth = check(value)
    try:
        text = exact_json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise DocumentRefused(Rule.TYPE, f"is not JSON-serialisable: {exc}") from None
    if limit_bytes is not None:
        size = len(text.encode("utf-8")) + growth
        if size > limit_bytes:
            raise DocumentTooLarge(size, limit_bytes)
    return text


def stored_form(data: bytes, limit_bytes: int | None) -> str | None:
    """A worker's ``result_json``: any JSON value (empty means null), as :func:`canonical`
    text; None for null."""
    if not data:
        return None
    value = parse(data, limit_bytes, object_only=False)
    return None if value is None else canonical(value, limit_bytes)


def _check_int(value: int, path: _Path) -> None:
    bits = value.bit_length()
    if bits <= _EXPONENT_DIGITS_BITS:
        return
    if bits < _PRINTABLE_INT_BITS:
        text = str(value)
        if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
            raise DocumentRefused(Rule.NUMBER, _too_many_digits(path, shown(text, SHOWN_CHARS)))
        return
    # Only a Python value can be this long (the parser reads long literals as Decimal),
    # and str() would refuse it: say how long instead of quoting it.
    digits = math.floor((bits - 1) * math.log10(2)) + 1
    described = f"an integer of at least {digits} digits"
    raise DocumentRefused(Rule.NUMBER, _too_many_digits(path, described))


def _written_out(number: decimal.Decimal, path: _Path, text: str) -> int:
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
        raise DocumentRefused(Rule.NUMBER, _too_many_digits(path, shown(text, SHOWN_CHARS)))
    # Sign, and the point of a fraction.
    return written + sign + (1 if exponent < 0 else 0)


def _check_string(value: str, path: _Path, what: str) -> None:
    found = _UNSTORABLE.search(value)
    if found is None:
        return
    if found.group() == "\x00":
        problem = "contains a NUL character (\\u0000), which PostgreSQL cannot store"
    else:
        problem = f"contains a lone surrogate (\\u{ord(found.group()):04x}), which is not Unicode"
    raise DocumentRefused(Rule.STRING, f"a {what} at {_spelled(path)} {problem}")


def _too_deep(path: _Path) -> str:
    where = "" if path is None else f" (at {_spelled(path)})"
    return f"is nested deeper than {MAX_DEPTH} levels of arrays and objects{where}"


def _too_many_digits(path: _Path, shown_number: str) -> str:
    return (
        f"the number at {_spelled(path)} ({shown_number}) has more than "
        f"{MAX_NUMBER_DIGITS} digits written out in full, as PostgreSQL stores it"
    )


def _spelled(path: _Path) -> str:
    """``$.items[3].price``-style, at most :data:`MAX_PATH_CHARS` characters."""
    steps: list[str] = []
    while path is not None:
        path, key = path
        if isinstance(key, int):
            steps.append(f"[{key}]")
        elif isinstance(key, str) and _NAME.match(key):
            steps.append(f".{key}")
        else:
            steps.append(f"[{shown(str(key), SHOWN_CHARS)}]")
    text = "$" + "".join(reversed(steps))
    if len(text) > MAX_PATH_CHARS:
        return text[: MAX_PATH_CHARS - 3] + "..."
    return text
