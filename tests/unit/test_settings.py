"""The config loader: precedence, coercion, and errors that name the bad key."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chronoshard.settings import ConfigError, load, require


@dataclass(frozen=True)
class EtcdSection:
    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    lease_ttl_s: float = 10.0


@dataclass(frozen=True)
class SampleConfig:
    node_id: str = "node-a"
    shard_count: int = 64
    strict: bool = False
    dsn: str | None = None
    etcd: EtcdSection = field(default_factory=EtcdSection)

    def validate(self) -> None:
        require(self.shard_count >= 1, "shard_count", "must be at least 1")


def test_defaults_when_nothing_given() -> None:
    assert load(SampleConfig, env={}) == SampleConfig()


def test_env_beats_file_and_file_beats_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('node_id = "from-file"\nshard_count = 8\n[etcd]\nlease_ttl_s = 5\n')
    config = load(
        SampleConfig,
        path=path,
        env={"CHRONOSHARD_SHARD_COUNT": "16", "CHRONOSHARD_ETCD__ENDPOINTS": "a:1, b:2"},
    )
    assert config.node_id == "from-file"
    assert config.shard_count == 16
    assert config.etcd == EtcdSection(endpoints=("a:1", "b:2"), lease_ttl_s=5.0)


def test_overrides_beat_env() -> None:
    config = load(SampleConfig, env={"CHRONOSHARD_NODE_ID": "env"}, overrides={"node_id": "flag"})
    assert config.node_id == "flag"


def test_unrelated_env_vars_are_ignored() -> None:
    assert load(SampleConfig, env={"CHRONOSHARD_TEST_DSN": "x", "HOME": "/"}) == SampleConfig()


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("shard_count = 'many'\n", "shard_count"),
        ("strict = 'perhaps'\n", "strict"),
        ("shard_cuont = 3\n", "shard_cuont"),
        ("[etcd]\nlease_ttl = 3\n", "etcd.lease_ttl"),
        ("[etcd]\nlease_ttl_s = 'soon'\n", "etcd.lease_ttl_s"),
        ("shard_count = 0\n", "shard_count"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, toml: str, key: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load(SampleConfig, path=path, env={})
    assert info.value.key == key


def test_bad_env_value_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        load(SampleConfig, env={"CHRONOSHARD_ETCD__LEASE_TTL_S": "ten"})
    assert info.value.key == "etcd.lease_ttl_s"


def test_missing_file_and_bad_toml_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(SampleConfig, path=tmp_path / "absent.toml", env={})
    broken = tmp_path / "broken.toml"
    broken.write_text("node_id = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(SampleConfig, path=broken, env={})


def test_configuration_reference_is_fresh() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "gen-config-docs.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("env", "ok"),
    [
        ({"CHRONOSHARD_GRPC__LISTEN": "0.0.0.0:7070"}, False),
        ({"CHRONOSHARD_GRPC__LISTEN": "[::]:7070"}, False),
        ({"CHRONOSHARD_GRPC__LISTEN": ":7070"}, False),
        (
            {
                "CHRONOSHARD_GRPC__LISTEN": "0.0.0.0:7070",
                "CHRONOSHARD_GRPC__ADVERTISE": "0.0.0.0:7070",
            },
            False,
        ),
        (
            {
                "CHRONOSHARD_GRPC__LISTEN": "0.0.0.0:7070",
                "CHRONOSHARD_GRPC__ADVERTISE": "10.1.2.3:7070",
            },
            True,
        ),
        ({"CHRONOSHARD_GRPC__LISTEN": "10.1.2.3:7070"}, True),
    ],
)
def test_a_node_never_advertises_a_wildcard_address(env: dict[str, str], ok: bool) -> None:
    """Peers and workers dial what a node advertises; 0.0.0.0 would reach nobody, so a
    wildcard listen needs an explicit advertise (the pod IP on Kubernetes)."""
    from chronoshard.scheduler.config import SchedulerConfig

    if ok:
        load(SchedulerConfig, env=env)
        return
    with pytest.raises(ConfigError) as info:
        load(SchedulerConfig, env=env)
    assert info.value.key == "grpc.advertise"
