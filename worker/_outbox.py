"""The settlement outbox: every Ack, Complete, Fail and Release is kept until confirmed.

A settlement is confirmed by a stream ``Receipt`` or by a successful unary call; until
then it sits here in one of four states:

- ``STREAM``: written (or queued) on the stream of the node in ``node``, waiting for its
  Receipt. If that stream breaks (:meth:`stream_lost`) or no Receipt comes within
  ``receipt_timeout_s`` the entry moves to ``UNARY``: settling is idempotent, so sending
  a settlement twice is safe, losing one is not.
- ``UNARY``: waiting for ``next_try_at`` to be sent through the unary RPC on any node.
- ``IN_FLIGHT``: a unary call is running; :meth:`unary_failed` schedules the next try
  with the backoff the caller computed, :meth:`confirm` ends it.
- ``PARKED``: an Ack whose stream broke. There is no unary Ack (a Complete from
  DISPATCHED is accepted anyway), so it waits for its node's next session, where it is
  sent again (:meth:`parked_for`).

The attempt's final settlement (Complete, Fail, Release) drops its Ack, whatever the Ack's
route: the final one is accepted from DISPATCHED as well, so the Ack is moot. (An Ack kept
waiting for the Receipt of a node that went away outlived its task, and a shutdown then
reported it unconfirmed although the task was COMPLETED.)

Pure: time is passed in (monotonic seconds), the async shell does the sending.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chronoshard.worker._models import Ack, Settlement, SettlementKey

DEFAULT_RECEIPT_TIMEOUT_S = 10.0
"""A Receipt this late on a live stream: assume it lost and resend through the unary RPC.

A node answers every settlement, with an error Receipt when it could not commit it
(PostgreSQL away: at most ``database.acquire_timeout_s``, 5 s, after it arrived), so a
Receipt this late was lost (a stream that broke without saying so) and the resend is
what gets the settlement through. Resending early is harmless: settling is idempotent."""


class Route(enum.Enum):
    STREAM = "stream"
    UNARY = "unary"
    IN_FLIGHT = "in_flight"
    PARKED = "parked"


@dataclass
class OutboxEntry:
    settlement: Settlement
    route: Route
    node: str | None
    # STREAM: when the receipt is overdue; UNARY: when to try next.
    deadline: float
    unary_attempts: int = 0

    @property
    def key(self) -> SettlementKey:
        return self.settlement.key


class Outbox:
    def __init__(self, *, receipt_timeout_s: float = DEFAULT_RECEIPT_TIMEOUT_S) -> None:
        self._receipt_timeout_s = receipt_timeout_s
        self._entries: dict[SettlementKey, OutboxEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: SettlementKey) -> bool:
        return key in self._entries

    def get(self, key: SettlementKey) -> OutboxEntry | None:
        return self._entries.get(key)

    def entries(self) -> list[OutboxEntry]:
        return list(self._entries.values())

    # ---- adding ----------------------------------------------------------------------

    def add_stream(self, settlement: Settlement, node: str, now: float) -> None:
        """``settlement`` was queued on ``node``'s stream; its Receipt is awaited."""
        self._drop_ack(settlement)
        self._entries[settlement.key] = OutboxEntry(
            settlement, Route.STREAM, node, now + self._receipt_timeout_s
        )

    def add_unary(self, settlement: Settlement, now: float) -> None:
        """No usable stream: send ``settlement`` through the unary RPC, starting now."""
        if isinstance(settlement, Ack):
            raise ValueError("an Ack has no unary RPC")
        self._drop_ack(settlement)
        self._entries[settlement.key] = OutboxEntry(settlement, Route.UNARY, None, now)

    def _drop_ack(self, settlement: Settlement) -> None:
        # The task's final settlement makes its unconfirmed Ack moot, in any route: a
        # Complete, Fail or Release is accepted from DISPATCHED as well as from RUNNING.
        if not isinstance(settlement, Ack):
            self._entries.pop(Ack(settlement.task, settlement.fencing_token).key, None)

    # ---- confirming ------------------------------------------------------------------

    def confirm(self, key: SettlementKey) -> OutboxEntry | None:
        """A Receipt or a unary answer settled ``key`` (committed or refused): forget it.

        Returns the entry, or None when it was not (or no longer) pending.
        """
        return self._entries.pop(key, None)

    def discard_task(self, task_id: str, fencing_token: int) -> int:
        """Forget every entry of one attempt (it was revoked); returns how many."""
        keys = [k for k in self._entries if k[0] == task_id and k[1] == fencing_token]
        for key in keys:
            del self._entries[key]
        return len(keys)

    # ---- streams coming and going ----------------------------------------------------

    def stream_lost(self, node: str, now: float) -> int:
        """``node``'s stream ended: its unconfirmed settlements go unary (Acks park).

        Returns how many entries moved to the unary route.
        """
        moved = 0
        for entry in self._entries.values():
            if entry.route is Route.STREAM and entry.node == node:
                if isinstance(entry.settlement, Ack):
                    entry.route = Route.PARKED
                else:
                    entry.route, entry.node, entry.deadline = Route.UNARY, None, now
                    moved += 1
        return moved

    def parked_for(self, node: str) -> list[Ack]:
        """Acks that wait for ``node``'s stream to come back."""
        return [
            e.settlement
            for e in self._entries.values()
            if e.route is Route.PARKED and e.node == node and isinstance(e.settlement, Ack)
        ]

    # ---- unary resends ---------------------------------------------------------------

    def due_unary(self, now: float) -> list[OutboxEntry]:
        """Entries to send through the unary RPC now; they are marked in flight.

        A stream entry whose Receipt is overdue counts as lost: a final settlement goes
        unary, an overdue Ack is dropped (heartbeats keep the lease, the final settlement
        is accepted from DISPATCHED).
        """
        due: list[OutboxEntry] = []
        for key, entry in list(self._entries.items()):
            if entry.route is Route.STREAM and entry.deadline <= now:
                if isinstance(entry.settlement, Ack):
                    del self._entries[key]
                    continue
                entry.route, entry.node = Route.UNARY, None
            if entry.route is Route.UNARY and entry.deadline <= now:
                entry.route = Route.IN_FLIGHT
                entry.unary_attempts += 1
                due.append(entry)
        return due

    def unary_failed(self, key: SettlementKey, now: float, delay_s: float) -> None:
        """A unary try failed in a way worth retrying: try again after ``delay_s``."""
        entry = self._entries.get(key)
        if entry is not None and entry.route is Route.IN_FLIGHT:
            entry.route, entry.deadline = Route.UNARY, now + delay_s

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`due_unary` has something to return, if any."""
        deadlines = [
            e.deadline for e in self._entries.values() if e.route in (Route.STREAM, Route.UNARY)
        ]
        return min(deadlines) if deadlines else None

    def stats(self) -> dict[str, int]:
        counts = {route.value: 0 for route in Route}
        for entry in self._entries.values():
            counts[entry.route.value] += 1
        return counts
