"""The config loader: precedence, coercion, errors that name the bad key or variable, and
the one list of CHRONOSHARD_* variables that are no key (held to what the code reads)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chronoshard.settings import (
    ENV_PREFIX,
    OTHER_VARIABLES,
    ConfigError,
    config_classes,
    env_names,
    load,
    require,
)

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = (
    "chronoshard",
    "scheduler",
    "worker",
    "watchdog",
    "bench",
    "scripts",
    "tests",
    "examples",
)
VARIABLE_USES = (
    re.compile(r"""["'](CHRONOSHARD_[A-Z0-9_]*[A-Z0-9])["']"""),  # a whole string literal
    re.compile(r"\b(CHRONOSHARD_[A-Z0-9_]*[A-Z0-9])=(?!=)"),  # a keyword or NAME=value
    re.compile(r"\$\{?(CHRONOSHARD_[A-Z0-9_]*[A-Z0-9])"),  # $NAME in shell or help text
)
NOT_VARIABLES = frozenset(
    {
        "CHRONOSHARD_SHARD_COUNT",  # SampleConfig's key
        "CHRONOSHARD_SHARD_CUONT",
        "CHRONOSHARD_GRPC_ADVERTISE",
        "CHRONOSHARD_ETCD__LEASE_TTL",
        "CHRONOSHARD_CHECK_INTERVAL",
        "CHRONOSHARD_TEST_DNS",
        "CHRONOSHARD_XYZZY",
        "CHRONOSHARD_ZQXJ",
        "CHRONOSHARD_NAME",  # a key of the class the import test builds
    }
)
"""Names this module builds on purpose as no process's variable (typos, SampleConfig's)."""


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


def test_listed_other_variables_and_unprefixed_ones_are_ignored() -> None:
    env = {"CHRONOSHARD_TEST_DSN": "x", "CHRONOSHARD_WORKER_TARGETS": "a:1", "HOME": "/"}
    assert load(SampleConfig, env=env) == SampleConfig()


def test_another_processes_keys_are_ignored() -> None:
    """One environment may serve every process (a compose file's .env, chronoshard dev)."""
    from chronoshard.scheduler.config import SchedulerConfig
    from chronoshard.watchdog.config import WatchdogConfig

    watchdog_keys = {"CHRONOSHARD_HTTP_LISTEN": "0.0.0.0:1", "CHRONOSHARD_CANARY__ENABLED": "1"}
    assert load(SchedulerConfig, env=watchdog_keys) == load(SchedulerConfig, env={})
    scheduler_keys = {"CHRONOSHARD_GRPC__LISTEN": "0.0.0.0:1", "CHRONOSHARD_ETCD__CLUSTER": "c"}
    assert load(WatchdogConfig, env=scheduler_keys) == load(WatchdogConfig, env={})
    assert load(SampleConfig, env={**watchdog_keys, **scheduler_keys}) == SampleConfig()


@pytest.mark.parametrize(
    ("process", "name", "nearest"),
    [
        ("scheduler", "CHRONOSHARD_GRPC_ADVERTISE", "CHRONOSHARD_GRPC__ADVERTISE"),
        ("scheduler", "CHRONOSHARD_ETCD__LEASE_TTL", "CHRONOSHARD_ETCD__LEASE_TTL_S"),
        ("watchdog", "CHRONOSHARD_CHECK_INTERVAL", "CHRONOSHARD_CHECK_INTERVAL_S"),
        ("sample", "CHRONOSHARD_SHARD_CUONT", "CHRONOSHARD_SHARD_COUNT"),
        ("sample", "CHRONOSHARD_TEST_DNS", "CHRONOSHARD_TEST_DSN"),
    ],
)
def test_an_unknown_variable_is_an_error_naming_it_and_the_nearest_known(
    process: str, name: str, nearest: str
) -> None:
    from chronoshard.scheduler.config import SchedulerConfig
    from chronoshard.watchdog.config import WatchdogConfig

    cls = {"scheduler": SchedulerConfig, "watchdog": WatchdogConfig, "sample": SampleConfig}
    with pytest.raises(ConfigError) as info:
        load(cls[process], env={name: "5", "CHRONOSHARD_TEST_DSN": "x"})
    assert info.value.key == name
    assert str(info.value) == f"config {name}: unknown variable (did you mean {nearest}?)"


