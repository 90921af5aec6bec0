"""One worker session with one scheduler node: the Connect stream and its reconnect loop.

A :class:`NodeSession` owns the stream to one node address. Its task loops: open the
stream, say ``Hello``, wait for ``Welcome`` (or ``Reject``), then run three things until
the stream ends: a reader that hands every message to the worker (the
:class:`SessionHost`), a single writer draining a bounded send queue (gRPC allows one
write at a time, and a stream that cannot keep up is broken off rather than allowed to
queue without bound), and a heartbeat timer at the node's ``heartbeat_interval``. Each
heartbeat is numbered and its reply echoes the number, so the worker knows which
heartbeat (and when it was sent) a reply answers, even after the node could not answer
one (its database was away): the lease it extends is the one of that send. When
the stream ends it waits the reconnect backoff (0.1 s doubling to 5 s, jittered) and
starts over, until it is retired (the node left the topology) or closed.

The session decides nothing about tasks: credits, settlements and revocations are the
worker's business, reached through the host callbacks, which always run on the event
loop between two awaits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import OrderedDict
from typing import Any, Protocol

from chronoshard.batching import MAX_BATCH_MESSAGES, take_queued
from chronoshard.events import wait_event
from chronoshard.wire import DEFAULT_LEASE_MARGIN_S
from chronoshard.worker._backoff import backoff_s
from chronoshard.worker._models import (
    Heartbeat,
    HeartbeatReply,
    Hello,
    Inbound,
    NodeInfo,
    Outbound,
    Reject,
    Welcome,
)
from chronoshard.worker._transport import Stream, StreamClosed, Transport

logger = logging.getLogger("chronoshard.worker")

DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
"""Used when the node's Welcome leaves heartbeat_interval unset (docs/architecture.md#d7)."""
HELLO_TIMEOUT_S = 10.0
SEND_QUEUE_MIN = 1024
SEND_QUEUE_PER_SLOT = 4
"""A run can leave an Ack, its settlement and a credit grant queued for its node at
once: the queue holds four messages per slot (and at least SEND_QUEUE_MIN), so a
worker with many slots that settles them together does not overflow it."""


def send_queue_size(slots: int) -> int:
    return max(SEND_QUEUE_MIN, SEND_QUEUE_PER_SLOT * slots)


PENDING_HEARTBEATS_MAX = 64


class SessionHost(Protocol):
    """What a session needs from the worker."""

    @property
    def worker_id(self) -> str: ...

    def hello(self) -> Hello: ...

    def session_welcomed(self, session: NodeSession) -> None: ...

    def session_message(self, session: NodeSession, msg: Inbound) -> None: ...

    def session_ended(self, session: NodeSession, *, welcomed: bool) -> None: ...

    def heartbeat_for(self, session: NodeSession) -> tuple[Heartbeat, Any]: ...

    def heartbeat_answered(self, session: NodeSession, sent: Any, reply: HeartbeatReply) -> None:
        """``sent`` is what ``heartbeat_for`` returned alongside the heartbeat it answers
        (None when the reply matches no heartbeat still waiting: only its revocations
        count)."""
        ...


