"""Worker self-fencing: each run's lease as the worker sees it, never later than the node's.

A node gives an attempt up (runs it again, or declares its outcome unknown) only
``lease_margin`` after its ``lease_expires_at`` (docs/architecture.md#d5, docs/worker-protocol.md).
So that nothing of the attempt runs by then, the worker stops it on its own ``lease_margin``
*before* its lease runs out, as far as it can tell without hearing from any node: a
worker cut off from every node (a partition), or paused past its lease (SIGSTOP, a VM
freeze), fences itself instead of writing on after another worker took over.

:class:`RunLease` holds one run's deadline on the worker's monotonic clock, kept at or
before the node's lease:

- at the assignment, the earlier of *received + lease duration* (the node wrote the
  lease when it committed the intent, before the assignment left) and *received + what
  was left of the lease when the node sent it*: ``lease_expires_at`` read against the
  node's clock at the send when the assignment carries it (``sent_at``), else against
  the worker's wall clock (which bounds it when that clock is not behind the node's);
- extended by a heartbeat reply that did not revoke the run, to *the moment that
  heartbeat was sent* + lease duration: the node extends from when it committed the
  heartbeat, which is later.

Once ``deadline - margin`` passed, the lease is *lapsed*, for good: a reply that comes
late does not revive it, because a handler (or a thread the SDK cannot stop) may already
have been refused a write. The SDK also *fences* a lease when it gives an attempt up for
any reason (revoked, timed out, released, settled): from then on nothing of that attempt
may write. Both are read straight from the clock, so a thread checks them correctly even
before the event loop noticed (the first thing a resumed process runs may be a thread).

Everything here is pure: time comes from the injected ``monotonic`` function.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime


def initial_deadline(
    *,
    received_at: float,
    lease_s: float | None,
    lease_expires_at: datetime | None,
    wall_now: datetime,
    sent_at: datetime | None = None,
) -> float | None:
    """A new run's deadline on the monotonic clock (None: no lease known, never lapses).

    ``received_at`` is the monotonic time the assignment arrived, ``lease_s`` the node's
    lease duration (Welcome), ``lease_expires_at`` the lease the intent wrote. What was
    left of it is read against ``sent_at``, the node's own clock when it sent the
    assignment (the lease's clock: exact, up to the transit), or without one against
    ``wall_now``, the worker's wall clock at ``received_at``.
    """
    candidates = []
    if lease_s is not None and lease_s > 0:
        candidates.append(received_at + lease_s)
    if lease_expires_at is not None:
        reference = sent_at if sent_at is not None else wall_now
        candidates.append(received_at + (lease_expires_at - reference).total_seconds())
    return min(candidates) if candidates else None


class RunLease:
    """One run's lease on the worker: when it lapses, and whether the SDK fenced it."""

    def __init__(
        self,
        *,
        deadline: float | None,
        margin_s: float,
        monotonic: Callable[[], float],
    ) -> None:
        self._deadline = deadline
        self._margin_s = margin_s
        self.monotonic = monotonic
        self._fenced: str | None = None
        self._lapsed = False

    @classmethod
    def unbounded(cls, monotonic: Callable[[], float]) -> RunLease:
        """A lease that never lapses on its own (no lease known: tests, an old node)."""
        return cls(deadline=None, margin_s=0.0, monotonic=monotonic)

    @property
    def deadline(self) -> float | None:
        """The lease's end as the worker last renewed it (monotonic), or None."""
        return self._deadline

    @property
    def fence_at(self) -> float | None:
        """When the lease lapses: ``deadline - margin`` (monotonic), or None."""
        return None if self._deadline is None else self._deadline - self._margin_s

    @property
    def fenced(self) -> str | None:
        """Why the SDK fenced the lease (it gave the attempt up), or None."""
        return self._fenced

    def lapsed(self) -> bool:
        """True once ``deadline - margin`` passed without a renewal (sticky)."""
        if not self._lapsed:
            fence_at = self.fence_at
            self._lapsed = fence_at is not None and self.monotonic() >= fence_at
        return self._lapsed

    def held(self) -> bool:
        """Neither lapsed nor fenced: the attempt may still write."""
        return self._fenced is None and not self.lapsed()

    def remaining_s(self) -> float | None:
        """Seconds until the lease lapses (0 once lapsed or fenced); None: no lease."""
        fence_at = self.fence_at
        if not self.held():
            return 0.0
        if fence_at is None:
            return None
        return max(0.0, fence_at - self.monotonic())

    def extend(self, sent_at: float, lease_s: float) -> bool:
        """A heartbeat sent at ``sent_at`` was answered without revoking this run: the
        node holds the lease until at least ``sent_at + lease_s``. False (and nothing
        changes) once the lease lapsed or was fenced: a lapsed lease stays lapsed."""
        if self._deadline is None or not self.held():
            return False
        self._deadline = max(self._deadline, sent_at + lease_s)
        return True

    def fence(self, reason: str) -> None:
        """The SDK gave the attempt up: nothing of it may write any more (first reason
        kept)."""
        if self._fenced is None:
            self._fenced = reason
