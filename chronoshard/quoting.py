"""Quoting a value taken from a request or a document in an error message, cut short.

Shared by the scheduler (``chronoshard.scheduler.errors`` re-exports :func:`shown`) and
by the rules of :mod:`chronoshard.json_documents`, which the worker SDK uses without
importing the scheduler. Pure.
"""

from __future__ import annotations

SHOWN_CHARS = 40
"""How much of a value an error message quotes (see :func:`shown`)."""


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """``value`` quoted for an error message, cut to ``limit`` characters.

    A message never echoes a request field whole: a 1 MiB id quoted in full made the
    error trailer overflow gRPC's header limit, and the client saw ``RESOURCE_EXHAUSTED:
    Stream removed`` instead of the refusal.
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"
