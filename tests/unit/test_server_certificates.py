"""The node's certificate reload (scheduler/api/tls.py) on real PEM files of a test CA and
a fake clock: what gRPC's fetcher gets back as the files change, and what a half-done or
broken change leaves in place. The handshakes themselves are tests/e2e/test_tls.py's."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fixtures.pki import Authority, Issued, new_authority

from chronoshard.scheduler.api.tls import CHECK_INTERVAL_S, ServerCertificates
from chronoshard.scheduler.config import GrpcConfig
from chronoshard.settings import ConfigError


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _install(issued: Issued, cert: Path, key: Path) -> None:
    key.write_bytes(issued.key_pem)
    cert.write_bytes(issued.certificate_pem)


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return new_authority(tmp_path / "pki", "unit")


@pytest.fixture
def files(tmp_path: Path, ca: Authority) -> GrpcConfig:
    _install(ca.server(), tmp_path / "node.crt", tmp_path / "node.key")
    (tmp_path / "clients.crt").write_bytes(ca.certificate_pem)
    return GrpcConfig(
        tls_cert=str(tmp_path / "node.crt"),
        tls_key=str(tmp_path / "node.key"),
        tls_client_ca=str(tmp_path / "clients.crt"),
    )


def test_changed_files_are_offered_once_and_at_most_every_check_interval(
    files: GrpcConfig, ca: Authority
) -> None:
    clock = _Clock()
    certificates = ServerCertificates(files, monotonic=clock)
    assert certificates.requires_client_certificates
    assert certificates.fetch() is None  # nothing changed
    renewed = ca.server("renewed")
    assert files.tls_cert is not None and files.tls_key is not None
    _install(renewed, Path(files.tls_cert), Path(files.tls_key))
    clock.now += CHECK_INTERVAL_S / 2
    assert certificates.fetch() is None, "looked again before the check interval"
    clock.now += CHECK_INTERVAL_S
    assert certificates.fetch() is not None
    assert certificates.current.certificate == renewed.certificate_pem
    assert certificates.reloads == 1
    clock.now += CHECK_INTERVAL_S
    assert certificates.fetch() is None, "the same files offered twice"


def test_a_half_done_change_keeps_the_certificates_in_use(
    files: GrpcConfig, ca: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _Clock()
    certificates = ServerCertificates(files, monotonic=clock)
    in_use = certificates.current
    renewed = ca.server("renewed")
    assert files.tls_cert is not None and files.tls_key is not None
    # The certificate is written first: it does not match the old key.
    Path(files.tls_cert).write_bytes(renewed.certificate_pem)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.now += CHECK_INTERVAL_S
            assert certificates.fetch() is None
    assert certificates.current == in_use
    warnings = [r for r in caplog.records if "not usable" in r.getMessage()]
    assert len(warnings) == 1, "one warning per bad state of the files, not per handshake"
    # Then its key: the pair is whole, and taken.
    Path(files.tls_key).write_bytes(renewed.key_pem)
    clock.now += CHECK_INTERVAL_S
    assert certificates.fetch() is not None
    assert certificates.current.key == renewed.key_pem


def test_a_client_ca_file_without_certificates_is_not_taken(
    files: GrpcConfig, ca: Authority
) -> None:
    clock = _Clock()
    certificates = ServerCertificates(files, monotonic=clock)
    assert files.tls_client_ca is not None
    Path(files.tls_client_ca).write_bytes(b"-----BEGIN CERTIFICATE-----\ntruncat")
    clock.now += CHECK_INTERVAL_S
    assert certificates.fetch() is None
    assert certificates.current.client_ca == ca.certificate_pem
    # A missing file (mid-swap) is no worse.
    Path(files.tls_client_ca).unlink()
    clock.now += CHECK_INTERVAL_S
    assert certificates.fetch() is None
    # The overlap window's bundle of two CAs is.
    other = new_authority(Path(files.tls_client_ca).parent / "pki", "other")
    Path(files.tls_client_ca).write_bytes(ca.certificate_pem + other.certificate_pem)
    clock.now += CHECK_INTERVAL_S
    assert certificates.fetch() is not None
    assert certificates.current.client_ca == ca.certificate_pem + other.certificate_pem


def test_unusable_files_at_start_refuse_the_start_naming_the_key(
    files: GrpcConfig, ca: Authority, tmp_path: Path
) -> None:
    missing = GrpcConfig(tls_cert=str(tmp_path / "nowhere.crt"), tls_key=files.tls_key)
    with pytest.raises(ConfigError, match=r"grpc\.tls_cert: cannot read") as refused:
        ServerCertificates(missing)
    assert refused.value.key == "grpc.tls_cert"
    other_key = ca.client("someone")
    mismatched = GrpcConfig(tls_cert=files.tls_cert, tls_key=str(other_key.key))
    with pytest.raises(ConfigError, match="not a PEM certificate and its key"):
        ServerCertificates(mismatched)
    no_ca = tmp_path / "empty.crt"
    no_ca.write_bytes(b"")
    bad_ca = GrpcConfig(tls_cert=files.tls_cert, tls_key=files.tls_key, tls_client_ca=str(no_ca))
    with pytest.raises(ConfigError) as refused:
        ServerCertificates(bad_ca)
    assert refused.value.key == "grpc.tls_client_ca"
