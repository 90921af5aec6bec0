"""Named crash points for fault-injection tests: the node dies exactly where told.

"Intent before action" (docs/architecture.md#d6) is only as good as the recovery from a crash at
each step between the intent and the worker's acknowledgement. A test build names one point in
``CHRONOSHARD_CRASH_AT`` and the node ``os._exit(137)``s the first time it gets there, leaving the
database exactly as a SIGKILL would (no shutdown path runs, no buffer is flushed):

* ``after_intent``: a dispatch round's intents are committed, nothing was sent;
* ``inside_batch``: half of a round's assignments (at least one) went out to workers,
  the rest were committed and never sent;
* ``after_send``: a worker received its assignment and answered it (its Ack, or the
  settlement of a run that ended before it was acked); the node dies before that answer
  is committed (the point is the answer's arrival at the gateway, the first moment the
  node knows a send reached the worker).

Production never crashes here: the variable is honoured only together with
``CHRONOSHARD_TESTING=1``, and is read once, at import.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import NoReturn

log = logging.getLogger(__name__)

CRASH_ENV = "CHRONOSHARD_CRASH_AT"
TESTING_ENV = "CHRONOSHARD_TESTING"
CRASH_EXIT_CODE = 137
"""What a shell reports for SIGKILL (128 + 9): the crash looks like a kill."""
FLUSH_TIMEOUT_S = 2.0
# What the gRPC stream needs to write a message it has taken from the outbox.
WRITE_GRACE_S = 0.1


class CrashPoint(StrEnum):
    AFTER_INTENT = "after_intent"
    INSIDE_BATCH = "inside_batch"
    AFTER_SEND = "after_send"


def armed_point(env: Mapping[str, str]) -> CrashPoint | None:
    """The crash point ``env`` arms, or None (also when not a test build).

    Raises:
        ValueError: a test build names a point that does not exist (a typo must not
            silently test nothing).
    """
    name = env.get(CRASH_ENV, "")
    if not name or env.get(TESTING_ENV) != "1":
        return None
    try:
        return CrashPoint(name)
    except ValueError:
        known = ", ".join(p.value for p in CrashPoint)
        raise ValueError(f"{CRASH_ENV}={name!r} is not a crash point ({known})") from None


_ARMED = armed_point(os.environ)


def armed(point: CrashPoint) -> bool:
    """Whether this process is to crash at ``point``."""
    return _ARMED is point


def crash(point: CrashPoint) -> NoReturn:
    """Die at once, as if SIGKILLed: no cleanup, no flush beyond this line of log."""
    log.critical("fault injection: crashing", extra={"crash_point": point.value})
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


def reached(point: CrashPoint) -> None:
    """Crash here if ``point`` is the armed one."""
    if _ARMED is point:
        crash(point)


async def crash_when(point: CrashPoint, flushed: Callable[[], bool]) -> None:
    """Crash at ``point`` once ``flushed()`` says the messages queued so far have gone out
    (bounded: after FLUSH_TIMEOUT_S it crashes anyway)."""
    deadline = time.monotonic() + FLUSH_TIMEOUT_S
    # Polling, not an event: the outboxes belong to the worker sessions, and this runs once, in
    # a test build, just before the process dies.
    while not flushed() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    await asyncio.sleep(WRITE_GRACE_S)
    crash(point)