def test_every_unknown_variable_is_named_and_a_far_one_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as info:
        load(SampleConfig, env={"CHRONOSHARD_XYZZY": "1", "CHRONOSHARD_ZQXJ": "2"})
    assert info.value.key == "CHRONOSHARD_XYZZY"
    message = str(info.value)
    assert "did you mean" not in message
    assert "docs/configuration.md" in message
    assert message.endswith("; also unknown: CHRONOSHARD_ZQXJ")


@pytest.mark.parametrize("program", ["scheduler", "watchdog"])
def test_the_processes_refuse_to_start_naming_the_variable(
    program: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from chronoshard.scheduler import __main__ as scheduler_main
    from chronoshard.watchdog import __main__ as watchdog_main

    main = {"scheduler": scheduler_main.main, "watchdog": watchdog_main.main}[program]
    monkeypatch.delenv("CHRONOSHARD_CONFIG", raising=False)
    monkeypatch.setenv("CHRONOSHARD_GRPC_ADVERTISE", "10.0.0.1:7070")
    assert main([]) == 2
    assert "config CHRONOSHARD_GRPC_ADVERTISE: unknown variable" in capsys.readouterr().err


def test_known_variables_need_no_process_configuration_imported() -> None:
    """The other processes' classes are imported only to judge a name none of the loaded
    configuration's keys and OTHER_VARIABLES match: loading stays cheap."""
    code = (
        "import dataclasses, sys\n"
        "from chronoshard.settings import load\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class C:\n"
        "    name: str = 'x'\n"
        "assert load(C, env={'CHRONOSHARD_NAME': 'y', 'CHRONOSHARD_TEST_DSN': 'z'}).name == 'y'\n"
        "print(sorted(m for m in sys.modules if m.endswith('.config')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


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


def variables_in_source() -> dict[str, str]:
    """Every CHRONOSHARD_* name the code, scripts and tests spell out → a file using it."""
    found: dict[str, str] = {}
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in {".py", ".sh"} or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8")
            for pattern in VARIABLE_USES:
                for name in pattern.findall(text):
                    found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_every_variable_in_the_source_is_a_key_or_listed_and_every_listed_one_is_used() -> None:
    keys = set().union(*(env_names(cls) for cls in config_classes().values()))
    used = variables_in_source()
    unlisted = {
        name: where
        for name, where in used.items()
        if name not in keys and name not in OTHER_VARIABLES and name not in NOT_VARIABLES
    }
    assert unlisted == {}, "add them to chronoshard.settings.OTHER_VARIABLES"
    assert sorted(set(OTHER_VARIABLES) - set(used)) == [], "listed, but nothing reads them"
    assert sorted(NOT_VARIABLES & (keys | set(OTHER_VARIABLES))) == []
    assert all(name.startswith(ENV_PREFIX) for name in OTHER_VARIABLES)
    assert not set(OTHER_VARIABLES) & keys, "a configuration key is not an other variable"


def test_each_entry_points_variable_constant_is_listed_with_it_as_reader() -> None:
    from chronoshard._cli import common as cli_common
    from chronoshard.scheduler.dispatch import faults
    from chronoshard.worker import _runner as worker_runner

    readers = {
        cli_common: "chronoshard",
        worker_runner: "chronoshard worker",
        faults: "chronoshard-scheduler",
    }
    missing = []
    for module, reader in readers.items():
        constants = [
            value
            for attr, value in vars(module).items()
            if attr.endswith("_ENV") and isinstance(value, str) and value.startswith(ENV_PREFIX)
        ]
        assert constants, f"{module.__name__} has no *_ENV constant any more"
        for name in constants:
            listed = OTHER_VARIABLES.get(name)
            if listed is None or reader not in listed.readers:
                missing.append(f"{module.__name__}: {name}")
    assert missing == []
