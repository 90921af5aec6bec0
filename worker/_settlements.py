"""Getting every settlement confirmed: the async shell around the :class:`Outbox`.

A settlement (Ack, Complete, Fail, Release) goes on the stream of the node that assigned
the task while that stream is usable, and waits there for its Receipt. Without a usable
stream (broken, or the node sent ``Drain``) a final settlement goes through the unary
``Complete``/``Fail``/``Release`` RPC on any node, and so does one whose stream broke
before its Receipt came: settling is idempotent, so a duplicate is harmless and a loss
is not. Unary tries rotate over the known addresses with the reconnect backoff until a
node answers.

Answers are sorted in one place (:meth:`Settlements.on_receipt`, :meth:`_resend`):
committed -> forget it; ``STALE_FENCING_TOKEN`` -> another attempt owns the task: drop
it and report a zombie (never retried); a transient error (node down, shard in handoff,
PostgreSQL away: ``ErrorInfo.retryable``) -> try again through the unary RPCs with
backoff, for as long as the worker lives; a Complete refused ``INVALID_ARGUMENT`` (its
result over the node's size limit, which the worker cannot know: the SDK checked the
other document rules before sending it) -> replaced by a non-retryable Fail of the same
attempt (``chronoshard.worker.ResultRefused``, saying why), sent once the same way, so
the task fails at once instead of waiting out its lease (and, non-idempotent, ending
OUTCOME_UNKNOWN); any other refusal, that Fail's included -> drop it, logged as an
error. A Receipt that never comes (``receipt_timeout_s``) counts as a transient error.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable
from typing import Any

from chronoshard.clock import Clock
from chronoshard.events import wait_event
from chronoshard.worker._backoff import backoff_s
from chronoshard.worker._errors import STALE_FENCING_TOKEN, CallFailed
from chronoshard.worker._execution import result_refused
from chronoshard.worker._models import Ack, Complete, Fail, Receipt, RunKey, Settlement
from chronoshard.worker._outbox import Outbox, OutboxEntry
from chronoshard.worker._session import NodeSession
from chronoshard.worker._topology import Topology
from chronoshard.worker._transport import Transport, is_retryable

logger = logging.getLogger("chronoshard.worker")

RESEND_CONCURRENCY = 16
"""Unary settlements in flight at once (docs/architecture.md#d12: bound calls per channel)."""
MAX_BACKOFF_FAILURES = 16
RESEND_MAX_S = 2.0
"""The longest wait between unary tries of one settlement (from 0.1 s, doubling): a node
answers a settlement it cannot commit within ``database.acquire_timeout_s`` anyway, so
the cap sets how late a settlement lands after PostgreSQL is back, not the load."""

OnStale = Callable[[RunKey, str, str], None]
"""Called with (task id, token), what was refused, and the node, for a stale token."""

INVALID_ARGUMENT = "INVALID_ARGUMENT"


def refused_result(settlement: Settlement, code: str, reason: str, message: str) -> Fail | None:
    """The Fail that replaces ``settlement`` when a node refused it with ``code``: only a
    Complete refused ``INVALID_ARGUMENT`` has one (its result is what the node refused:
    the attempt fails, non-retryable, saying why). None: nothing replaces it."""
    if not isinstance(settlement, Complete) or code != INVALID_ARGUMENT:
        return None
    failed = result_refused(f"the scheduler refused the handler's result ({reason}): {message}")
    return Fail(
        settlement.task,
        settlement.fencing_token,
        failed.error_message,
        failed.error_type,
        failed.retryable,
    )


class Settlements:
    def __init__(
        self,
        *,
        worker_id: str,
        transport: Transport,
        topology: Topology,
        clock: Clock,
        on_stale: OnStale,
        on_change: Callable[[], None],
        rng: random.Random | None = None,
    ) -> None:
        self._worker_id = worker_id
        self._transport = transport
        self._topology = topology
        self._clock = clock
        self._on_stale = on_stale
        self._on_change = on_change
        self._rng = rng or random.Random()
        self._wakeup = asyncio.Event()
        # When the resend loop wakes next by itself (inf: not until woken).
        self._wake_at = math.inf
        self.outbox = Outbox()

    def __len__(self) -> int:
        return len(self.outbox)

    def _log(self, level: int, msg: str, *args: Any, **fields: Any) -> None:
        logger.log(level, msg, *args, extra={"worker_id": self._worker_id, **fields})

    # ---- sending ---------------------------------------------------------------------

    def send(self, node: str, settlement: Settlement, *, on_draining_node: bool = True) -> None:
        """Send on ``node``'s stream and await the Receipt, or go unary.

        ``on_draining_node=False`` (final settlements) skips a node that sent Drain: it
        is handing its shards over, the other nodes settle for it.
        """
        session = self._topology.session(node)
        usable = session is not None and (session.live if on_draining_node else session.usable)
        now = self._clock.monotonic()
        if usable and session is not None and session.send(settlement):
            self.outbox.add_stream(settlement, node, now)
            entry = self.outbox.get(settlement.key)
            if entry is not None and entry.deadline < self._wake_at:
                # The resend loop must wake when this Receipt is overdue: it may be
                # sleeping with no deadline at all (an empty outbox), and then a lost
                # Receipt would never be noticed.
                self._wakeup.set()
        elif not isinstance(settlement, Ack):
            self.outbox.add_unary(settlement, now)
            self._wakeup.set()
        # An Ack with no stream is not kept: there is no unary Ack, and the task's final
        # settlement is accepted from DISPATCHED as well.

    def discard(self, key: RunKey) -> None:
        """The attempt was revoked: forget what is still pending for it."""
        self.outbox.discard_task(*key)

    # ---- streams ---------------------------------------------------------------------

    def on_welcome(self, session: NodeSession, still_running: Callable[[RunKey], bool]) -> None:
        """A session (re)opened: send again the Acks its previous stream lost.

        The node's reconciler asks the worker's session whether it knows an attempt that
        stays DISPATCHED, so an Ack of a task that still runs is worth repeating.
        """
        now = self._clock.monotonic()
        for ack in self.outbox.parked_for(session.address):
            if still_running((ack.task.id, ack.fencing_token)) and session.send(ack):
                self.outbox.add_stream(ack, session.address, now)
            else:
                self.outbox.confirm(ack.key)

    def on_stream_lost(self, session: NodeSession) -> None:
        moved = self.outbox.stream_lost(session.address, self._clock.monotonic())
        if moved:
            self._log(
                logging.INFO,
                "stream lost with %d settlements unconfirmed; resending them",
                moved,
                node=session.node_id,
                event="settlements_orphaned",
            )
            self._wakeup.set()

    def on_receipt(self, session: NodeSession, receipt: Receipt) -> None:
        entry = self.outbox.confirm(receipt.key)
        self._on_change()
        error = receipt.error
        if error is None:
            return
        key = (receipt.task.id, receipt.fencing_token)
        fields = {"task_id": key[0], "token": key[1], "node": session.node_id}
        if error.reason == STALE_FENCING_TOKEN:
            self._on_stale(key, receipt.kind.value, session.node_id)
        elif entry is not None and is_retryable(error.code, error):
            if isinstance(entry.settlement, Ack):
                return  # no unary Ack; heartbeats and the final settlement cover it
            self._log(
                logging.WARNING,
                "%s refused for now (%s); retrying",
                receipt.kind.value,
                error.reason or error.code,
                event="settlement_retry",
                **fields,
            )
            self.outbox.add_unary(entry.settlement, self._clock.monotonic())
            self._wakeup.set()
        elif entry is None and is_retryable(error.code, error):
            # Nothing of it is pending any more (an Ack its Complete replaced while the
            # node could not write): the refusal changes nothing and is no error.
            self._log(
                logging.DEBUG,
                "%s refused for now (%s); nothing left to resend",
                receipt.kind.value,
                error.reason or error.code,
                event="settlement_moot",
                **fields,
            )
        elif entry is not None and (
            fail := refused_result(entry.settlement, error.code, error.reason, error.message)
        ):
            self._fail_instead(fail, session.address, receipt.kind.value, **fields)
        else:
            self._log(
                logging.ERROR,
                "%s refused: %s %s",
                receipt.kind.value,
                error.reason or error.code,
                error.message,
                event="settlement_refused",
                **fields,
            )

    def _fail_instead(self, fail: Fail, address: str, refused: str, **fields: Any) -> None:
        """Send ``fail`` in place of a refused Complete: on the stream to ``address`` if it
        is usable, else unary. Its own refusal is not replaced again (only a Complete is)."""
        self._log(
            logging.WARNING,
            "%s refused, the attempt fails instead (not retried): %s",
            refused,
            fail.error_message,
            event="result_refused",
            **fields,
        )
        self.send(address, fail, on_draining_node=False)

    # ---- unary resends ---------------------------------------------------------------

    async def run(self) -> None:
        """Send whatever is due through the unary RPCs, forever (cancel to stop)."""
        while True:
            due = self.outbox.due_unary(self._clock.monotonic())
            for start in range(0, len(due), RESEND_CONCURRENCY):
                batch = due[start : start + RESEND_CONCURRENCY]
                await asyncio.gather(*(self._resend(entry) for entry in batch))
            self._on_change()
            deadline = self.outbox.next_deadline()
            self._wake_at = math.inf if deadline is None else deadline
            timeout = None if deadline is None else max(0.0, deadline - self._clock.monotonic())
            self._wakeup.clear()
            await wait_event(self._wakeup, timeout)
            self._wake_at = -math.inf  # awake: whatever is added now is seen by this pass

    async def _resend(self, entry: OutboxEntry) -> None:
        s = entry.settlement
        addresses = self._topology.addresses()
        if not addresses:  # nowhere to send it yet: try again after the backoff
            delay = backoff_s(
                min(entry.unary_attempts, MAX_BACKOFF_FAILURES),
                self._rng.random(),
                max_s=RESEND_MAX_S,
            )
            self.outbox.unary_failed(s.key, self._clock.monotonic(), delay)
            return
        address = addresses[(entry.unary_attempts - 1) % len(addresses)]
        fields = {"task_id": s.task.id, "token": s.fencing_token, "node": address}
        try:
            await self._transport.settle(address, self._worker_id, s)
        except CallFailed as exc:
            if exc.stale:
                self.outbox.confirm(s.key)
                self._on_stale((s.task.id, s.fencing_token), s.kind.value, address)
            elif exc.retryable:
                failures = min(entry.unary_attempts, MAX_BACKOFF_FAILURES)
                delay = backoff_s(failures, self._rng.random(), max_s=RESEND_MAX_S)
                self.outbox.unary_failed(s.key, self._clock.monotonic(), delay)
                self._log(
                    logging.INFO,
                    "%s through %s failed (%s); retrying in %.2f s",
                    s.kind.value,
                    address,
                    exc.code,
                    delay,
                    event="settlement_retry",
                    **fields,
                )
            elif fail := refused_result(s, exc.code, exc.reason, exc.message):
                self.outbox.confirm(s.key)
                self._fail_instead(fail, address, s.kind.value, **fields)
            else:
                self.outbox.confirm(s.key)
                self._log(
                    logging.ERROR,
                    "%s refused: %s",
                    s.kind.value,
                    exc,
                    event="settlement_refused",
                    **fields,
                )
        else:
            self.outbox.confirm(s.key)
            self._log(
                logging.INFO,
                "%s settled through %s",
                s.kind.value,
                address,
                event="settled_unary",
                **fields,
            )
