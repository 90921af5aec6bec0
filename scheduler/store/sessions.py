"""The worker-sessions record: which workers have a session with which node.

A small class over the :class:`~.database.Store`'s pool, with its statements in
``sql/sessions.sql``. The node's liveness loop (:mod:`chronoshard.scheduler.cluster.liveness`)
writes its sessions here; a node warming up shards for a planned handoff reads which
workers the other nodes have (:mod:`chronoshard.scheduler.core.handoff`); partition
maintenance forgets the rows nobody refreshed. Nothing here decides whether a task may
run again (leases and the workers' self-fencing do).
"""

from __future__ import annotations

from collections.abc import Collection

from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Store


class WorkerSessionStore:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load("sessions.sql")

    async def touch_worker_sessions(
        self, node_id: str, worker_ids: Collection[str], closed: Collection[str] = ()
    ) -> None:
        """``node_id`` has a session of each of ``worker_ids``, and just had one of each
        of ``closed`` (now closed)."""
        seen = sorted({*worker_ids, *closed})
        if not seen:
            return
        ended = set(closed) - set(worker_ids)
        async with self._store.connection() as conn:
            await conn.execute(
                self._q["touch_worker_sessions"],
                {"node_id": node_id, "worker_ids": seen, "closed": [w in ended for w in seen]},
            )

    async def workers_seen(self, node_ids: Collection[str], within_s: float) -> set[str]:
        """Workers that had a session on one of ``node_ids`` within the last ``within_s``."""
        if not node_ids:
            return set()
        async with self._store.connection() as conn:
            cur = await conn.execute(
                self._q["workers_seen"], {"node_ids": sorted(node_ids), "within_s": within_s}
            )
            return {row[0] for row in await cur.fetchall()}

    async def forget_old_worker_sessions(self, older_than_s: float) -> int:
        """Delete the rows not refreshed for ``older_than_s``; how many there were."""
        async with self._store.connection() as conn:
            cur = await conn.execute(
                self._q["forget_old_worker_sessions"], {"older_than_s": older_than_s}
            )
            return cur.rowcount
