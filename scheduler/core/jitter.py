"""Deterministic start-time jitter, computed once at submit (docs/architecture.md#d6).

Thousands of tasks scheduled "at midnight" would otherwise all fire in the same tick. A
task that does not ask for strict timing is spread over a window (default 240 s) by a
hash of ``(tenant_id, task_id)``:

* ``SYMMETRIC``: ``due_at = scheduled_at + offset - window/2``, so the task runs up to half
  a window early or late;
* ``DELAY_ONLY``: ``due_at = scheduled_at + offset``, for jobs that must never run early;
* ``NONE``: ``due_at = scheduled_at`` (what ``strict_timing`` tasks use).

``offset = H mod window`` where ``H`` is BLAKE2b (``digest_size=8``) over the 16 bytes of
the tenant id followed by the 16 bytes of the task id, read as an unsigned big-endian
integer, and the window is counted in **whole milliseconds** (``window_s`` rounded to the
nearest ms). Millisecond resolution is finer than the wheel's ~10 ms tick and keeps the
arithmetic exact in integers; ``scheduled_at``'s own sub-millisecond part is kept. The
offset lies in ``0 .. window_ms - 1``; for symmetric mode ``window_ms // 2`` is
subtracted, so a 240 s window gives ``-120 000 .. +119 999`` ms.

A jittered ``due_at`` is never earlier than ``submitted_at``: jitter spreads load, it must
not make a task run before anyone asked for it. ``NONE`` returns the instant
``scheduled_at`` unchanged, even if it is already in the past. The result is the same on
every call, in every process, so the stored ``due_at`` can always be recomputed and
re-evaluation never moves a task. All arithmetic is done in UTC: adding a ``timedelta``
to a datetime in a zone with DST is wall-clock arithmetic, which is not elapsed time.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from chronoshard.scheduler.errors import InvalidArgument

DEFAULT_WINDOW_S = 240.0
MAX_WINDOW_S = 86_400.0
"""A day: wider than any sensible spread, and keeps ``timedelta`` far from overflow."""
JITTER_DIGEST_BYTES = 8


class JitterMode(StrEnum):
    """How a task's start is spread; ``strict_timing`` tasks use ``NONE``."""

    SYMMETRIC = "SYMMETRIC"
    DELAY_ONLY = "DELAY_ONLY"
    NONE = "NONE"


def jitter_offset_ms(tenant_id: uuid.UUID, task_id: uuid.UUID, window_ms: int) -> int:
    """The hash offset in ``0 .. window_ms - 1`` (0 for an empty window)."""
    if window_ms <= 0:
        return 0
    digest = hashlib.blake2b(
        tenant_id.bytes + task_id.bytes, digest_size=JITTER_DIGEST_BYTES
    ).digest()
    return int.from_bytes(digest, "big") % window_ms


def _require_aware(field: str, value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, "must be timezone-aware")


def jittered_due(
    scheduled_at: datetime,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    mode: JitterMode,
    submitted_at: datetime,
) -> datetime:
    """The ``due_at`` to store for a task, in UTC.

    Raises:
        InvalidArgument: a datetime is naive, ``mode`` is unknown, or ``window_s`` is
            negative, not finite or over MAX_WINDOW_S.
    """
    _require_aware("scheduled_at", scheduled_at)
    _require_aware("submitted_at", submitted_at)
    if not math.isfinite(window_s) or not 0.0 <= window_s <= MAX_WINDOW_S:
        raise InvalidArgument(
            "jitter_window_s", f"must be between 0 and {MAX_WINDOW_S:g} s, got {window_s!r}"
        )
    try:
        # A plain string from config or the API must not silently fall through to a
        # default branch below.
        mode = JitterMode(mode)
    except ValueError:
        raise InvalidArgument("jitter_mode", f"unknown mode {mode!r}") from None
    scheduled_utc = scheduled_at.astimezone(UTC)
    if mode is JitterMode.NONE:
        return scheduled_utc

    window_ms = round(window_s * 1000)
    offset_ms = jitter_offset_ms(tenant_id, task_id, window_ms)
    if mode is JitterMode.SYMMETRIC:
        offset_ms -= window_ms // 2
    due = scheduled_utc + timedelta(milliseconds=offset_ms)
    return max(due, submitted_at.astimezone(UTC))
