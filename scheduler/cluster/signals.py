"""Cross-node signals over PostgreSQL LISTEN/NOTIFY.

Any node accepts submits, settlements and releases, but only a shard's owner preloads
and dispatches its tasks. When a node changes a task of a shard it does not own in a
way the owner must act on soon, it tells the owner through one channel
(``chronoshard_shards``), so the owner does not wait for its next periodic pass:

* ``due <shard> <shard> ...`` — tasks became due within the lookahead (a submit, a retry
  scheduled): the owner wakes its preloader;
* ``ready <shard> <scheduled_at> <id>`` (one line per task) — a task went back to
  PRELOADED (a release accepted by this node): the owner reloads exactly those rows;
* ``tenants`` — a tenant's quotas changed (``chronoshard tenants update``, sent by the
  operator's transaction, ``store/sql/tenants.sql``): every node refreshes its tenant
  cache (``on_tenants_changed``).

Every node receives every notification and keeps what concerns shards it owns. A lost
notification (the listener reconnecting) only costs latency: the periodic preload pass
and the reconciler find the same work. NOTIFY is transactional and payloads are limited
to ~8 kB, so messages are chunked.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import ClassVar, Protocol

import psycopg

from chronoshard.batching import chunk
from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.store.database import Store

log = logging.getLogger(__name__)

CHANNEL = "chronoshard_shards"
TENANTS_CHANGED = "tenants"
"""The payload ``store/sql/tenants.sql`` sends when a tenant's quotas change."""
MAX_PAYLOAD_CHARS = 7000
RECONNECT_S = 1.0


def encode_due(shards: Iterable[int]) -> list[str]:
    return _chunks("due", [str(s) for s in sorted(set(shards))], " ")


def encode_ready(tasks: Iterable[tuple[int, TaskRef]]) -> list[str]:
    lines = [f"{shard} {ref.scheduled_at.isoformat()} {ref.id}" for shard, ref in tasks]
    return _chunks("ready", lines, "\n")


def _chunks(kind: str, items: list[str], sep: str) -> list[str]:
    """``kind`` and then as many items as fit in one payload, each after a separator."""
    runs = chunk(
        items,
        lambda item: len(item) + len(sep),
        max_items=sys.maxsize,
        max_bytes=MAX_PAYLOAD_CHARS - len(kind),
    )
    return [kind + sep + sep.join(run) for run in runs]


def decode(payload: str) -> tuple[str, set[int], list[tuple[int, TaskRef]]]:
    """(kind, shards to wake, tasks to reload); raises ValueError for a malformed payload."""
    if payload == TENANTS_CHANGED:
        return TENANTS_CHANGED, set(), []
    if payload.startswith("due "):
        return "due", {int(s) for s in payload[4:].split()}, []
    if payload.startswith("ready\n"):
        tasks = []
        for line in payload[6:].splitlines():
            shard, at, task_id = line.split(" ")
            tasks.append((int(shard), TaskRef(datetime.fromisoformat(at), uuid.UUID(task_id))))
        return "ready", {shard for shard, _ in tasks}, tasks
    raise ValueError(f"unknown notification {payload[:40]!r}")


class SignalHandler(Protocol):
    def signal_due(self, shards: set[int]) -> None: ...
    def signal_ready(self, tasks: list[tuple[int, TaskRef]]) -> None: ...


class ShardSignals:
    """Sends and receives the cross-node signals of one node."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, dsn: str, store: Store) -> None:
        self._dsn = dsn
        self._store = store
        self._handler: SignalHandler | None = None
        # Set by the node: a tenant's quotas changed (its tenant cache refreshes).
        self.on_tenants_changed: Callable[[], None] | None = None
        self._stats: dict[str, int] = {"sent": 0, "received": 0, "send_errors": 0, "reconnects": 0}

    def attach(self, handler: SignalHandler) -> None:
        """Who acts on what arrives (:class:`~.routing.ChangeRouter`); before :meth:`listen`."""
        self._handler = handler

    async def send(self, payloads: Sequence[str]) -> None:
        """Best effort: a signal that cannot be sent is found by the periodic passes."""
        if not payloads:
            return
        try:
            async with self._store.connection() as conn:
                for payload in payloads:
                    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
            self._stats["sent"] += len(payloads)
        except Exception as exc:
            self._stats["send_errors"] += 1
            log.warning("cannot notify other nodes", extra={"error": str(exc)})

    async def listen(self) -> None:
        """Receive signals forever, reconnecting after a lost connection."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    async for notify in conn.notifies():
                        self._stats["received"] += 1
                        self._handle(notify.payload)
            except (psycopg.OperationalError, OSError) as exc:
                self._stats["reconnects"] += 1
                log.warning("signal listener lost its connection", extra={"error": str(exc)})
                await asyncio.sleep(RECONNECT_S)

    def _handle(self, payload: str) -> None:
        try:
            kind, shards, tasks = decode(payload)
        except ValueError as exc:
            log.warning("ignoring malformed signal", extra={"error": str(exc)})
            return
        if kind == TENANTS_CHANGED:
            if self.on_tenants_changed is not None:
                self.on_tenants_changed()
            return
        if self._handler is None:
            return  # not listening yet: the periodic passes find the work
        try:
            if kind == "due":
                self._handler.signal_due(shards)
            else:
                self._handler.signal_ready(tasks)
        except Exception:  # a bad handler must not stop the listener
            log.exception("signal handler failed", extra={"kind": kind})

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
