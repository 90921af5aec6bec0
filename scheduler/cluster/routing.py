"""Which node acts on a changed task, and how it hears of it.

Any node takes submits, cancels and releases, but only a shard's owner preloads and
dispatches its tasks. :class:`ChangeRouter` is where a change meets that rule: a task
of an owned shard wakes this node's preloader (or, for a cancel, leaves its dispatcher
and the worker holding it is told); a task of another node's shard that is due within
the lookahead, or that went back to PRELOADED, is a signal to its owner
(:mod:`.signals`, LISTEN/NOTIFY). The signals other nodes send arrive here too, and only
those of owned shards are acted on. Signals are best effort: the periodic preload pass
and the reconciler find whatever one missed, so a send runs in the background and never
holds up the API call or the dispatch round that caused it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from chronoshard.clock import Clock
from chronoshard.scheduler.cluster.signals import SignalHandler, encode_due, encode_ready
from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.errors import StoreUnavailable

log = logging.getLogger(__name__)


class ChangedTask(Protocol):
    """What the router reads of a task (a :class:`~chronoshard.scheduler.core.models.Task`)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def shard(self) -> int: ...
    @property
    def due_at(self) -> datetime: ...


class OwnedShards(Protocol):
    def owns(self, shard: int) -> bool: ...
    def epochs(self) -> Mapping[int, int]: ...


class Preloading(Protocol):
    def wake(self) -> None: ...


class Timers(Protocol):
    """The dispatcher's wheel and ready queues."""

    def schedule(self, timers: Iterable[TimerTask]) -> None: ...
    def forget(self, task_id: uuid.UUID) -> bool: ...


class Cancels(Protocol):
    """The worker sessions: the one holding a task is told it was cancelled."""

    def send_cancel(self, task_id: uuid.UUID, reason: str) -> bool: ...


class PreloadedReader(Protocol):
    async def load_preloaded_refs(
        self, epochs: Mapping[int, int], refs: Sequence[TaskRef]
    ) -> list[TimerTask]: ...


class SignalChannel(Protocol):
    """:class:`~.signals.ShardSignals`: sends to every node, hands what arrives over."""

    def attach(self, handler: SignalHandler) -> None: ...
    async def send(self, payloads: Sequence[str]) -> None: ...


class ChangeRouter:
    """Routes submitted, cancelled and released tasks to the node that owns their shard."""

    def __init__(
        self,
        *,
        clock: Clock,
        lookahead_s: float,
        shards: OwnedShards,
        preloader: Preloading,
        dispatcher: Timers,
        sessions: Cancels,
        runs: PreloadedReader,
        signals: SignalChannel,
    ) -> None:
        self._clock = clock
        self._lookahead = timedelta(seconds=lookahead_s)
        self._shards = shards
        self._preloader = preloader
        self._dispatcher = dispatcher
        self._sessions = sessions
        self._runs = runs
        self._signals = signals
        self._sending: set[asyncio.Task[None]] = set()
        signals.attach(self)

    # ---- changes made here (the API's listener, the shard manager's and dispatcher's hooks)

    def tasks_submitted(self, tasks: Sequence[ChangedTask]) -> None:
        """New tasks: wake our preloader, or tell the owners of other shards, if one is
        due within the lookahead."""
        horizon = self._clock.now() + self._lookahead
        remote: set[int] = set()
        for task in tasks:
            if task.due_at >= horizon:
                continue
            if self._shards.owns(task.shard):
                self._preloader.wake()
            else:
                remote.add(task.shard)
        if remote:
            self._background(self._signals.send(encode_due(remote)))

    def cancel_requested(self, task: ChangedTask, reason: str) -> None:
        self._dispatcher.forget(task.id)
        self._sessions.send_cancel(task.id, reason)

    def due_elsewhere(self, shard: int, due_at: datetime) -> None:
        """A task of a shard this node no longer owns became due (a retry scheduled)."""
        if due_at < self._clock.now() + self._lookahead:
            self._background(self._signals.send(encode_due([shard])))

    def ready_elsewhere(self, timers: Sequence[TimerTask]) -> None:
        """Tasks released back to PRELOADED here whose shard another node owns."""
        self._background(self._signals.send(encode_ready((t.shard, t.ref) for t in timers)))

    # ---- signals from other nodes ------------------------------------------------------

    def signal_due(self, shards: set[int]) -> None:
        if any(self._shards.owns(s) for s in shards):
            self._preloader.wake()

    def signal_ready(self, tasks: list[tuple[int, TaskRef]]) -> None:
        epochs = self._shards.epochs()
        mine = [ref for shard, ref in tasks if shard in epochs]
        if mine:
            self._background(self._reload(dict(epochs), mine))

    async def _reload(self, epochs: dict[int, int], refs: list[TaskRef]) -> None:
        try:
            self._dispatcher.schedule(await self._runs.load_preloaded_refs(epochs, refs))
        except StoreUnavailable as exc:
            log.warning("cannot reload released tasks", extra={"error": str(exc)})

    # ---- background sends ------------------------------------------------------------

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def in_flight(self) -> list[asyncio.Task[None]]:
        """Sends and reloads still running, for the node to cancel at stop."""
        return list(self._sending)
