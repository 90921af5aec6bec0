"""Whether this host's wall clock looks off, as an assignment shows it: pure, time passed in.

A run starts by the node's cluster clock (``_runs.py`` anchors it), so a wrong wall clock
here does not make tasks early or late; but handlers that read the time see this clock,
so a far-off one is worth a warning. An assignment from a node that sends its clock
(``sent_at``) shows the offset directly; from an older node only a task due much further
ahead than lead dispatch (~100 ms) hints that this clock is behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

SKEW_WARNING_S = 5.0
"""A wall clock this far from the assigning node's cluster clock (or, from an older node,
an assignment due further ahead than this by it) is logged as skew."""
SKEW_LOG_INTERVAL_S = 60.0
"""At most one skew warning per this long: every assignment would show it."""


@dataclass(frozen=True, slots=True)
class SkewWarning:
    """A log line: its ``%``-template and arguments."""

    template: str
    args: tuple[object, ...]


def skew_warning(sent_at: datetime | None, due_at: datetime, now: datetime) -> SkewWarning | None:
    """What an assignment sent at ``sent_at`` (the node's clock; None from an older node)
    and due at ``due_at`` says of this host's wall clock, read as ``now`` on receipt;
    None when it looks right."""
    if sent_at is not None:
        # Transit time counts in, but it is far below the warning's threshold.
        ahead_s = (now - sent_at).total_seconds()
        if abs(ahead_s) <= SKEW_WARNING_S:
            return None
        return SkewWarning(
            "this host's clock is %.1f s %s the scheduler's cluster clock; tasks"
            " start by the cluster clock, but handlers reading the time see this one",
            (abs(ahead_s), "ahead of" if ahead_s > 0 else "behind"),
        )
    lead_s = (due_at - now).total_seconds()
    if lead_s <= SKEW_WARNING_S:
        return None
    # Lead dispatch is ~100 ms: a task due much later means this host's clock is behind
    # the scheduler's, and every task here will start that much late.
    return SkewWarning(
        "assignment due %.1f s from now by this clock: is the clock behind?", (lead_s,)
    )


class WarningThrottle:
    """Says a warning is due at most once per ``interval_s`` (monotonic seconds)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: float | None = None

    def due(self, now: float) -> bool:
        """Whether to log at ``now``; a yes counts as logged."""
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True
