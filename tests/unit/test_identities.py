"""Client certificates as tenants (scheduler/core/identities.py): the entries of
``grpc.tls_client_identities``, and which tenant a certificate's identities stand for."""

from __future__ import annotations

import pytest

from chronoshard.scheduler.core.identities import (
    AmbiguousIdentity,
    IdentityError,
    IdentityMap,
    IdentityRule,
    PeerCertificate,
)


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        ("CN=billing-worker => billing", IdentityRule("CN", "billing-worker", "billing")),
        ("CN=billing-worker=>billing", IdentityRule("CN", "billing-worker", "billing")),
        (
            "  cn = billing worker  =>  Billing EU ",
            IdentityRule("CN", "billing worker", "Billing EU"),
        ),
        (
            "URI=spiffe://example.org/ns/billing/sa/worker => billing",
            IdentityRule("URI", "spiffe://example.org/ns/billing/sa/worker", "billing"),
        ),
        ("DNS=worker.billing.svc => billing", IdentityRule("DNS", "worker.billing.svc", "billing")),
        # The value may hold '=': only the first one ends the selector's name.
        ("CN=a=b => t", IdentityRule("CN", "a=b", "t")),
    ],
)
def test_entries_read_selector_then_tenant(entry: str, rule: IdentityRule) -> None:
    assert IdentityRule.parse(entry) == rule


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ("CN=billing-worker", "is not SELECTOR => TENANT"),
        ("billing-worker => billing", "is not SELECTOR => TENANT"),
        ("O=Billing => billing", "must be one of CN, URI, DNS"),
        ("CN= => billing", "must not be empty"),
        ("CN=billing-worker =>  ", "must not be empty"),
    ],
)
def test_malformed_entries_are_refused_with_the_reason(entry: str, complaint: str) -> None:
    with pytest.raises(IdentityError, match=complaint):
        IdentityRule.parse(entry)


def test_one_identity_may_not_name_two_tenants() -> None:
    with pytest.raises(IdentityError, match="mapped to two tenants: billing, payroll"):
        IdentityMap.parse(["CN=shared => billing", "CN=shared => payroll"])
    # The same rule twice is no conflict.
    assert len(IdentityMap.parse(["CN=shared => billing", "CN=shared=>billing"])) == 1


def test_a_certificate_is_the_tenant_of_the_rule_it_matches() -> None:
    identities = IdentityMap.parse(
        [
            "CN=billing-worker => billing",
            "URI=spiffe://example.org/payroll => payroll",
            "DNS=reports.internal => reports",
        ]
    )
    assert identities.tenant_for(PeerCertificate(common_names=("billing-worker",))) == "billing"
    assert identities.tenant_for(PeerCertificate(uris=("spiffe://example.org/payroll",))) == (
        "payroll"
    )
    assert identities.tenant_for(PeerCertificate(dns_names=("reports.internal",))) == "reports"
    # Exact values, each in its own kind: a CN that reads like a URI SAN is no URI SAN.
    assert identities.tenant_for(PeerCertificate(common_names=("Billing-Worker",))) is None
    assert identities.tenant_for(PeerCertificate(common_names=("reports.internal",))) is None
    assert identities.tenant_for(PeerCertificate()) is None


def test_a_certificate_of_two_tenants_is_refused_not_guessed() -> None:
    identities = IdentityMap.parse(["CN=ops => ops", "URI=spiffe://example.org/billing => billing"])
    both = PeerCertificate(common_names=("ops",), uris=("spiffe://example.org/billing",))
    with pytest.raises(AmbiguousIdentity) as refused:
        identities.tenant_for(both)
    assert refused.value.tenants == ("billing", "ops")
    # Two identities of the same tenant are one tenant.
    same = IdentityMap.parse(["CN=ops => ops", "URI=spiffe://example.org/ops => ops"])
    ops = PeerCertificate(common_names=("ops",), uris=("spiffe://example.org/ops",))
    assert same.tenant_for(ops) == "ops"


def test_the_peer_is_read_from_grpcs_auth_context() -> None:
    # The shape grpc.aio's context.auth_context() returns for an mTLS peer.
    auth_context = {
        "transport_security_type": [b"ssl"],
        "x509_common_name": [b"billing-worker"],
        "x509_subject": [b"CN=billing-worker"],
        "x509_subject_alternative_name": [b"spiffe://example.org/billing", b"w.billing"],
        "peer_uri": [b"spiffe://example.org/billing"],
        "peer_dns": [b"w.billing"],
        "x509_pem_cert": [b"-----BEGIN CERTIFICATE-----..."],
    }
    assert PeerCertificate.from_auth_context(auth_context) == PeerCertificate(
        common_names=("billing-worker",),
        uris=("spiffe://example.org/billing",),
        dns_names=("w.billing",),
    )
    # A plaintext call's context has no peer identities.
    assert PeerCertificate.from_auth_context({"transport_security_type": [b"insecure"]}) == (
        PeerCertificate()
    )
