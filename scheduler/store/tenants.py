"""The tenants table, both of its sides: the operator's writes and the node's reads.

Every statement over ``tenants`` is here (``sql/tenants.sql``), whoever issues it,
because the two sides share one row shape:

* **The operator** (``chronoshard tenants ...``, the dev launcher, the test harness)
  creates tenants and rotates their keys with :func:`create_tenant`, changes their quotas
  with :func:`update_tenant` (the nodes hear of it at once: the same transaction sends the
  NOTIFY they listen for) and reads them with
  :func:`list_tenants`, synchronously over :mod:`.direct`'s one connection, like
  ``chronoshard migrate``: creating a tenant is an operator's act, not a tenant's API
  call. The API key is returned once, in clear, and only its hash is stored
  (docs/architecture.md#d11).
* **The node** reads tenants through :class:`TenantStore`, over the
  :class:`~.database.Store`'s pool like every other owner's class (``RunStore(store)``):
  the authenticator looks a key's hash up, the tenant limits cache lists them all. The
  node never writes a tenant (the test fixtures insert theirs with the operator's
  ``insert_tenant`` statement).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from chronoshard.scheduler.core.api_keys import hash_api_key, new_api_key
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.core.regions import DEFAULT_REGION, check_region_name
from chronoshard.scheduler.errors import InvalidArgument, StoreUnavailable, TenantNotFound
from chronoshard.scheduler.store import direct, queries
from chronoshard.scheduler.store.database import Store

DEFAULT_TIER = "standard"
DEFAULT_RATE_LIMIT_RPS = 10_000.0
DEFAULT_MAX_CONCURRENT = 10_000
MAX_NAME_CHARS = 200

_SQL = "tenants.sql"


def check_limits(
    rate_limit_rps: float | None,
    max_concurrent_workers: int | None,
    submit_rate_limit_rps: float | None = None,
) -> None:
    """A tenant's limits, as the operator may set them (None: not being set).

    Raises:
        InvalidArgument: a rate is not positive and finite, or fewer than one worker may
            run.
    """
    for field, rate in (
        ("rate_limit_rps", rate_limit_rps),
        ("submit_rate_limit_rps", submit_rate_limit_rps),
    ):
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise InvalidArgument(field, "must be positive")
    if max_concurrent_workers is not None and max_concurrent_workers < 1:
        raise InvalidArgument("max_concurrent_workers", "must be at least 1")


def check_operator_fields(name: str, rate_limit_rps: float, max_concurrent_workers: int) -> None:
    """What :func:`create_tenant` refuses before it connects.

    Raises:
        InvalidArgument: the name is blank or longer than MAX_NAME_CHARS, or a limit is
            out of range (:func:`check_limits`).
    """
    if not name.strip() or len(name) > MAX_NAME_CHARS:
        raise InvalidArgument("name", f"must be 1-{MAX_NAME_CHARS} characters")
    check_limits(rate_limit_rps, max_concurrent_workers)


def operator_flag_changes(wanted: bool | None, current: bool) -> bool:
    """Whether the operator flag is to be written: asked for (None leaves it) and not
    already so."""
    return wanted is not None and wanted != current


# ---- the operator's side (synchronous, direct) -------------------------------------------


@dataclass(frozen=True)
class NewTenant:
    tenant: Tenant
    api_key: str


def create_tenant(
    dsn: str,
    name: str,
    *,
    tier: str = DEFAULT_TIER,
    rate_limit_rps: float | None = None,
    max_concurrent_workers: int | None = None,
    submit_rate_limit_rps: float | None = None,
    home_region: str | None = None,
    if_exists: Literal["fail", "rotate"] = "fail",
    operator: bool | None = None,
) -> NewTenant:
    """Create tenant ``name`` with a fresh API key (or, with ``if_exists="rotate"``, give
    an existing one a new key). ``operator`` sets whether the key may call operator-only
    admin operations (``AdminService.DrainNode``); None leaves an existing tenant's flag
    as it is (a new tenant is not an operator). The limits and home region are the new
    tenant's (None: ``DEFAULT_RATE_LIMIT_RPS``, ``DEFAULT_MAX_CONCURRENT``, no submit
    limit, ``DEFAULT_REGION``); for a tenant that exists and is rotated, each one given is
    set as :func:`update_tenant` sets it, and the others are left as they are.

    Raises:
        InvalidArgument: a field is invalid, or the name is taken and ``if_exists="fail"``.
        StoreUnavailable: PostgreSQL cannot be reached.
    """
    check_operator_fields(
        name,
        DEFAULT_RATE_LIMIT_RPS if rate_limit_rps is None else rate_limit_rps,
        DEFAULT_MAX_CONCURRENT if max_concurrent_workers is None else max_concurrent_workers,
    )
    check_limits(None, None, submit_rate_limit_rps)
    if home_region is not None:
        check_region_name(home_region, "home_region")
    api_key = new_api_key()
    changes = (rate_limit_rps, max_concurrent_workers, submit_rate_limit_rps, home_region)
    params = {
        "name": name,
        "tier": tier,
        "rate_limit_rps": DEFAULT_RATE_LIMIT_RPS if rate_limit_rps is None else rate_limit_rps,
        "max_concurrent_workers": (
            DEFAULT_MAX_CONCURRENT if max_concurrent_workers is None else max_concurrent_workers
        ),
        "home_region": DEFAULT_REGION if home_region is None else home_region,
        "api_key_hash": hash_api_key(api_key),
    }
    try:
        # One transaction (the connection is autocommit, the block is not): a tenant is
        # never left half made (a new key, not the flag).
        with (
            direct.connect(dsn) as conn,
            conn.transaction(),
            conn.cursor(row_factory=dict_row) as cur,
        ):
            row = _rotated_or_inserted(cur, params, rotate=if_exists == "rotate")
            if any(value is not None for value in changes):
                # A new tenant got the dispatch limits from its insert; only the submit
                # rate is left. A rotated one gets what was given (it was silently
                # ignored before: `--rotate --rate-limit-rps` changed nothing).
                row = _updated(
                    cur,
                    name,
                    rate_limit_rps=rate_limit_rps,
                    max_concurrent_workers=max_concurrent_workers,
                    submit_rate_limit_rps=submit_rate_limit_rps,
                    clear_submit_rate=False,
                    home_region=home_region,
                )
            if operator_flag_changes(operator, row["operator"]):
                row = _one(
                    cur, "set_tenant_operator", {"tenant_id": row["id"], "operator": operator}
                )
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot reach PostgreSQL: {exc}") from exc
    return NewTenant(Tenant(**row), api_key)


def update_tenant(
    dsn: str,
    name: str,
    *,
    rate_limit_rps: float | None = None,
    max_concurrent_workers: int | None = None,
    submit_rate_limit_rps: float | None = None,
    clear_submit_rate: bool = False,
    home_region: str | None = None,
) -> Tenant:
    """Change tenant ``name``'s quotas (or its home region), live: each one given is set,
    the others stay; ``clear_submit_rate`` takes its submit limit away. Every node hears
    of it at once (PostgreSQL NOTIFY, sent with the commit;
    docs/operations.md#tenants-and-quotas), but a node's authentication cache may serve
    the old home region for up to 30 s.

    Raises:
        InvalidArgument: a limit is out of range, a region name is invalid, nothing is to
            change, or ``clear_submit_rate`` is given with a submit rate.
        TenantNotFound: no tenant is named ``name``.
        StoreUnavailable: PostgreSQL cannot be reached.
    """
    check_limits(rate_limit_rps, max_concurrent_workers, submit_rate_limit_rps)
    if home_region is not None:
        check_region_name(home_region, "home_region")
    if clear_submit_rate and submit_rate_limit_rps is not None:
        raise InvalidArgument("submit_rate_limit_rps", "cannot be both set and cleared")
    if not clear_submit_rate and all(
        value is None
        for value in (rate_limit_rps, max_concurrent_workers, submit_rate_limit_rps, home_region)
    ):
        raise InvalidArgument("limits", "name at least one limit (or the home region) to change")
    try:
        with (
            direct.connect(dsn) as conn,
            conn.transaction(),
            conn.cursor(row_factory=dict_row) as cur,
        ):
            row = _updated(
                cur,
                name,
                rate_limit_rps=rate_limit_rps,
                max_concurrent_workers=max_concurrent_workers,
                submit_rate_limit_rps=submit_rate_limit_rps,
                clear_submit_rate=clear_submit_rate,
                home_region=home_region,
            )
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot reach PostgreSQL: {exc}") from exc
    return Tenant(**row)


def _updated(
    cur: psycopg.Cursor[dict[str, Any]],
    name: str,
    *,
    rate_limit_rps: float | None,
    max_concurrent_workers: int | None,
    submit_rate_limit_rps: float | None,
    clear_submit_rate: bool,
    home_region: str | None = None,
) -> dict[str, Any]:
    """Tenant ``name``'s row with the limits given set, and the nodes told (the NOTIFY
    goes out when the transaction commits).

    Raises:
        TenantNotFound: no tenant is named ``name``.
    """
    q = queries.load(_SQL)
    cur.execute(
        q["update_tenant_limits"],
        {
            "name": name,
            "rate_limit_rps": rate_limit_rps,
            "max_concurrent_workers": max_concurrent_workers,
            "submit_rate_limit_rps": submit_rate_limit_rps,
            "clear_submit_rate": clear_submit_rate,
            "home_region": home_region,
        },
    )
    row = cur.fetchone()
    if row is None:
        raise TenantNotFound(name)
    cur.execute(q["notify_tenants_changed"])
    return row


def _rotated_or_inserted(
    cur: psycopg.Cursor[dict[str, Any]], params: dict[str, Any], *, rotate: bool
) -> dict[str, Any]:
    """The tenant ``params`` names, its key rotated if asked and it exists, else new.

    Raises:
        InvalidArgument: the name is taken (and not rotated).
    """
    if rotate:
        cur.execute(queries.load(_SQL)["rotate_tenant_key"], params)
        row = cur.fetchone()
        if row is not None:
            return row
    try:
        return _one(cur, "insert_tenant", params)
    except psycopg.errors.UniqueViolation as exc:
        raise InvalidArgument("name", f"a tenant named {params['name']!r} already exists") from exc


def _one(
    cur: psycopg.Cursor[dict[str, Any]], statement: str, params: dict[str, Any]
) -> dict[str, Any]:
    """The one row ``statement`` returns."""
    cur.execute(queries.load(_SQL)[statement], params)
    row = cur.fetchone()
    assert row is not None
    return row


def list_tenants(dsn: str) -> list[Tenant]:
    """Every tenant, by name.

    Raises:
        StoreUnavailable: PostgreSQL cannot be reached.
    """
    try:
        with direct.connect(dsn) as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(queries.load(_SQL)["list_tenants"])
            return [Tenant(**row) for row in cur.fetchall()]
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot reach PostgreSQL: {exc}") from exc


# ---- the node's side (over the Store's pool) ----------------------------------------------


class TenantStore:
    """The node's tenant statements, over ``store``'s pool."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load(_SQL)

    async def get_tenant(self, tenant_id: uuid.UUID) -> Tenant | None:
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["get_tenant"], {"tenant_id": tenant_id})
            row = await cur.fetchone()
        return None if row is None else Tenant(**row)

    async def get_tenant_by_key_hash(self, api_key_hash: str) -> Tenant | None:
        """The tenant holding the API key whose hash is ``api_key_hash`` (see
        ``auth.hash_api_key``), or None; served by the unique index on the hash."""
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["get_tenant_by_key_hash"], {"api_key_hash": api_key_hash})
            row = await cur.fetchone()
        return None if row is None else Tenant(**row)

    async def get_tenant_by_name(self, name: str) -> Tenant | None:
        """The tenant named ``name``, or None (a client certificate's tenant)."""
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["get_tenant_by_name"], {"name": name})
            row = await cur.fetchone()
        return None if row is None else Tenant(**row)

    async def list_tenants(self) -> list[Tenant]:
        """Every tenant, by name."""
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["list_tenants"])
            return [Tenant(**row) for row in await cur.fetchall()]
