"""API keys: how a call's ``authorization`` metadata becomes a tenant.

A key is ``cs_`` followed by 32 random bytes in URL-safe base64
(:func:`~chronoshard.scheduler.core.api_keys.new_api_key`); it is shown to the tenant once
and only its SHA-256 (:func:`~chronoshard.scheduler.core.api_keys.hash_api_key`) is stored, in
``tenants.api_key_hash`` (docs/architecture.md#d11). A plain, unsalted hash is enough here: the key
has 256 bits of entropy, so there is nothing to brute-force, and an unsalted digest is what lets the
lookup go through the unique index on the hash. Comparing digests rather than keys also means the
database's comparison timing says nothing about the key itself.

Every call carries ``authorization: Bearer <key>``. :class:`Authenticator` parses it,
hashes the key and asks the tenants table
(:class:`~chronoshard.scheduler.store.tenants.TenantStore`) for the tenant, remembering
the answer for ``cache_ttl_s`` (a known tenant only: an unknown key is looked up every
time, so a key created a moment ago works at once). The cost of the cache is that a
revoked or rotated key keeps working for up to ``cache_ttl_s`` on a node that served it
recently. Every failure, whether the header is missing, malformed or names no tenant, is
the same :class:`~.errors.Unauthenticated`, so a caller cannot probe which keys exist.

A node that requires client certificates may also take a certificate for a tenant
(``grpc.tls_client_identities``, :mod:`~chronoshard.scheduler.core.identities`): given
the connection's auth context, a call whose certificate maps to a tenant needs no key,
and a key it sends anyway must be that tenant's (else ``PERMISSION_DENIED``). Tenants
found by certificate are cached like keys, by name, for the same ``cache_ttl_s``.

A tenant homed in a region the cluster does not serve is refused after it is known
(:mod:`~chronoshard.scheduler.core.regions`): ``FAILED_PRECONDITION``, reason
``WRONG_REGION``, naming its home region, so only a valid key learns where to go.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from chronoshard.clock import Clock, SystemClock
from chronoshard.scheduler.core.api_keys import API_KEY_PREFIX, hash_api_key
from chronoshard.scheduler.core.identities import AmbiguousIdentity, IdentityMap, PeerCertificate
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.core.regions import RegionPolicy
from chronoshard.scheduler.errors import PermissionDenied, Unauthenticated

log = logging.getLogger(__name__)

MAX_API_KEY_CHARS = 256
"""Far above a real key (46 chars); a longer value is refused before it is hashed."""
AUTHORIZATION_KEY = "authorization"
DEFAULT_CACHE_TTL_S = 30.0
DEFAULT_MAX_CACHED = 10_000


AuthContext = Mapping[str, Iterable[bytes]]
"""A call's ``context.auth_context()``: the peer's TLS properties (empty in plaintext)."""
_BY_NAME = "tenant-name:"
"""Cache keys of tenants found by certificate; a key hash is hex, so never starts so."""


def _authorizations(metadata: Iterable[Any] | None) -> list[Any]:
    values = []
    for item in metadata or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        if key == AUTHORIZATION_KEY:
            values.append(value)
    return values


def bearer_key(metadata: Iterable[Any] | None) -> str:
    """The API key of an ``authorization: Bearer <key>`` entry in call metadata.

    ``metadata`` is what ``context.invocation_metadata()`` returns: ``(key, value)``
    pairs or objects with ``.key``/``.value``. The scheme is matched case-insensitively,
    as HTTP does.

    Raises:
        Unauthenticated: no such entry, more than one, or a value that is not a bearer
            token shaped like an API key.
    """
    values = _authorizations(metadata)
    if not values:
        raise Unauthenticated()
    # Two credentials on one call is a confused client, or someone hoping one of them
    # is checked and the other used; refuse rather than pick.
    if len(values) > 1 or not isinstance(values[0], str):
        raise Unauthenticated()
    scheme, _, token = values[0].strip().partition(" ")
    token = token.strip()
    if (
        scheme.lower() != "bearer"
        or not token.startswith(API_KEY_PREFIX)
        or len(token) > MAX_API_KEY_CHARS
        or len(token.split()) != 1  # whitespace inside (str.split splits on any)
    ):
        raise Unauthenticated()
    return token


class TenantLookup(Protocol):
    """What the authenticator needs of the tenants table (:class:`TenantStore`)."""

    async def get_tenant_by_key_hash(self, api_key_hash: str) -> Tenant | None: ...


class TenantNameLookup(Protocol):
    """What certificate authentication needs of the tenants table (:class:`TenantStore`)."""

    async def get_tenant_by_name(self, name: str) -> Tenant | None: ...


@dataclass(frozen=True)
class CertificateTenants:
    """Client certificates as tenants: the rules, and where tenants are found by name."""

    identities: IdentityMap
    tenants: TenantNameLookup


class TenantCache:
    """Tenants by key hash for ``ttl_s`` seconds of the monotonic clock; pure, time
    passed in. Holds at most ``max_entries``: when full, expired entries go first, then
    the oldest."""

    def __init__(self, ttl_s: float, max_entries: int = DEFAULT_MAX_CACHED) -> None:
        if ttl_s < 0:
            raise ValueError("ttl_s must not be negative")
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        # Insertion order is expiry order: every entry lives exactly ttl_s.
        self._entries: dict[str, tuple[Tenant, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key_hash: str, now: float) -> Tenant | None:
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        tenant, expires = entry
        if now >= expires:
            del self._entries[key_hash]
            return None
        return tenant

    def put(self, key_hash: str, tenant: Tenant, now: float) -> None:
        if self.ttl_s == 0:
            return
        self._entries.pop(key_hash, None)
        if len(self._entries) >= self.max_entries:
            self._evict(now)
        self._entries[key_hash] = (tenant, now + self.ttl_s)

    def _evict(self, now: float) -> None:
        for key_hash, (_, expires) in list(self._entries.items()):
            if expires > now and len(self._entries) < self.max_entries:
                break
            del self._entries[key_hash]


class Authenticator:
    """Resolves a call's API key (or, with ``certificates``, its client certificate) to
    its tenant, caching known ones for ``cache_ttl_s``."""

    def __init__(
        self,
        tenants: TenantLookup,
        cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
        *,
        clock: Clock | None = None,
        max_cached: int = DEFAULT_MAX_CACHED,
        certificates: CertificateTenants | None = None,
        regions: RegionPolicy | None = None,
    ) -> None:
        self._tenants = tenants
        self._regions = regions if regions is not None else RegionPolicy()
        self._clock = clock or SystemClock()
        self._cache = TenantCache(cache_ttl_s, max_cached)
        self._certificates = certificates

    @property
    def reads_certificates(self) -> bool:
        """Whether a call's client certificate can name its tenant: callers must then
        pass the call's auth context to :meth:`authenticate`."""
        return self._certificates is not None

    async def authenticate(
        self, metadata: Iterable[Any] | None, auth_context: AuthContext | None = None
    ) -> Tenant:
        """The tenant whose API key the call presents, or whose client certificate (in
        ``auth_context``) it connected with.

        Raises:
            Unauthenticated: no valid key (see :func:`bearer_key`) and no certificate that
                maps to a tenant, or no tenant has the key (or the certificate's name).
            PermissionDenied: the key and the certificate are different tenants', or the
                certificate matches several tenants' identities.
            WrongRegion: the tenant is homed in a region this cluster does not serve.
            StoreUnavailable: the lookup could not reach PostgreSQL.
        """
        tenant = await self._tenant(metadata, auth_context)
        self._regions.check(tenant.name, tenant.home_region)
        return tenant

    async def _tenant(
        self, metadata: Iterable[Any] | None, auth_context: AuthContext | None
    ) -> Tenant:
        named = self._certificate_tenant(auth_context)
        if named is None:
            return await self._by_key(metadata)
        if not _authorizations(metadata):
            return await self._by_name(named)
        tenant = await self._by_key(metadata)
        if tenant.name != named:
            raise PermissionDenied(
                "the API key belongs to another tenant than the client certificate "
                f"(whose tenant is {named!r}): send that tenant's key, or none"
            )
        return tenant

    def _certificate_tenant(self, auth_context: AuthContext | None) -> str | None:
        if self._certificates is None or not auth_context:
            return None
        try:
            return self._certificates.identities.tenant_for(
                PeerCertificate.from_auth_context(auth_context)
            )
        except AmbiguousIdentity as exc:
            raise PermissionDenied(str(exc)) from None

    async def _by_name(self, name: str) -> Tenant:
        assert self._certificates is not None
        cache_key = _BY_NAME + name
        tenant = self._cache.get(cache_key, self._clock.monotonic())
        if tenant is not None:
            return tenant
        tenant = await self._certificates.tenants.get_tenant_by_name(name)
        if tenant is None:
            # The setting names a tenant that is not there: the operator's to fix, and
            # the caller learns no more than about an unknown key.
            log.warning(
                "a client certificate maps to a tenant that does not exist",
                extra={"tenant": name},
            )
            raise Unauthenticated()
        self._cache.put(cache_key, tenant, self._clock.monotonic())
        return tenant

    async def _by_key(self, metadata: Iterable[Any] | None) -> Tenant:
        key_hash = hash_api_key(bearer_key(metadata))
        tenant = self._cache.get(key_hash, self._clock.monotonic())
        if tenant is not None:
            return tenant
        tenant = await self._tenants.get_tenant_by_key_hash(key_hash)
        if tenant is None:
            raise Unauthenticated()
        self._cache.put(key_hash, tenant, self._clock.monotonic())
        return tenant
