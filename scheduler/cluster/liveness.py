"""Which workers have a session with which node, and what each session is, recorded in
``worker_sessions``.

A worker holds one stream to every node, and each node knows only its own streams, yet
a node taking shards over in a planned handoff must know which workers the cluster has,
so that it waits until every one of them has a stream (and credits) with it before it
owns anything (:mod:`chronoshard.scheduler.core.handoff`). So each node records, per worker it has a
session of, when it last saw it. :class:`WorkerLiveness` writes one statement for all of the node's
sessions every third of ``workers.session_timeout_s``, and at once when a session opens or closes
(the session registry's ``on_sessions_changed``); a session that closed is written one last
time, marked closed. A node that dies stops refreshing its rows, and they age out (partition
maintenance forgets them after a day). The statements are
:class:`chronoshard.scheduler.store.sessions.WorkerSessionStore`'s.

Nothing here decides whether a task may run again: a worker cut off by a partition looks
exactly like a gone one, so leases and the workers' self-fencing decide that
(:mod:`.reconciler`).

Each record also says what the session is (a
:class:`~chronoshard.scheduler.core.worker_sessions.SessionReport`: whose key opened it,
its queues and types, slots, credits, tasks running), so that any node can list the
cluster's sessions (``AdminService.ListWorkerSessions``); the figures that change
(credits, running) are as of the last refresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import ClassVar, Protocol

from chronoshard.events import wait_event
from chronoshard.scheduler.core.worker_sessions import SessionReport
from chronoshard.scheduler.errors import StoreUnavailable

log = logging.getLogger(__name__)

REFRESHES_PER_TIMEOUT = 3


class SessionSource(Protocol):
    def reports(self) -> list[SessionReport]:
        """The node's live sessions, as of now."""
        ...


class LivenessStore(Protocol):
    async def touch_worker_sessions(
        self, node_id: str, live: Collection[SessionReport], closed: Collection[str] = ()
    ) -> None: ...


class WorkerLiveness:
    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        node_id: str,
        session_timeout_s: float,
        sessions: SessionSource,
        store: LivenessStore,
    ) -> None:
        self._node_id = node_id
        self._interval_s = session_timeout_s / REFRESHES_PER_TIMEOUT
        self._sessions = sessions
        self._store = store
        self._reported: set[str] = set()
        self._wake = asyncio.Event()
        self._stats: dict[str, int] = {"reports": 0, "store_errors": 0}

    def sessions_changed(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.report_once()
            except StoreUnavailable as exc:
                # Missing one refresh is harmless: rows stay valid for the whole timeout.
                self._stats["store_errors"] += 1
                log.warning("could not record worker sessions", extra={"error": str(exc)})
            await wait_event(self._wake, self._interval_s)

    async def report_once(self) -> None:
        reports = self._sessions.reports()
        live = {r.worker_id for r in reports}
        # Sessions closed since the last report are written once more, as closed: "last
        # seen" is then their close (or just after), not up to an interval before it.
        await self._store.touch_worker_sessions(
            self._node_id, reports, closed=self._reported - live
        )
        self._reported = live
        self._stats["reports"] += 1

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
