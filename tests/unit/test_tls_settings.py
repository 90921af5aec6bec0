"""TLS settings of every process, refused or read: the node's (``grpc.tls_*``,
``etcd.ca_cert``...), the watchdog canary's (``canary.tls*``), the CLI's flags and
variables (``--tls-ca``, ``CHRONOSHARD_TLS_CA``...) and the worker runner's."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from chronoshard._cli.common import UsageError, add_tls, tls_config
from chronoshard.client import TLSConfig
from chronoshard.scheduler.config import EtcdConfig, GrpcConfig, SchedulerConfig
from chronoshard.settings import ConfigError, load
from chronoshard.watchdog.canary import canary_tls
from chronoshard.watchdog.config import CanaryConfig
from chronoshard.worker import ConfigurationError
from chronoshard.worker._runner import _parser, tls_from


@pytest.mark.parametrize(
    ("settings", "key", "complaint"),
    [
        ({"tls_client_ca": "ca.pem"}, "grpc.tls_client_ca", "need TLS"),
        (
            {"tls_cert": "c", "tls_key": "k", "tls_client_identities": ("CN=a => b",)},
            "grpc.tls_client_identities",
            "needs grpc.tls_client_ca",
        ),
        (
            {
                "tls_cert": "c",
                "tls_key": "k",
                "tls_client_ca": "ca",
                "tls_client_identities": ("CN=a",),
            },
            "grpc.tls_client_identities",
            "SELECTOR => TENANT",
        ),
        ({"tls_cert": "c"}, "grpc.tls_cert", "go together"),
    ],
)
def test_the_nodes_tls_settings_are_refused_naming_the_key(
    settings: dict[str, object], key: str, complaint: str
) -> None:
    with pytest.raises(ConfigError, match=complaint) as refused:
        GrpcConfig(**settings).validate()  # type: ignore[arg-type]
    assert refused.value.key == key


def test_identities_come_from_toml_or_a_comma_separated_variable(tmp_path: Path) -> None:
    env = {
        "CHRONOSHARD_GRPC__TLS_CERT": "node.crt",
        "CHRONOSHARD_GRPC__TLS_KEY": "node.key",
        "CHRONOSHARD_GRPC__TLS_CLIENT_CA": "clients.crt",
        "CHRONOSHARD_GRPC__TLS_CLIENT_IDENTITIES": "CN=a => x, URI=spiffe://e.org/b => y",
    }
    config = load(SchedulerConfig, env=env)
    assert config.grpc.tls_client_identities == ("CN=a => x", "URI=spiffe://e.org/b => y")
    toml = tmp_path / "node.toml"
    toml.write_text(
        '[grpc]\ntls_cert = "c"\ntls_key = "k"\ntls_client_ca = "ca"\n'
        'tls_client_identities = ["CN=billing-worker => billing"]\n'
    )
    assert load(SchedulerConfig, path=toml, env={}).grpc.tls_client_identities == (
        "CN=billing-worker => billing",
    )


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"cert_cert": "c"}, "etcd.cert_cert"),
        ({"cert_cert": "c", "cert_key": "k"}, "etcd.ca_cert"),
    ],
)
def test_the_etcd_client_certificate_needs_its_key_and_a_ca(
    settings: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        EtcdConfig(**settings).validate()  # type: ignore[arg-type]
    assert refused.value.key == key


def test_the_canary_takes_a_ca_and_a_client_certificate(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"CA")
    (tmp_path / "c.crt").write_bytes(b"CERT")
    (tmp_path / "c.key").write_bytes(b"KEY")
    assert canary_tls(CanaryConfig()) == (None, None)
    client, worker = canary_tls(CanaryConfig(tls=True))
    assert client == TLSConfig() and worker is not None and worker.root_certificates is None
    client, worker = canary_tls(
        CanaryConfig(
            tls_ca=str(tmp_path / "ca.crt"),
            tls_cert=str(tmp_path / "c.crt"),
            tls_key=str(tmp_path / "c.key"),
        )
    )
    assert client == TLSConfig(b"CA", b"CERT", b"KEY")
    assert worker is not None
    assert (worker.root_certificates, worker.client_certificate_chain) == (b"CA", b"CERT")
    assert worker.client_private_key == b"KEY"
    with pytest.raises(ConfigError) as refused:
        canary_tls(CanaryConfig(tls_ca=str(tmp_path / "missing.crt")))
    assert refused.value.key == "canary.tls_ca"
    with pytest.raises(ConfigError) as refused:
        CanaryConfig(tls_cert="c.crt").validate()
    assert refused.value.key == "canary.tls_cert"


def _cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_tls(parser)
    return parser.parse_args(argv)


def test_the_cli_reads_its_tls_files_from_flags_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("CHRONOSHARD_TLS_CA", "CHRONOSHARD_TLS_CERT", "CHRONOSHARD_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "ca.crt").write_bytes(b"CA")
    (tmp_path / "c.crt").write_bytes(b"CERT")
    (tmp_path / "c.key").write_bytes(b"KEY")
    assert tls_config(_cli_args()) is None
    assert tls_config(_cli_args("--tls")) == TLSConfig()
    assert tls_config(_cli_args("--tls-ca", str(tmp_path / "ca.crt"))) == TLSConfig(b"CA")
    monkeypatch.setenv("CHRONOSHARD_TLS_CERT", str(tmp_path / "c.crt"))
    monkeypatch.setenv("CHRONOSHARD_TLS_KEY", str(tmp_path / "c.key"))
    assert tls_config(_cli_args()) == TLSConfig(None, b"CERT", b"KEY")
    monkeypatch.delenv("CHRONOSHARD_TLS_KEY")
    with pytest.raises(UsageError, match="--tls-cert and --tls-key go together"):
        tls_config(_cli_args())
    monkeypatch.delenv("CHRONOSHARD_TLS_CERT")
    with pytest.raises(UsageError, match=r"--tls-ca .*missing\.crt"):
        tls_config(_cli_args("--tls-ca", str(tmp_path / "missing.crt")))


def test_the_worker_runner_reads_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("CHRONOSHARD_TLS_CA", "CHRONOSHARD_TLS_CERT", "CHRONOSHARD_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "ca.crt").write_bytes(b"CA")
    (tmp_path / "c.crt").write_bytes(b"CERT")
    (tmp_path / "c.key").write_bytes(b"KEY")
    assert tls_from(_parser().parse_args(["m:w"])) is None
    monkeypatch.setenv("CHRONOSHARD_TLS_CERT", str(tmp_path / "c.crt"))
    monkeypatch.setenv("CHRONOSHARD_TLS_KEY", str(tmp_path / "c.key"))
    tls = tls_from(_parser().parse_args(["m:w", "--tls-ca", str(tmp_path / "ca.crt")]))
    assert tls is not None
    assert (tls.root_certificates, tls.client_certificate_chain, tls.client_private_key) == (
        b"CA",
        b"CERT",
        b"KEY",
    )
    monkeypatch.delenv("CHRONOSHARD_TLS_KEY")
    with pytest.raises(ConfigurationError, match="go together"):
        tls_from(_parser().parse_args(["m:w"]))
