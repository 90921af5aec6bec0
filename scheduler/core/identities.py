"""Client certificates as tenants: which tenant an mTLS peer's certificate stands for.

A node that requires client certificates (``grpc.tls_client_ca``) may also map a
certificate's identity to a tenant (``grpc.tls_client_identities``): a call over such a
connection is then that tenant's without an API key. Each entry of the setting reads
``SELECTOR => TENANT``, the selector one of

- ``CN=<name>``: the certificate's subject common name;
- ``URI=<uri>``: a URI subject alternative name (a SPIFFE ID, say);
- ``DNS=<name>``: a DNS subject alternative name.

Values compare exactly (no wildcards, no case folding): an identity is what the CA
signed. A certificate that matches entries of two different tenants is refused rather
than either tenant chosen, as two API keys on one call are. An API key sent as well must
belong to the certificate's tenant; a certificate that maps to no tenant leaves the call
to its API key, as if there were no certificate.

Pure: the node's authenticator (:mod:`chronoshard.scheduler.api.auth`) hands in the
peer's properties as gRPC reports them (``context.auth_context()``) and looks the chosen
tenant up by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

SEPARATOR = "=>"
KINDS = ("CN", "URI", "DNS")
"""The selectors an entry may use, in the order :meth:`IdentityMap.tenant_for` reports."""

# The properties gRPC (C-core) puts into a TLS connection's auth context.
COMMON_NAME_PROPERTY = "x509_common_name"
URI_PROPERTY = "peer_uri"
DNS_PROPERTY = "peer_dns"


class IdentityError(ValueError):
    """An entry of ``grpc.tls_client_identities`` that does not read ``SELECTOR => TENANT``."""


class AmbiguousIdentity(Exception):
    """A certificate that matches entries of more than one tenant; ``tenants`` names them."""

    def __init__(self, tenants: Sequence[str]) -> None:
        super().__init__(
            "the client certificate matches the identities of several tenants: "
            + ", ".join(sorted(tenants))
        )
        self.tenants = tuple(sorted(tenants))


@dataclass(frozen=True)
class PeerCertificate:
    """The identities a verified client certificate carries."""

    common_names: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()

    @classmethod
    def from_auth_context(cls, properties: Mapping[str, Iterable[bytes]]) -> PeerCertificate:
        """The identities in a gRPC auth context (``{name: [value, ...]}``, values bytes);
        an empty one for a connection without a client certificate."""

        def values(name: str) -> tuple[str, ...]:
            return tuple(v.decode("utf-8", "replace") for v in properties.get(name, ()))

        return cls(values(COMMON_NAME_PROPERTY), values(URI_PROPERTY), values(DNS_PROPERTY))

    def values_of(self, kind: str) -> tuple[str, ...]:
        return {"CN": self.common_names, "URI": self.uris, "DNS": self.dns_names}[kind]


@dataclass(frozen=True)
class IdentityRule:
    """One entry: a certificate with ``value`` as its ``kind`` identity is ``tenant``'s."""

    kind: str
    value: str
    tenant: str

    @classmethod
    def parse(cls, entry: str) -> IdentityRule:
        """``CN=billing-worker => billing`` (spaces around ``=>`` optional).

        Raises:
            IdentityError: no ``=>``, an unknown selector, or an empty value or tenant.
        """
        selector, separator, tenant = entry.rpartition(SEPARATOR)
        kind, equals, value = selector.strip().partition("=")
        kind = kind.strip().upper()
        if not separator or not equals:
            raise IdentityError(
                f"{entry!r} is not SELECTOR {SEPARATOR} TENANT (e.g. 'CN=billing-worker "
                f"{SEPARATOR} billing')"
            )
        if kind not in KINDS:
            raise IdentityError(f"{entry!r}: the selector must be one of {', '.join(KINDS)}")
        if not value.strip() or not tenant.strip():
            raise IdentityError(f"{entry!r}: the identity and the tenant must not be empty")
        return cls(kind, value.strip(), tenant.strip())


class IdentityMap:
    """The rules of ``grpc.tls_client_identities``, asked which tenant a certificate is."""

    def __init__(self, rules: Iterable[IdentityRule] = ()) -> None:
        self._tenants: dict[tuple[str, str], str] = {}
        for rule in rules:
            known = self._tenants.setdefault((rule.kind, rule.value), rule.tenant)
            if known != rule.tenant:
                raise IdentityError(
                    f"{rule.kind}={rule.value} is mapped to two tenants: {known}, {rule.tenant}"
                )

    @classmethod
    def parse(cls, entries: Iterable[str]) -> IdentityMap:
        """The map of ``entries`` (see :meth:`IdentityRule.parse`).

        Raises:
            IdentityError: an entry is malformed, or one identity names two tenants.
        """
        return cls(IdentityRule.parse(entry) for entry in entries)

    def __bool__(self) -> bool:
        return bool(self._tenants)

    def __len__(self) -> int:
        return len(self._tenants)

    def tenant_for(self, peer: PeerCertificate) -> str | None:
        """The name of the tenant ``peer`` stands for; None when no rule matches.

        Raises:
            AmbiguousIdentity: the certificate matches rules of two or more tenants.
        """
        found = {
            self._tenants[(kind, value)]
            for kind in KINDS
            for value in peer.values_of(kind)
            if (kind, value) in self._tenants
        }
        if len(found) > 1:
            raise AmbiguousIdentity(sorted(found))
        return next(iter(found), None)
