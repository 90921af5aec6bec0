"""The worker-sessions record: which workers have a session with which node, and what
each session is.

A small class over the :class:`~.database.Store`'s pool, with its statements in
``sql/sessions.sql``. The node's liveness loop (:mod:`chronoshard.scheduler.cluster.liveness`)
writes its sessions here; a node warming up shards for a planned handoff reads which
workers the other nodes have (:mod:`chronoshard.scheduler.core.handoff`);
``AdminService.ListWorkerSessions`` lists them (a tenant's as that tenant, under
row-level security; every tenant's, for an operator, as the node's role); partition
maintenance forgets the rows nobody refreshed. Nothing here decides whether a task may
run again (leases and the workers' self-fencing do).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from chronoshard.scheduler.core.worker_sessions import ListedSession, SessionQuery, SessionReport
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Store


class WorkerSessionStore:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load("sessions.sql")

    async def touch_worker_sessions(
        self, node_id: str, live: Collection[SessionReport], closed: Collection[str] = ()
    ) -> None:
        """``node_id`` has the sessions ``live``, and just had one of each worker of
        ``closed`` (now closed; a worker that also has a live one is live)."""
        ended = sorted(set(closed) - {r.worker_id for r in live})
        if not live and not ended:
            return
        async with self._store.connection() as conn:
            if live:
                rows = [_report_row(r) for r in live]
                await conn.execute(
                    self._q["touch_worker_sessions"],
                    {"node_id": node_id, "sessions": json.dumps(rows)},
                )
            if ended:
                await conn.execute(
                    self._q["close_worker_sessions"], {"node_id": node_id, "worker_ids": ended}
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

    async def list_worker_sessions(
        self, query: SessionQuery, within_s: float
    ) -> tuple[list[ListedSession], bool]:
        """A page of the open sessions refreshed within ``within_s`` that ``query`` asks
        for, and whether more follow. A tenant's are read as that tenant (its
        ``tenant_transaction``), every tenant's as the node's own role."""
        params = {
            "within_s": within_s,
            "tenant_id": query.tenant_id,
            "worker_id": query.worker_id,
            "node_id": query.node_id,
            "after_worker_id": query.after[0] if query.after else None,
            "after_node_id": query.after[1] if query.after else None,
            "limit": query.limit + 1,
        }
        names: dict[uuid.UUID, str] = {}
        if query.tenant_id is not None:
            async with (
                self._store.tenant_transaction(query.tenant_id) as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                await cur.execute(self._q["list_worker_sessions"], params)
                rows = await cur.fetchall()
        else:
            async with self._store.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(self._q["list_worker_sessions"], params)
                rows = await cur.fetchall()
                owners = sorted({row["tenant_id"] for row in rows if row["tenant_id"]})
                if owners:
                    await cur.execute(self._q["tenant_names"], {"tenant_ids": owners})
                    names = {row["id"]: row["name"] for row in await cur.fetchall()}
        listed = [_listed(row, names) for row in rows[: query.limit]]
        return listed, len(rows) > query.limit


def _report_row(report: SessionReport) -> dict[str, Any]:
    """A live session as one object of ``touch_worker_sessions``'s JSON array."""
    return {
        "worker_id": report.worker_id,
        "session_id": report.session_id,
        "tenant_id": None if report.tenant_id is None else str(report.tenant_id),
        "queues": list(report.queues),
        "task_types": list(report.task_types),
        "slots": report.slots,
        "credits": report.credits,
        "running": report.running,
        "draining": report.draining,
        "connected_at": None if report.connected_at is None else report.connected_at.isoformat(),
    }


def _listed(row: Mapping[str, Any], names: Mapping[uuid.UUID, str]) -> ListedSession:
    """A row of ``list_worker_sessions``; a column an older node left NULL reads empty."""
    tenant_id: uuid.UUID | None = row["tenant_id"]
    reported_at: datetime = row["last_seen_at"]
    return ListedSession(
        node_id=row["node_id"],
        report=SessionReport(
            worker_id=row["worker_id"],
            session_id=row["session_id"] or "",
            tenant_id=tenant_id,
            queues=tuple(row["queues"] or ()),
            task_types=tuple(row["task_types"] or ()),
            slots=row["slots"] or 0,
            credits=row["credits"] or 0,
            running=row["running"] or 0,
            draining=bool(row["draining"]),
            connected_at=row["connected_at"],
        ),
        tenant_name=names.get(tenant_id, "") if tenant_id is not None else "",
        reported_at=reported_at,
    )
