"""API keys: generation, hashing, the bearer header, and the tenant cache on a fake clock."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import pytest
from fixtures.rows import tenant_model

from chronoshard.clock import FakeClock
from chronoshard.scheduler.api.auth import Authenticator, TenantCache, bearer_key
from chronoshard.scheduler.core.api_keys import hash_api_key, new_api_key
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.errors import Unauthenticated


class _Metadatum(NamedTuple):
    """The shape grpc.aio hands out: objects with .key and .value."""

    key: str
    value: str


def test_new_keys_are_prefixed_random_urlsafe_tokens() -> None:
    keys = {new_api_key() for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        # 32 bytes -> 43 URL-safe base64 characters without padding.
        assert re.fullmatch(r"cs_[A-Za-z0-9_-]{43}", key), key


def test_hash_is_sha256_hex() -> None:
    # FIPS 180-2 test vector for "abc".
    assert hash_api_key("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert hash_api_key("cs_a") != hash_api_key("cs_b")


@pytest.mark.parametrize(
    "metadata",
    [
        [("authorization", "Bearer cs_abc")],
        [("authorization", "bearer cs_abc")],
        [("authorization", "  BEARER   cs_abc  ")],
        [("x-other", "1"), _Metadatum("authorization", "Bearer cs_abc")],
    ],
)
def test_bearer_key_accepts_a_bearer_token(metadata: Sequence[Any]) -> None:
    assert bearer_key(metadata) == "cs_abc"


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        [],
        [("x-api-key", "cs_abc")],
        [("authorization", "cs_abc")],
        [("authorization", "Basic cs_abc")],
        [("authorization", "Bearer ")],
        [("authorization", "Bearer abc")],
        [("authorization", "Bearer cs_a b")],
        [("authorization", "Bearer cs_" + "a" * 300)],
        [("authorization", "Bearer cs_abc"), ("authorization", "Bearer cs_abc")],
        [("authorization", b"Bearer cs_abc")],
    ],
)
def test_bearer_key_refuses_everything_else(metadata: Sequence[Any] | None) -> None:
    with pytest.raises(Unauthenticated) as raised:
        bearer_key(metadata)
    assert raised.value.grpc_code_name == "UNAUTHENTICATED"
    assert raised.value.reason == "UNAUTHENTICATED"


def test_cache_keeps_an_entry_for_exactly_its_ttl() -> None:
    cache = TenantCache(ttl_s=30.0)
    tenant = tenant_model()
    cache.put("h", tenant, now=100.0)
    assert cache.get("h", now=129.999) is tenant
    assert cache.get("h", now=130.0) is None
    assert len(cache) == 0


def test_cache_with_zero_ttl_keeps_nothing() -> None:
    cache = TenantCache(ttl_s=0.0)
    cache.put("h", tenant_model(), now=1.0)
    assert cache.get("h", now=1.0) is None


def test_full_cache_drops_expired_entries_first_then_the_oldest() -> None:
    cache = TenantCache(ttl_s=10.0, max_entries=3)
    a, b, c, d, e = (tenant_model(n) for n in "abcde")
    cache.put("a", a, now=0.0)
    cache.put("b", b, now=5.0)
    cache.put("c", c, now=6.0)
    # At 11, "a" has expired: it goes, the live ones stay.
    cache.put("d", d, now=11.0)
    assert [cache.get(k, now=11.0) for k in "bcd"] == [b, c, d]
    assert cache.get("a", now=11.0) is None
    # Nothing expired at 12: the oldest live entry ("b") makes room.
    cache.put("e", e, now=12.0)
    assert cache.get("b", now=12.0) is None
    assert [cache.get(k, now=12.0) for k in "cde"] == [c, d, e]


class _Lookup:
    """The store's tenant lookup, in memory, counting the calls that reach it."""

    def __init__(self, tenants: dict[str, Tenant]) -> None:
        self.tenants = tenants
        self.calls: list[str] = []

    async def get_tenant_by_key_hash(self, api_key_hash: str) -> Tenant | None:
        self.calls.append(api_key_hash)
        return self.tenants.get(api_key_hash)


async def test_authenticator_caches_known_keys_for_the_ttl() -> None:
    key, tenant = new_api_key(), tenant_model()
    lookup = _Lookup({hash_api_key(key): tenant})
    clock = FakeClock()
    auth = Authenticator(lookup, cache_ttl_s=30.0, clock=clock)
    metadata = [("authorization", f"Bearer {key}")]

    assert await auth.authenticate(metadata) is tenant
    clock.advance(29.0)
    assert await auth.authenticate(metadata) is tenant
    assert lookup.calls == [hash_api_key(key)]
    clock.advance(1.0)
    assert await auth.authenticate(metadata) is tenant
    assert lookup.calls == [hash_api_key(key)] * 2


async def test_authenticator_refuses_unknown_keys_without_caching_the_miss() -> None:
    key, tenant = new_api_key(), tenant_model()
    lookup = _Lookup({})
    auth = Authenticator(lookup, clock=FakeClock())
    metadata = [("authorization", f"Bearer {key}")]

    with pytest.raises(Unauthenticated):
        await auth.authenticate(metadata)
    # A key created a moment later works at once: misses are not remembered.
    lookup.tenants[hash_api_key(key)] = tenant
    assert await auth.authenticate(metadata) is tenant
    assert len(lookup.calls) == 2


async def test_authenticator_never_queries_for_a_malformed_header() -> None:
    lookup = _Lookup({})
    auth = Authenticator(lookup, clock=FakeClock())
    with pytest.raises(Unauthenticated):
        await auth.authenticate([("authorization", "Basic dXNlcjpwYXNz")])
    assert lookup.calls == []
