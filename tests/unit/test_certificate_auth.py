"""The authenticator with client certificates (``grpc.tls_client_identities``): a mapped
certificate is its tenant without a key, a key sent with it must agree, and everything
else is the API-key path as before. Tenants in memory, on a fake clock."""

from __future__ import annotations

import pytest
from fixtures.rows import tenant_model

from chronoshard.clock import FakeClock
from chronoshard.scheduler.api.auth import Authenticator, CertificateTenants
from chronoshard.scheduler.core.api_keys import hash_api_key, new_api_key
from chronoshard.scheduler.core.identities import IdentityMap
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.errors import PermissionDenied, Unauthenticated


class _Tenants:
    """The tenants table's two lookups, in memory, counting the calls that reach it."""

    def __init__(self, by_key: dict[str, Tenant]) -> None:
        self.by_key = {hash_api_key(key): tenant for key, tenant in by_key.items()}
        self.by_name = {tenant.name: tenant for tenant in by_key.values()}
        self.calls: list[str] = []

    async def get_tenant_by_key_hash(self, api_key_hash: str) -> Tenant | None:
        self.calls.append("key")
        return self.by_key.get(api_key_hash)

    async def get_tenant_by_name(self, name: str) -> Tenant | None:
        self.calls.append(f"name:{name}")
        return self.by_name.get(name)


def _peer(common_name: str) -> dict[str, list[bytes]]:
    return {"transport_security_type": [b"ssl"], "x509_common_name": [common_name.encode()]}


BILLING_KEY, ACME_KEY = new_api_key(), new_api_key()


@pytest.fixture
def tenants() -> _Tenants:
    return _Tenants({BILLING_KEY: tenant_model("billing"), ACME_KEY: tenant_model("acme")})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def auth(tenants: _Tenants, clock: FakeClock) -> Authenticator:
    identities = IdentityMap.parse(["CN=billing-worker => billing", "CN=ghost => nobody"])
    return Authenticator(
        tenants, cache_ttl_s=30.0, clock=clock, certificates=CertificateTenants(identities, tenants)
    )


def _bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


async def test_a_mapped_certificate_needs_no_key_and_its_tenant_is_cached(
    auth: Authenticator, tenants: _Tenants, clock: FakeClock
) -> None:
    assert auth.reads_certificates
    tenant = await auth.authenticate([], _peer("billing-worker"))
    assert tenant.name == "billing"
    clock.advance(29.0)
    assert await auth.authenticate([], _peer("billing-worker")) is tenant
    assert tenants.calls == ["name:billing"]
    clock.advance(1.0)
    await auth.authenticate([], _peer("billing-worker"))
    assert tenants.calls == ["name:billing"] * 2


async def test_a_key_sent_with_a_mapped_certificate_must_be_the_same_tenants(
    auth: Authenticator,
) -> None:
    assert (await auth.authenticate(_bearer(BILLING_KEY), _peer("billing-worker"))).name == (
        "billing"
    )
    with pytest.raises(PermissionDenied, match="tenant is 'billing'"):
        await auth.authenticate(_bearer(ACME_KEY), _peer("billing-worker"))
    # A malformed key is refused as ever, certificate or not.
    with pytest.raises(Unauthenticated):
        await auth.authenticate([("authorization", "Basic xyz")], _peer("billing-worker"))


async def test_an_unmapped_certificate_or_none_leaves_it_to_the_key(
    auth: Authenticator, tenants: _Tenants
) -> None:
    assert (await auth.authenticate(_bearer(ACME_KEY), _peer("someone-else"))).name == "acme"
    assert (await auth.authenticate(_bearer(ACME_KEY), None)).name == "acme"
    with pytest.raises(Unauthenticated):
        await auth.authenticate([], _peer("someone-else"))
    with pytest.raises(Unauthenticated):
        await auth.authenticate([], {})
    assert not any(call.startswith("name:") for call in tenants.calls)


async def test_a_certificate_mapped_to_a_missing_tenant_is_unauthenticated(
    auth: Authenticator, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(Unauthenticated):
        await auth.authenticate([], _peer("ghost"))
    assert "maps to a tenant that does not exist" in caplog.text


async def test_a_certificate_of_two_tenants_is_permission_denied(
    tenants: _Tenants, clock: FakeClock
) -> None:
    identities = IdentityMap.parse(["CN=ops => acme", "URI=spiffe://x/billing => billing"])
    auth = Authenticator(tenants, clock=clock, certificates=CertificateTenants(identities, tenants))
    peer = {"x509_common_name": [b"ops"], "peer_uri": [b"spiffe://x/billing"]}
    with pytest.raises(PermissionDenied, match="several tenants: acme, billing"):
        await auth.authenticate(_bearer(ACME_KEY), peer)


async def test_without_certificates_the_auth_context_is_ignored(tenants: _Tenants) -> None:
    auth = Authenticator(tenants, clock=FakeClock())
    assert not auth.reads_certificates
    with pytest.raises(Unauthenticated):
        await auth.authenticate([], _peer("billing-worker"))
