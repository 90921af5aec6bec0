"""Waiting for an :class:`asyncio.Event` with a timeout, safely under cancellation.

Every long-running loop of the scheduler and the worker sleeps this way: until woken or
until its next deadline. Not ``asyncio.wait_for``: on Python 3.11 it can swallow a
cancellation that arrives as the inner wait completes, leaving a loop that was told to
stop running forever (seen: a scheduler's dispatcher loop outliving its node's stop).
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait for ``event`` at most ``timeout_s`` (None: no limit); True if it was set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
