"""What workers report, group-committed: one :class:`GroupCommitter` per kind.

Acks, heartbeats, completions, failures and releases from all sessions (and the unary
``Complete``, ``Fail``, ``Release`` RPCs, which any node accepts) each go through their
kind's committer, so the database sees one statement per few milliseconds per kind, not
one per message (docs/architecture.md#d7). A caller is answered only after its batch
committed. What a flush learns that the dispatcher must hear (retries scheduled, tasks
released back to PRELOADED, a release whose outcome is unknown) goes to the
:class:`SettlementListener`; this module knows nothing of wheels or sessions.

The values are the core's (:mod:`chronoshard.scheduler.core.runs`), parsed from the
worker's messages by the servicer (:mod:`chronoshard.scheduler.api.workers`), which keeps
the messages themselves for the receipts: the server keeps protobuf on its hot path on
purpose (converting dominated a heartbeat's cost), so only what the statements need is
converted, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar, Protocol

from chronoshard.clock import Clock
from chronoshard.scheduler.config import WorkersConfig
from chronoshard.scheduler.core.runs import (
    Beat,
    Completion,
    Failure,
    LeaseUpdate,
    Release,
    Settle,
    SettleOutcome,
    SettleResult,
    TimerTask,
)
from chronoshard.scheduler.dispatch.group_commit import GroupCommitter
from chronoshard.scheduler.errors import CommitOutcomeUnknown
from chronoshard.scheduler.store.runs import RunStore


class SettlementListener(Protocol):
    """What the dispatcher hears from the settlements' flushes."""

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None: ...

    def task_due(self, shard: int, due_at: datetime) -> None:
        """A task of ``shard`` became due at ``due_at`` (a retry scheduled, a workflow
        child released): its preloader must see it."""
        ...

    def preloaded_unknown(self) -> None: ...


class Settlements:
    """The five committers, their flushes, and what the flushes tell the listener."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        workers: WorkersConfig,
        store: RunStore,
        clock: Clock,
        listener: SettlementListener,
    ) -> None:
        self._workers = workers
        self._store = store
        self._clock = clock
        self._listener = listener
        linger = workers.group_commit_interval_s
        self._acks = GroupCommitter("ack", self._ack_batch, linger_s=linger)
        self._beats = GroupCommitter("heartbeat", self._beat_batch, linger_s=linger)
        self._completions = GroupCommitter("complete", self._complete_batch, linger_s=linger)
        self._failures = GroupCommitter("fail", self._fail_batch, linger_s=linger)
        self._releases = GroupCommitter("release", self._release_batch, linger_s=linger)
        self._committers: list[GroupCommitter[Any, Any]] = [
            self._acks,
            self._beats,
            self._completions,
            self._failures,
            self._releases,
        ]
        # Heartbeat cost (bench/heartbeats.py): messages, the extend_leases statements
        # their group commits issued, and the leases those statements extended.
        self._stats: dict[str, int] = {
            "heartbeats": 0,
            "heartbeat_statements": 0,
            "leases_extended": 0,
        }

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        for committer in self._committers:
            committer.start()

    async def stop(self) -> None:
        """Refuse from now on, and answer everything queued (bounded, per committer)."""
        # All at once: every kind refuses from here on, and a slow flush of one kind
        # does not keep the others taking requests.
        await asyncio.gather(*(committer.stop() for committer in self._committers))

    @property
    def committers(self) -> Sequence[GroupCommitter[Any, Any]]:
        """One per kind (each ``name`` says which), for the metrics endpoint."""
        return tuple(self._committers)

    @property
    def accepting(self) -> bool:
        """False once :meth:`stop` began: acks, heartbeats and settlements are refused
        (``NODE_STOPPING``, retryable) instead of being queued."""
        return all(committer.accepting for committer in self._committers)

    # ---- submits (each answered once its batch committed) --------------------------------

    async def submit(self, settlement: Settle) -> SettleOutcome:
        """An Ack, Complete, Fail or Release, through its kind's committer."""
        match settlement:
            case Completion():
                return await self._completions.submit(settlement)
            case Failure():
                return await self._failures.submit(settlement)
            case Release():
                return await self._releases.submit(settlement)
            case _:
                return await self._acks.submit(settlement)

    async def heartbeat(self, beats: Sequence[Beat]) -> LeaseUpdate:
        """One heartbeat's beats (one request: its tasks are extended together)."""
        return await self._beats.submit(beats)

    # ---- the flushes ------------------------------------------------------------------

    async def _ack_batch(self, acks: Sequence[Settle]) -> list[SettleOutcome]:
        outcomes = await self._store.ack(acks)
        return [outcomes[a.ref.id] for a in acks]

    async def _complete_batch(self, completions: Sequence[Completion]) -> list[SettleOutcome]:
        result = await self._store.complete(completions)
        self._tell_due(result)
        return [result.outcomes[c.ref.id] for c in completions]

    async def _beat_batch(self, batches: Sequence[Sequence[Beat]]) -> list[LeaseUpdate]:
        flat = [beat for batch in batches for beat in batch]
        workers = self._workers
        update = await self._store.extend_leases(flat, workers.task_lease_s, workers.lease_margin_s)
        self._stats["heartbeats"] += len(batches)
        self._stats["heartbeat_statements"] += 1 if flat else 0
        self._stats["leases_extended"] += len(update.extended)
        # Every heartbeat in the batch gets the same answer: it filters by its own ids.
        return [update] * len(batches)

    async def _fail_batch(self, failures: Sequence[Failure]) -> list[SettleOutcome]:
        result = await self._store.fail(failures, self._clock.now())
        self._tell_due(result)
        return [result.outcomes[f.ref.id] for f in failures]

    def _tell_due(self, result: SettleResult) -> None:
        for shard, due_at in result.due:
            self._listener.task_due(shard, due_at)

    async def _release_batch(self, releases: Sequence[Release]) -> list[SettleOutcome]:
        try:
            outcomes, ready = await self._store.release(releases)
        except CommitOutcomeUnknown:
            # Released rows may be PRELOADED now and on no wheel: they are read back. (The
            # worker's retry finds them released and answers OK without new rows.)
            self._listener.preloaded_unknown()
            raise
        if ready:
            self._listener.tasks_ready_again(ready)
        return [outcomes[r.ref.id] for r in releases]

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
