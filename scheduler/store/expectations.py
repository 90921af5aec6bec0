"""The expectation registry's statements, for the ``WatchdogService`` servicer.

A small class over the :class:`~.database.Store`'s pool, with its statements in
``sql/expectations.sql``. Every statement names the caller's tenant, so another tenant's
expectation is simply not found, and runs as that tenant
(:meth:`Store.tenant_transaction`: row-level security admits its rows only).
Expectations the watchdog's config file defines sit in the same table with ``source =
'config'``: they are listed like the others, but a write or delete that meets one
changes nothing and raises :class:`~.errors.ExpectationManagedByConfig`, because the
watchdog would put it back.

The servicer (:mod:`chronoshard.scheduler.api.expectations`) validates the request
completely before it calls in here, and converts what comes back.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from chronoshard.scheduler.errors import ExpectationManagedByConfig, ExpectationNotFound
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Store


@dataclass(frozen=True, slots=True)
class ExpectationSpec:
    """A validated CreateExpectation request: what an API registration writes."""

    job_id: str
    interval_s: float
    tolerance_s: float
    severity: str
    enabled: bool
    description: str


@dataclass(frozen=True, slots=True)
class Expectation:
    """One expectation as stored."""

    job_id: str
    interval_s: float
    tolerance_s: float
    severity: str
    enabled: bool
    description: str
    created_at: datetime
    updated_at: datetime
    from_config: bool
    """Defined in the watchdog's config file: the API may read it, never change it."""


@dataclass(frozen=True, slots=True)
class ExpectationPage:
    expectations: list[Expectation]
    more: bool
    """Another page follows the last of ``expectations``."""


def _expectation(row: Mapping[str, Any]) -> Expectation:
    return Expectation(
        job_id=row["job_id"],
        interval_s=row["interval_s"],
        tolerance_s=row["tolerance_s"],
        severity=row["severity"],
        enabled=row["enabled"],
        description=row["description"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        from_config=row["source"] == "config",
    )


@dataclass(frozen=True)
class Incident:
    """One of the watchdog's alerts about a tenant's job (``alerts``); in an operator's
    listing of every tenant's, also whose (None and "": the cluster's own)."""

    id: int
    kind: str
    job_id: str | None
    severity: str
    summary: str
    opened_at: datetime
    resolved_at: datetime | None
    tenant_id: uuid.UUID | None = None
    tenant_name: str = ""


class ExpectationStore:
    """Register, list and delete expectations, for one tenant at a time."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load("expectations.sql")

    async def register(
        self, tenant_id: uuid.UUID, spec: ExpectationSpec
    ) -> tuple[Expectation, bool]:
        """Create the expectation, or replace the API-registered one of the same job
        (keeping its ``created_at``); the expectation as stored, and whether it is new.

        Raises:
            ExpectationManagedByConfig: the job's expectation comes from the config file.
            StoreUnavailable: PostgreSQL is away.
        """
        params = {
            "tenant_id": tenant_id,
            "job_id": spec.job_id,
            "interval_s": spec.interval_s,
            "tolerance_s": spec.tolerance_s,
            "severity": spec.severity,
            "enabled": spec.enabled,
            "description": spec.description,
        }
        async with (
            self._store.tenant_transaction(tenant_id) as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            await cur.execute(self._q["upsert_expectation"], params)
            row = await cur.fetchone()
        if row is None:
            raise ExpectationManagedByConfig(spec.job_id)
        return _expectation(row), row["created"]

    async def list_page(self, tenant_id: uuid.UUID, *, after: str, limit: int) -> ExpectationPage:
        """Up to ``limit`` of the tenant's expectations in ``job_id`` order, strictly
        after ``after`` (``""``: from the first).

        Raises:
            StoreUnavailable: PostgreSQL is away.
        """
        params = {"tenant_id": tenant_id, "after": after, "limit": limit + 1}
        async with (
            self._store.tenant_transaction(tenant_id) as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            await cur.execute(self._q["list_expectations"], params)
            rows = await cur.fetchall()
        # One row more than the page says whether another page exists.
        return ExpectationPage([_expectation(r) for r in rows[:limit]], more=len(rows) > limit)

    async def delete(self, tenant_id: uuid.UUID, job_id: str) -> Expectation:
        """Delete the API-registered expectation of ``job_id``; it as it was.

        Raises:
            ExpectationManagedByConfig: the job's expectation comes from the config file.
            ExpectationNotFound: the tenant has no expectation for ``job_id``.
            StoreUnavailable: PostgreSQL is away.
        """
        params = {"tenant_id": tenant_id, "job_id": job_id}
        async with (
            self._store.tenant_transaction(tenant_id) as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            await cur.execute(self._q["delete_expectation"], params)
            row = await cur.fetchone()
            if row is None:
                # Nothing deleted: say whether that is a config expectation or none.
                await cur.execute(self._q["get_expectation"], params)
                if await cur.fetchone() is not None:
                    raise ExpectationManagedByConfig(job_id)
                raise ExpectationNotFound(job_id)
        return _expectation(row)

    async def incidents(
        self,
        tenant_id: uuid.UUID,
        *,
        include_resolved: bool,
        resolved_within_s: float,
        limit: int,
    ) -> list[Incident]:
        """The tenant's incidents, newest first: open ones, and with ``include_resolved``
        those resolved within the last ``resolved_within_s``; at most ``limit``.

        Raises:
            StoreUnavailable: PostgreSQL is away.
        """
        params = {
            "tenant_id": tenant_id,
            "include_resolved": include_resolved,
            "resolved_within_s": resolved_within_s,
            "limit": limit,
        }
        async with (
            self._store.tenant_transaction(tenant_id) as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            await cur.execute(self._q["list_incidents"], params)
            rows = await cur.fetchall()
        return [Incident(**row) for row in rows]

    async def all_incidents(
        self, *, include_resolved: bool, resolved_within_s: float, limit: int
    ) -> list[Incident]:
        """Every tenant's incidents and the cluster's own, as :meth:`incidents` selects
        and orders them, each with its tenant (an operator's view: read as the node's
        role, which no tenant's row policy limits).

        Raises:
            StoreUnavailable: PostgreSQL is away.
        """
        params = {
            "include_resolved": include_resolved,
            "resolved_within_s": resolved_within_s,
            "limit": limit,
        }
        async with self._store.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._q["list_all_incidents"], params)
            rows = await cur.fetchall()
        return [Incident(**row) for row in rows]
