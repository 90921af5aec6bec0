"""Operator-side tenant management (``chronoshard tenants ...``, the dev launcher).

Runs against the database directly, like ``chronoshard migrate``: creating a tenant is
an operator's act, not a tenant's API call. The API key is returned once, in clear, and
only its hash is stored (docs/architecture.md#d11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg.rows import dict_row

from chronoshard.scheduler.core.api_keys import hash_api_key, new_api_key
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.errors import InvalidArgument, StoreUnavailable
from chronoshard.scheduler.store import queries

DEFAULT_TIER = "standard"
DEFAULT_RATE_LIMIT_RPS = 10_000.0
DEFAULT_MAX_CONCURRENT = 10_000
DEFAULT_REGION = "local"


@dataclass(frozen=True)
class NewTenant:
    tenant: Tenant
    api_key: str


def create_tenant(
    dsn: str,
    name: str,
    *,
    tier: str = DEFAULT_TIER,
    rate_limit_rps: float = DEFAULT_RATE_LIMIT_RPS,
    max_concurrent_workers: int = DEFAULT_MAX_CONCURRENT,
    home_region: str = DEFAULT_REGION,
    if_exists: Literal["fail", "rotate"] = "fail",
    operator: bool | None = None,
) -> NewTenant:
    """Create tenant ``name`` with a fresh API key (or, with ``if_exists="rotate"``, give
    an existing one a new key). ``operator`` sets whether the key may call operator-only
    admin operations (``AdminService.DrainNode``); None leaves an existing tenant's flag
    as it is (a new tenant is not an operator).

    Raises:
        InvalidArgument: a field is invalid, or the name is taken and ``if_exists="fail"``.
        StoreUnavailable: PostgreSQL cannot be reached.
    """
    if not name.strip() or len(name) > 200:
        raise InvalidArgument("name", "must be 1-200 characters")
    if not rate_limit_rps > 0:
        raise InvalidArgument("rate_limit_rps", "must be positive")
    if max_concurrent_workers < 1:
        raise InvalidArgument("max_concurrent_workers", "must be at least 1")
    api_key = new_api_key()
    q = queries.load("database.sql")
    params = {
        "name": name,
        "tier": tier,
        "rate_limit_rps": rate_limit_rps,
        "max_concurrent_workers": max_concurrent_workers,
        "home_region": home_region,
        "api_key_hash": hash_api_key(api_key),
    }
    try:
        # One transaction: a tenant is never left half made (a new key, not the flag).
        with (
            psycopg.connect(dsn, autocommit=True) as conn,
            conn.transaction(),
            conn.cursor(row_factory=dict_row) as cur,
        ):
            row = None
            if if_exists == "rotate":
                cur.execute(q["rotate_tenant_key"], params)
                row = cur.fetchone()
            if row is None:
                try:
                    cur.execute(q["insert_tenant"], params)
                except psycopg.errors.UniqueViolation as exc:
                    raise InvalidArgument(
                        "name", f"a tenant named {name!r} already exists"
                    ) from exc
                row = cur.fetchone()
            assert row is not None
            if operator is not None and operator != row["operator"]:
                flag = {"tenant_id": row["id"], "operator": operator}
                cur.execute(q["set_tenant_operator"], flag)
                row = cur.fetchone()
                assert row is not None
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot reach PostgreSQL: {exc}") from exc
    return NewTenant(Tenant(**row), api_key)


def list_tenants(dsn: str) -> list[Tenant]:
    q = queries.load("database.sql")
    try:
        with psycopg.connect(dsn) as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q["list_tenants"])
            return [Tenant(**row) for row in cur.fetchall()]
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot reach PostgreSQL: {exc}") from exc
