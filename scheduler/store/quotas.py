"""Tenant quotas in PostgreSQL: the cluster-wide check of the dispatch rounds.

A tenant's dispatch rate and concurrency hold for the whole cluster
(docs/operations.md#tenants-and-quotas, docs/architecture.md "cluster-wide tenant
quotas"). :meth:`DispatchQuotaStore.read` and :meth:`PendingQuotas.admit` run inside the
transaction that writes a round's intents (``RunStore.write_intents``), before they are
written (``sql/quotas.sql``). A round *checks* a tenant:

1. it locks the tenant exclusively (a transaction-scoped advisory lock, all of a round's
   in one order), so the checks of one tenant take turns across all nodes;
2. in a statement of its own (a fresh snapshot, which sees what the previous lock holder
   committed), it reads each tenant's limits, its bucket as refilled by PostgreSQL's
   clock, its attempts in flight (the tenant's DISPATCHED and RUNNING rows) and what the
   other nodes' allowances may still start;
3. :func:`~chronoshard.scheduler.core.quotas.admit` decides how many of the tenant's
   chosen tasks may go, :func:`~chronoshard.scheduler.core.quotas.allowance` what this
   node may dispatch next without checking, and the buckets drawn from and the
   allowance are stored.

A round whose tenant this node's allowance covers does not check it: it spends the
allowance (:class:`~chronoshard.scheduler.core.quotas.Allowances`), locks the tenant
shared (so a check elsewhere waits for it, and it for a check) and reads back that the
allowance is still this node's current grant and unexpired; if not, its tasks are not
written this round and the next round checks. A tenant's rounds under allowances, on
every node, go on at once: only checks take turns.

Counting rows instead of keeping a counter is what makes concurrency survive a crash:
a dead node's attempts stay DISPATCHED/RUNNING, and count, until they settle or the
reconciler repairs their expired lease; its allowance counts until it expires; nothing is
released when a stream closes, and no counter can leak. The limits are read at every
check, so a change applies at the next one (a node that hears of it gives its allowance
up). A round that refuses some of a tenant's tasks records when and by which quota in the
bucket row; :meth:`DispatchQuotaStore.held_by` answers GetTask's waiting reason from it
and from the same counts, outside any round.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import psycopg
from psycopg.rows import dict_row

from chronoshard.scheduler.core.quotas import (
    ALLOWANCE_S,
    TOKEN_EPS,
    Admission,
    Allowances,
    HeldBy,
    admit,
    allowance,
    refilled,
)
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection, Store

_SQL = "quotas.sql"
HELD_RECENTLY_S = 2.0
"""A tenant counts as held by a quota (GetTask's waiting reason) for this long after a
round found it so: its limit is reached again and again while it is at it, and a node
that believes it at its concurrency asks once a second (the dispatcher's probes)."""


class DispatchQuotaStore:
    """The quota statements of a node's dispatch rounds, the allowances the node holds,
    and the waiting-reason read. ``node_id`` names the node's allowances (its rows of
    ``tenant_dispatch_allowances``); ``monotonic`` is the clock their local expiry is
    kept on.

    Its counters (``chronoshard_dispatch_quotas_*``): tenants ``checked`` in a round and
    those dispatched ``under_allowance``, allowances ``granted``, and rounds' allowances
    ``refused`` at the read-back (expired or replaced: that round writes nothing for the
    tenant); ``allowances_held`` is a level."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset({"allowances_held"})

    def __init__(
        self,
        store: Store,
        node_id: str = "",
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._monotonic = monotonic
        self._q = queries.load(_SQL)
        # Tenants whose bucket row is known to exist: only a first round creates one.
        self._known: set[uuid.UUID] = set()
        self.allowances = Allowances()
        self._stats = {"checked": 0, "under_allowance": 0, "granted": 0, "refused": 0}

    def get_stats(self) -> dict[str, int]:
        return {**self._stats, "allowances_held": len(self.allowances)}

    def _count(self, key: str, n: int = 1) -> None:
        self._stats[key] += n

    async def read(self, conn: Connection, wanted: Mapping[uuid.UUID, int]) -> PendingQuotas:
        """Lock and read the quota rows of a round's tenants in ``conn``'s transaction
        (in a pipelined one: queued, so they share a round trip with what else is queued
        before the answer is read); :meth:`PendingQuotas.admit` decides. ``wanted`` is the
        round's tasks per tenant, counted before its shards were fenced (it may hold more
        than are finally written).

        A tenant whose allowance covers its tasks is not checked: it is only locked
        shared (rounds of every node under allowances go on at once; a check waits for
        them, and they for it) and its allowance read back, to be sure it is still this
        node's current one and unexpired. Every other tenant is checked: locked
        exclusively, then its limits, bucket, attempts in flight and the other nodes'
        allowances read by a statement of its own (a fresh snapshot, which sees what the
        rounds it waited for committed). The locks are advisory ones of the transaction
        (migration 0017)."""
        now = self._monotonic()
        allowed: dict[uuid.UUID, uuid.UUID] = {}
        for tenant_id, count in wanted.items():
            grant_id = self.allowances.take(tenant_id, count, now)
            if grant_id is not None:
                allowed[tenant_id] = grant_id
        checked = sorted(t for t in wanted if t not in allowed)
        if not wanted:
            return PendingQuotas(self, now, checked, {}, None, None)
        new = [t for t in checked if t not in self._known]
        if new:
            await conn.execute(self._q["create_dispatch_buckets"], {"tenant_ids": new})
        await conn.execute(
            self._q["lock_dispatch_quotas"], {"checked": checked, "allowed": sorted(allowed)}
        )
        valid = None
        if allowed:
            valid = await conn.execute(
                self._q["allowances_valid"],
                {
                    "node_id": self._node_id,
                    "tenant_ids": list(allowed),
                    "grant_ids": list(allowed.values()),
                },
            )
        rows = None
        if checked:
            rows = conn.cursor(row_factory=dict_row)
            await rows.execute(
                self._q["dispatch_quotas"], {"tenant_ids": checked, "node_id": self._node_id}
            )
        return PendingQuotas(self, now, checked, allowed, valid, rows)

    def _saw(self, asked: Sequence[uuid.UUID], found: Iterable[uuid.UUID]) -> None:
        # A bucket created by a transaction that then rolled back is gone: created again
        # next round (this one leaves the tenant's tasks unwritten).
        self._known.difference_update(asked)
        self._known.update(found)

    async def _store_drawn(
        self, conn: Connection, drawn: Sequence[_Drawn], granted: Sequence[_Granted]
    ) -> None:
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
        if granted:
            await conn.execute(
                self._q["store_allowances"],
                {
                    "node_id": self._node_id,
                    "tenant_ids": [g.tenant_id for g in granted],
                    "grant_ids": [g.grant_id for g in granted],
                    "attempts": [g.attempts for g in granted],
                    "valid_s": ALLOWANCE_S,
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


@dataclass(frozen=True)
class _Granted:
    """A node's new allowance for a tenant (0 attempts: the old one given up)."""

    tenant_id: uuid.UUID
    grant_id: uuid.UUID
    attempts: int


@dataclass(frozen=True)
class RoundQuotas:
    """What a round's quota check decided."""

    admitted: dict[uuid.UUID, int]
    """How many of each tenant's tasks the round may write (a tenant left out: none)."""
    checked: dict[uuid.UUID, Admission]
    """The tenants checked in full, each with what the check found (the tenants
    dispatched under an allowance are not among them)."""


ALLOWANCE_MARGIN_S = 0.1
"""The node stops spending an allowance this long before the database's expiry would
refuse it (their clocks run from different instants of its granting)."""


class PendingQuotas:
    """The quota rows of a round's tenants, locked and read (:meth:`DispatchQuotaStore.read`)."""

    def __init__(
        self,
        quotas: DispatchQuotaStore,
        read_at: float,
        checked: Sequence[uuid.UUID],
        allowed: Mapping[uuid.UUID, uuid.UUID],
        valid: psycopg.AsyncCursor[Any] | None,
        rows: psycopg.AsyncCursor[dict[str, Any]] | None,
    ) -> None:
        self._quotas = quotas
        self._read_at = read_at
        self._checked = checked
        self._allowed = allowed
        self._valid = valid
        self._rows = rows

    async def admit(self, wanted: Mapping[uuid.UUID, int]) -> RoundQuotas:
        """How many of ``wanted`` (the round's tasks per tenant, of the shards the fence
        kept) each tenant may have written; the buckets drawn from and the allowances
        granted are stored (queued) in the same transaction."""
        book = self._quotas.allowances
        admitted: dict[uuid.UUID, int] = {}
        if self._valid is not None:
            still = {row[0] for row in await self._valid.fetchall()}
            for tenant_id, grant_id in self._allowed.items():
                if tenant_id in still:
                    admitted[tenant_id] = wanted.get(tenant_id, 0)
                    self._quotas._count("under_allowance")
                else:
                    # Expired, or replaced by a newer grant: checked next round.
                    book.drop(tenant_id, grant_id)
                    self._quotas._count("refused")
        checked: dict[uuid.UUID, Admission] = {}
        if self._rows is None:
            return RoundQuotas(admitted, checked)
        conn = self._rows.connection
        rows = await self._rows.fetchall()
        self._quotas._saw(self._checked, (row["tenant_id"] for row in rows))
        drawn: list[_Drawn] = []
        granted: list[_Granted] = []
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
                reserved=row["reserved"],
            )
            checked[tenant_id] = answer
            admitted[tenant_id] = answer.admitted
            self._quotas._count("checked")
            extra = allowance(
                answer,
                max_concurrent=row["max_concurrent_workers"],
                reserved=row["reserved"],
                nodes=max(1, row["nodes"]),
            )
            if extra or book.holds(tenant_id):
                grant_id = uuid.uuid4()
                granted.append(_Granted(tenant_id, grant_id, extra))
                if extra:
                    until = self._read_at + ALLOWANCE_S - ALLOWANCE_MARGIN_S
                    book.give(tenant_id, grant_id, extra, until)
                    self._quotas._count("granted")
                else:
                    book.drop(tenant_id)
            if answer.admitted:
                drawn.append(
                    _Drawn(tenant_id, answer.tokens - extra, row["now"], answer.held_by, row["now"])
                )
            elif answer.held_by is not None:
                # Nothing drawn: the stored tokens as of the old instant still say the
                # same (refilling them from it gives what this round saw).
                drawn.append(
                    _Drawn(tenant_id, row["tokens"], row["refilled_at"], answer.held_by, row["now"])
                )
        await self._quotas._store_drawn(conn, drawn, granted)
        return RoundQuotas(admitted, checked)
