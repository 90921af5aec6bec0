"""Tenant quotas in PostgreSQL: the cluster-wide check of every dispatch round.

A tenant's dispatch rate and concurrency hold for the whole cluster
(docs/operations.md#tenants-and-quotas, docs/architecture.md "cluster-wide tenant
quotas"). :meth:`DispatchQuotaStore.admit` runs inside the transaction that writes a
round's intents (``RunStore.write_intents``), before they are written (``sql/quotas.sql``):

1. it locks the bucket row (``tenant_dispatch_buckets``) of every tenant in the round, in
   tenant order, so the rounds of one tenant take turns across all nodes;
2. in a statement of its own (a fresh snapshot, which sees what the previous lock holder
   committed), it reads each tenant's limits, its bucket as refilled by PostgreSQL's
   clock, and its attempts in flight: the tenant's DISPATCHED and RUNNING rows;
3. :func:`~chronoshard.scheduler.core.quotas.admit` decides how many of the tenant's
   chosen tasks may go, and the buckets that gave tokens are stored.

Counting rows instead of keeping a counter is what makes concurrency survive a crash:
a dead node's attempts stay DISPATCHED/RUNNING, and count, until they settle or the
reconciler repairs their expired lease; nothing is released when a stream closes, and no
counter can leak. The limits are read in the same statement, so a change applies at the
next round. A round that refuses some of a tenant's tasks records when and by which quota
in the same row; :meth:`DispatchQuotaStore.held_by` answers GetTask's waiting reason from
it and from the same counts, outside any round.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from chronoshard.scheduler.core.quotas import TOKEN_EPS, Admission, HeldBy, admit, refilled
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection, Store

_SQL = "quotas.sql"
HELD_RECENTLY_S = 2.0
"""A tenant counts as held by a quota (GetTask's waiting reason) for this long after a
round found it so: its limit is reached again and again while it is at it, and a node
that believes it at its concurrency asks once a second (the dispatcher's probes)."""


class DispatchQuotaStore:
    """The quota statements of a node's dispatch rounds, and the waiting-reason read."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load(_SQL)
        # Tenants whose bucket row is known to exist: only a first round creates one.
        self._known: set[uuid.UUID] = set()

    async def admit(
        self, conn: Connection, wanted: Mapping[uuid.UUID, int]
    ) -> dict[uuid.UUID, Admission]:
        """How many of ``wanted`` (tasks chosen per tenant) the round may write, per
        tenant, in ``conn``'s transaction; the buckets are drawn from as decided, and the
        rows stay locked until that transaction ends. A tenant that no longer exists is
        left out of the answer (its tasks are not written)."""
        return await (await self.read(conn, wanted)).admit(wanted)

    async def read(self, conn: Connection, tenant_ids: Iterable[uuid.UUID]) -> PendingQuotas:
        """:meth:`admit` in two steps: the tenants' bucket rows are locked and read now (in
        a pipelined transaction: queued, so they share a round trip with what else is
        queued before the answer is read), the decision is taken by
        :meth:`PendingQuotas.admit`. ``tenant_ids`` may hold more tenants than are
        finally wanted (the round's shards not yet fenced): a tenant wanted for none is
        locked and left as it was."""
        ids = sorted(set(tenant_ids))
        if not ids:
            return PendingQuotas(self, None, [])
        new = [t for t in ids if t not in self._known]
        if new:
            await conn.execute(self._q["create_dispatch_buckets"], {"tenant_ids": new})
        await conn.execute(self._q["lock_dispatch_buckets"], {"tenant_ids": ids})
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(self._q["dispatch_quotas"], {"tenant_ids": ids})
        return PendingQuotas(self, cur, ids)

    def _saw(self, asked: Sequence[uuid.UUID], found: Iterable[uuid.UUID]) -> None:
        # A bucket created by a transaction that then rolled back is gone: created again
        # next round (this one leaves the tenant's tasks unwritten).
        self._known.difference_update(asked)
        self._known.update(found)

    async def _store_drawn(self, conn: Connection, drawn: Sequence[_Drawn]) -> None:
        if drawn:
            await conn.execute(
                self._q["store_dispatch_buckets"],
                {
                    "tenant_ids": [d.tenant_id for d in drawn],
                    "tokens": [d.tokens for d in drawn],
                    "refilled_ats": [d.refilled_at for d in drawn],
                    "held_bys": [None if d.held_by is None else str(d.held_by) for d in drawn],
                    "held_ats": [d.now for d in drawn],
                },
            )

    async def held_by(self, tenant_id: uuid.UUID) -> HeldBy | None:
        """Which dispatch quota holds the tenant (GetTask's waiting reason): its
        concurrency is full, or a round refused it for that within ``HELD_RECENTLY_S``;
        its bucket is short of a whole token, or a round emptied it or was refused for
        its rate within ``HELD_RECENTLY_S``. None: neither."""
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["tenant_quota_now"], {"tenant_id": tenant_id})
            row = await cur.fetchone()
        if row is None:
            return None
        recent = row["held_s_ago"] is not None and row["held_s_ago"] < HELD_RECENTLY_S
        if row["in_flight"] >= row["max_concurrent_workers"] or (
            recent and row["held_by"] == HeldBy.CONCURRENCY
        ):
            return HeldBy.CONCURRENCY
        if row["tokens"] is None:
            return None  # never dispatched: its bucket is full
        tokens = refilled(row["tokens"], row["rate_limit_rps"], row["elapsed_s"])
        emptied = row["tokens"] < 1.0 - TOKEN_EPS and row["elapsed_s"] < HELD_RECENTLY_S
        if tokens < 1.0 - TOKEN_EPS or emptied or (recent and row["held_by"] == HeldBy.RATE):
            return HeldBy.RATE
        return None


@dataclass(frozen=True)
class _Drawn:
    """A bucket as a round leaves it: its tokens as of ``refilled_at``, and the quota
    that refused some of its tasks (None: none) at ``now``."""

    tenant_id: uuid.UUID
    tokens: float
    refilled_at: datetime
    held_by: HeldBy | None
    now: datetime


class PendingQuotas:
    """The quota rows of a round's tenants, locked and read (:meth:`DispatchQuotaStore.read`)."""

    def __init__(
        self,
        quotas: DispatchQuotaStore,
        rows: psycopg.AsyncCursor[dict[str, Any]] | None,
        asked: Sequence[uuid.UUID],
    ) -> None:
        self._quotas = quotas
        self._rows = rows
        self._asked = asked

    async def admit(self, wanted: Mapping[uuid.UUID, int]) -> dict[uuid.UUID, Admission]:
        """How many of ``wanted`` each tenant's quotas admit (only tenants asked for in
        :meth:`DispatchQuotaStore.read`); the buckets drawn from are stored (queued) in
        the same transaction."""
        if self._rows is None:
            return {}
        conn = self._rows.connection
        rows = await self._rows.fetchall()
        self._quotas._saw(self._asked, (row["tenant_id"] for row in rows))
        answers: dict[uuid.UUID, Admission] = {}
        drawn: list[_Drawn] = []
        for row in rows:
            tenant_id = row["tenant_id"]
            count = wanted.get(tenant_id, 0)
            if count <= 0:
                continue  # locked for a shard the fence then refused: nothing to decide
            answer = admit(
                count,
                in_flight=row["in_flight"],
                max_concurrent=row["max_concurrent_workers"],
                tokens=row["tokens"],
                rate=row["rate_limit_rps"],
                elapsed_s=row["elapsed_s"],
            )
            answers[tenant_id] = answer
            if answer.admitted:
                drawn.append(
                    _Drawn(tenant_id, answer.tokens, row["now"], answer.held_by, row["now"])
                )
            elif answer.held_by is not None:
                # Nothing drawn: the stored tokens as of the old instant still say the
                # same (refilling them from it gives what this round saw).
                drawn.append(
                    _Drawn(tenant_id, row["tokens"], row["refilled_at"], answer.held_by, row["now"])
                )
        await self._quotas._store_drawn(conn, drawn)
        return answers
