"""What the scheduler accepts as a JSON document (payloads, results) and the text it stores.

The rules themselves (exact numbers of at most 1000 digits written out, at most 100
levels of nesting, no NUL or lone surrogate, a size counted as stored) are
:mod:`chronoshard.json_documents`, shared with the worker SDK, which checks a handler's
result by them before sending it. This module is the scheduler's side of them: a
refusal becomes ``INVALID_ARGUMENT`` naming the request field (``payload``,
``complete.result_json``), with the place in the document in the message, or
``PAYLOAD_TOO_LARGE`` over ``limits.payload_limit_bytes``; never a driver error later.

Pure: :func:`parse` reads what a request carries, :func:`canonical` checks a value and
gives the text to store (and to fingerprint).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from chronoshard import json_documents
from chronoshard.json_documents import MAX_DEPTH as MAX_DEPTH
from chronoshard.json_documents import MAX_NUMBER_DIGITS as MAX_NUMBER_DIGITS
from chronoshard.json_documents import DocumentRefused, DocumentTooLarge
from chronoshard.scheduler.errors import InvalidArgument, PayloadTooLarge

_T = TypeVar("_T")


def _refusals_of(field: str, step: Callable[[], _T]) -> _T:
    """``step()``, its refusal turned into the scheduler's error naming ``field``."""
    try:
        return step()
    except DocumentTooLarge as exc:
        raise PayloadTooLarge(field, exc.size_bytes, exc.limit_bytes) from None
    except DocumentRefused as exc:
        raise InvalidArgument(field, exc.problem) from None


def parse(data: bytes, field: str, limit_bytes: int, *, object_only: bool) -> Any:
    """The JSON document in ``data``, numbers exact (:func:`.json_documents.parse`).

    Raises:
        PayloadTooLarge: ``data`` is over ``limit_bytes`` (checked before parsing).
        InvalidArgument: not UTF-8, not JSON, nested too deep, or (``object_only``) not
            a JSON object.
    """
    return _refusals_of(
        field, lambda: json_documents.parse(data, limit_bytes, object_only=object_only)
    )


def canonical(value: Any, field: str, limit_bytes: int) -> str:
    """The text to store for ``value`` (:func:`.json_documents.canonical`).

    Raises:
        InvalidArgument: a rule is broken (the message says where, as a path like
            ``$.items[3].price``), or ``value`` holds something JSON has no form for.
        PayloadTooLarge: the text, with numbers written out in full, is over
            ``limit_bytes``.
    """
    return _refusals_of(field, lambda: json_documents.canonical(value, limit_bytes))


def stored_form(data: bytes, field: str, limit_bytes: int) -> str | None:
    """A worker's ``result_json``: any JSON value (empty means null), as :func:`canonical`
    text; None for null."""
    return _refusals_of(field, lambda: json_documents.stored_form(data, limit_bytes))