class NodeSession:
    def __init__(
        self,
        node: NodeInfo,
        host: SessionHost,
        transport: Transport,
        *,
        heartbeat_interval_s: float | None = None,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        rng: random.Random | None = None,
    ) -> None:
        self.address = node.address
        self.node_id = node.node_id  # replaced by Welcome.node_id
        self._host = host
        self._transport = transport
        self._heartbeat_override_s = heartbeat_interval_s
        self._hello_timeout_s = hello_timeout_s
        self._rng = rng or random.Random()
        self.welcome: Welcome | None = None
        self.live = False  # welcomed and the stream is open
        self.drained = False  # the node sent Drain on the current stream
        self.retired = False
        self._retire_event = asyncio.Event()
        self._stream: Stream | None = None
        self._queue: asyncio.Queue[Outbound] | None = None
        # What each unanswered heartbeat carried, by number, oldest first; bounded in case
        # a node never answers (then the oldest is forgotten and its checkpoints sent
        # again).
        self._pending_heartbeats: OrderedDict[int, Any] = OrderedDict()
        self._heartbeat_seq = 0
        self.task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"NodeSession({self.address!r}, node_id={self.node_id!r}, live={self.live})"

    @property
    def usable(self) -> bool:
        """Live and not draining: a stream to send new settlements and credits on."""
        return self.live and not self.drained

    @property
    def lease_duration_s(self) -> float | None:
        """How long a heartbeat this node answers extends a lease (None: not stated)."""
        return None if self.welcome is None else self.welcome.lease_duration_s

    @property
    def lease_margin_s(self) -> float:
        """How long before its lease runs out the worker stops an attempt of this node."""
        if self.welcome is not None and self.welcome.lease_margin_s is not None:
            return self.welcome.lease_margin_s
        return DEFAULT_LEASE_MARGIN_S

    @property
    def heartbeat_interval_s(self) -> float:
        if self._heartbeat_override_s is not None:
            return self._heartbeat_override_s
        if self.welcome is not None and self.welcome.heartbeat_interval_s:
            return self.welcome.heartbeat_interval_s
        return DEFAULT_HEARTBEAT_INTERVAL_S

    def _log_fields(self, **fields: Any) -> dict[str, Any]:
        return {"worker_id": self._host.worker_id, "node": self.node_id, **fields}

    # ---- lifecycle -------------------------------------------------------------------

    def retire(self) -> None:
        """Do not reconnect once the current stream ends; stop at once if not connected."""
        self.retired = True
        self._retire_event.set()
        if not self.live and self._stream is not None:
            self._stream.cancel()

    def unretire(self) -> None:
        """The node is back in the topology before the session stopped: keep it."""
        self.retired = False
        self._retire_event = asyncio.Event()

    async def close(self) -> None:
        """Break the stream off and stop reconnecting; returns once the task ended."""
        self.retired = True
        self._retire_event.set()
        if self._stream is not None:
            self._stream.cancel()
        if self.task is not None:
            await asyncio.wait({self.task})

    def send(self, msg: Outbound) -> bool:
        """Queue ``msg`` on the live stream; False when there is none (or it is stalled)."""
        if not self.live or self._queue is None:
            return False
        try:
            self._queue.put_nowait(msg)
        except asyncio.QueueFull:
            logger.warning(
                "send queue full, breaking the stream off",
                extra=self._log_fields(event="send_queue_full"),
            )
            if self._stream is not None:
                self._stream.cancel()
            return False
        return True

    # ---- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, back off, reconnect: until retired or closed."""
        failures = 0
        while not self.retired:
            welcomed = False
            try:
                welcomed = await self._serve()
                if welcomed:
                    logger.info(
                        "%s ended the stream",
                        self.address,
                        extra=self._log_fields(event="stream_ended"),
                    )
            except StreamClosed as exc:
                logger.info(
                    "stream to %s ended: %s",
                    self.address,
                    exc,
                    extra=self._log_fields(event="stream_closed"),
                )
            if self._retire_event.is_set():
                break
            # A session that got as far as Welcome starts the backoff over.
            failures = 1 if welcomed else failures + 1
            delay = backoff_s(failures, self._rng.random())
            logger.debug(
                "reconnecting to %s in %.2f s",
                self.address,
                delay,
                extra=self._log_fields(event="reconnect_wait"),
            )
            await wait_event(self._retire_event, delay)

    async def _serve(self) -> bool:
        """One stream from Hello to its end; True if the node welcomed us."""
        stream = self._transport.open_stream(self.address)
        self._stream = stream
        welcomed = False
        try:
            await stream.send(self._host.hello())
            try:
                async with asyncio.timeout(self._hello_timeout_s):
                    first = await stream.receive()
            except TimeoutError:
                raise StreamClosed(f"no Welcome from {self.address} in time") from None
            if first is None:
                raise StreamClosed(f"{self.address} ended the stream before Welcome")
            if isinstance(first, Reject):
                self._log_reject(first)
                return False
            if not isinstance(first, Welcome):
                raise StreamClosed(f"{self.address} sent {type(first).__name__} before Welcome")
            welcomed = True
            await self._serve_welcomed(stream, first)
            return True
        finally:
            stream.cancel()
            self._stream = None
            self._host.session_ended(self, welcomed=welcomed)

    async def _serve_welcomed(self, stream: Stream, welcome: Welcome) -> None:
        self.welcome = welcome
        self.node_id = welcome.node_id or self.node_id
        self.drained = False
        self._queue = asyncio.Queue(maxsize=send_queue_size(self._host.hello().slots))
        self._pending_heartbeats.clear()
        self.live = True
        logger.info(
            "session open with %s (%s)",
            self.node_id,
            self.address,
            extra=self._log_fields(event="session_open", session_id=welcome.session_id),
        )
        helpers = [
            asyncio.create_task(
                self._write_loop(stream), name=f"chronoshard-writer {self.address}"
            ),
            asyncio.create_task(
                self._heartbeat_loop(), name=f"chronoshard-heartbeat {self.address}"
            ),
        ]
        try:
            self._host.session_welcomed(self)
            while (msg := await stream.receive()) is not None:
                if isinstance(msg, Reject):
                    self._log_reject(msg)
                    return
                if isinstance(msg, HeartbeatReply):
                    self._host.heartbeat_answered(self, self._answered(msg), msg)
                else:
                    self._host.session_message(self, msg)
        finally:
            self.live = False
            self._queue = None
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _write_loop(self, stream: Stream) -> None:
        queue = self._queue
        assert queue is not None
        while True:
            msg = await queue.get()
            try:
                if queue.empty() or self.welcome is None or not self.welcome.accepts_batches:
                    await stream.send(msg)
                else:
                    # Whatever else is queued goes out with it, in as few writes as may be.
                    await stream.send_many(take_queued(msg, queue, MAX_BATCH_MESSAGES))
            except StreamClosed as exc:
                # Breaking the call off ends the reader too; whatever was queued but not
                # written is still in the worker's outbox and is resent from there.
                logger.info(
                    "write to %s failed: %s",
                    self.address,
                    exc,
                    extra=self._log_fields(event="write_failed"),
                )
                stream.cancel()
                return

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            heartbeat, sent = self._host.heartbeat_for(self)
            self._heartbeat_seq += 1
            if self.send(dataclasses.replace(heartbeat, seq=self._heartbeat_seq)):
                self._pending_heartbeats[self._heartbeat_seq] = sent
                while len(self._pending_heartbeats) > PENDING_HEARTBEATS_MAX:
                    self._pending_heartbeats.popitem(last=False)

    def _answered(self, reply: HeartbeatReply) -> Any:
        """What the heartbeat this reply answers carried; heartbeats sent before it that
        got no reply never will (the node answers in order) and are forgotten."""
        pending = self._pending_heartbeats
        if reply.seq == 0:
            # A node that does not echo numbers answers every heartbeat, in order.
            return pending.popitem(last=False)[1] if pending else None
        if reply.seq not in pending:
            return None
        while pending:
            seq, sent = pending.popitem(last=False)
            if seq == reply.seq:
                return sent
        return None

    def _log_reject(self, reject: Reject) -> None:
        logger.error(
            "node %s rejected the session: %s %s",
            self.address,
            reject.error.reason or reject.error.code,
            reject.error.message,
            extra=self._log_fields(event="session_rejected"),
        )
