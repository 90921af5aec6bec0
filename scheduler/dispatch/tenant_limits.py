"""Each tenant's fairness limits, as the dispatcher's ready queues ask for them.

The ready queues call the cache once per candidate on the hot path, so it answers from
memory; :meth:`TenantLimitsCache.run` re-reads the tenants table every
``TENANT_REFRESH_S``. A tenant the cache has not seen yet (created since the last
refresh) is unlimited until the next one: limits are a fairness policy, not an admission
control, so a few seconds of slack cost nothing that a refused dispatch would not.
A refresh that finds a tenant's limits changed tells ``on_changed`` (the dispatcher's
ready queues look at that tenant's parked tasks again: a raised rate limit would
otherwise wait for the token time computed under the old one).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar

from chronoshard.scheduler.core.fairness import UNLIMITED, TenantLimits
from chronoshard.scheduler.core.models import Tenant

log = logging.getLogger(__name__)

TENANT_REFRESH_S = 10.0


class TenantLimitsCache:
    """Per-tenant fairness limits, refreshed from the tenants table every few seconds."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, list_tenants: Callable[[], Awaitable[Sequence[Tenant]]]) -> None:
        self._list_tenants = list_tenants
        self._limits: dict[uuid.UUID, TenantLimits] = {}
        self._stats = {"refreshes": 0, "refresh_failures": 0}
        self.on_changed: Callable[[uuid.UUID], None] | None = None

    def __call__(self, tenant_id: uuid.UUID) -> TenantLimits:
        return self._limits.get(tenant_id, UNLIMITED)

    async def refresh(self) -> None:
        tenants = await self._list_tenants()
        before = self._limits
        self._limits = {
            t.id: TenantLimits(
                max_concurrent=t.max_concurrent_workers, rate_limit_rps=t.rate_limit_rps
            )
            for t in tenants
        }
        self._stats["refreshes"] += 1
        if self.on_changed is not None:
            for tenant_id in before.keys() | self._limits.keys():
                if before.get(tenant_id, UNLIMITED) != self._limits.get(tenant_id, UNLIMITED):
                    self.on_changed(tenant_id)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TENANT_REFRESH_S)
            try:
                await self.refresh()
            except Exception as exc:  # a failed refresh keeps the previous limits
                self._stats["refresh_failures"] += 1
                log.warning("tenant refresh failed", extra={"error": str(exc)})

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)
