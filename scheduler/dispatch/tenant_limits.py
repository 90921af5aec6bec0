"""Each tenant's quotas, as the dispatcher's ready queues and the submit path ask for them.

The ready queues call the cache once per candidate on the hot path, so it answers from
memory; :meth:`TenantLimitsCache.run` re-reads the tenants table every
``TENANT_REFRESH_S``, and at once when told a tenant changed
(:meth:`TenantLimitsCache.refresh_soon`: ``chronoshard tenants update`` signals every
node through PostgreSQL NOTIFY, ``cluster/signals.py``), so a changed quota reaches every
node within a second; a lost signal costs at most one refresh interval.

What this cache holds is not what enforces the dispatch quotas for the cluster: every
dispatch round checks them in PostgreSQL, with the limits as they are there
(``store/quotas.py``). The ready queues use the cached numbers to hold a tenant before
its tasks reach that check, so a stale entry costs rounds the database refuses (limits
lowered) or a tenant held below its new limits until the next refresh (raised), never a
quota exceeded. A tenant the cache has not seen yet (created since the last refresh) is
unlimited here until then. The submit rate, enforced by each node for itself, is read
from here only.

A refresh that finds a tenant's dispatch limits changed tells ``on_changed`` (the
dispatcher's ready queues look at that tenant's parked tasks again: a raised rate limit
would otherwise wait for the token time computed under the old one).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar

from chronoshard.events import wait_event
from chronoshard.scheduler.core.fairness import UNLIMITED, TenantLimits
from chronoshard.scheduler.core.models import Tenant

log = logging.getLogger(__name__)

TENANT_REFRESH_S = 10.0


class TenantLimitsCache:
    """Per-tenant quotas, refreshed from the tenants table every few seconds."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, list_tenants: Callable[[], Awaitable[Sequence[Tenant]]]) -> None:
        self._list_tenants = list_tenants
        self._limits: dict[uuid.UUID, TenantLimits] = {}
        self._submit_rates: dict[uuid.UUID, float] = {}
        self._soon = asyncio.Event()
        self._stats = {"refreshes": 0, "refresh_failures": 0, "refreshes_signalled": 0}
        self.on_changed: Callable[[uuid.UUID], None] | None = None

    def __call__(self, tenant_id: uuid.UUID) -> TenantLimits:
        return self._limits.get(tenant_id, UNLIMITED)

    def submit_rate(self, tenant_id: uuid.UUID) -> float | None:
        """Submits per second the tenant may make, cluster-wide; None: no limit."""
        return self._submit_rates.get(tenant_id)

    def refresh_soon(self) -> None:
        """A tenant's quotas changed (a signal from another process): refresh now."""
        self._stats["refreshes_signalled"] += 1
        self._soon.set()

    async def refresh(self) -> None:
        tenants = await self._list_tenants()
        before = self._limits
        self._limits = {
            t.id: TenantLimits(
                max_concurrent=t.max_concurrent_workers, rate_limit_rps=t.rate_limit_rps
            )
            for t in tenants
        }
        self._submit_rates = {
            t.id: t.submit_rate_limit_rps for t in tenants if t.submit_rate_limit_rps is not None
        }
        self._stats["refreshes"] += 1
        if self.on_changed is not None:
            for tenant_id in before.keys() | self._limits.keys():
                if before.get(tenant_id, UNLIMITED) != self._limits.get(tenant_id, UNLIMITED):
                    self.on_changed(tenant_id)

    async def run(self) -> None:
        while True:
            await wait_event(self._soon, TENANT_REFRESH_S)
            self._soon.clear()
            try:
                await self.refresh()
            except Exception as exc:  # a failed refresh keeps the previous limits
                self._stats["refresh_failures"] += 1
                log.warning("tenant refresh failed", extra={"error": str(exc)})

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
