"""TenantLimitsCache: the limits a refresh read, and who hears that they changed (the
dispatcher's ready queues, which otherwise keep a tenant parked under its old limits)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from chronoshard.scheduler.core.fairness import UNLIMITED, TenantLimits
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.dispatch.tenant_limits import TenantLimitsCache

A, B, C = (uuid.UUID(int=i) for i in (1, 2, 3))


def _tenant(tenant_id: uuid.UUID, rps: float, workers: int) -> Tenant:
    return Tenant(
        id=tenant_id,
        name=str(tenant_id),
        tier="standard",
        rate_limit_rps=rps,
        max_concurrent_workers=workers,
        home_region="local",
        api_key_hash="h",
        created_at=datetime(2026, 12, 2, tzinfo=UTC),
    )


async def test_a_refresh_tells_which_tenants_limits_changed() -> None:
    listed: list[Sequence[Tenant]] = [[_tenant(A, 1.0, 5), _tenant(B, 2.0, 5)]]

    async def list_tenants() -> Sequence[Tenant]:
        return listed[-1]

    cache = TenantLimitsCache(list_tenants)
    changed: list[uuid.UUID] = []
    cache.on_changed = changed.append
    await cache.refresh()
    assert sorted(changed) == [A, B]  # new tenants: their limits changed from unlimited
    assert cache(A) == TenantLimits(max_concurrent=5, rate_limit_rps=1.0)
    assert cache(C) is UNLIMITED

    changed.clear()
    listed.append([_tenant(A, 50.0, 5), _tenant(B, 2.0, 5), _tenant(C, 3.0, 1)])
    await cache.refresh()
    assert sorted(changed) == [A, C]  # B's limits are as they were
    assert cache(A).rate_limit_rps == 50.0

    changed.clear()
    listed.append([_tenant(B, 2.0, 5), _tenant(C, 3.0, 1)])
    await cache.refresh()
    assert changed == [A]  # gone: unlimited again
    assert cache(A) is UNLIMITED
