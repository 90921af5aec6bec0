"""The watchdog's configuration, its import boundary, the expectation request validation
of the scheduler's WatchdogService, and the CLI's duration parsing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import duration_pb2

from chronoshard import cli
from chronoshard.scheduler.api.convert import (
    name_page_token_from_pb as page_token_from_pb,
)
from chronoshard.scheduler.api.convert import (
    name_page_token_to_pb as page_token_to_pb,
)
from chronoshard.scheduler.api.expectations import (
    spec_from_pb,
)
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.settings import ConfigError, load
from chronoshard.v1 import watchdog_service_pb2
from chronoshard.watchdog.config import WatchdogConfig
from chronoshard.watchdog.election import lock_key

WATCHDOG_DIR = Path(__file__).resolve().parents[2] / "watchdog"


def test_defaults_validate() -> None:
    config = load(WatchdogConfig, env={})
    assert config.check_interval_s == 60
    assert config.election.mechanism == "advisory_lock"
    assert config.canary.queue == "chronoshard.canary"
    assert config.expectations == ()


def test_toml_with_expectation_tables_and_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.toml"
    path.write_text(
        """
check_interval_s = 5
[sinks]
webhook_urls = ["https://hooks.example.com/a"]
pagerduty_routing_key = "abc"
[canary]
enabled = true
targets = ["10.0.0.1:7070"]
api_key = "cs_x"
[[expectations]]
tenant = "acme"
job_id = "nightly-report"
interval_s = 86400
tolerance_s = 1800
severity = "error"
[[expectations]]
tenant = "acme"
job_id = "hourly"
interval_s = 3600
"""
    )
    config = load(
        WatchdogConfig,
        path=path,
        env={"CHRONOSHARD_CHECK_INTERVAL_S": "2", "CHRONOSHARD_DATABASE__DSN": "postgresql://x"},
    )
    assert config.check_interval_s == 2  # env beats the file
    assert config.database.dsn == "postgresql://x"
    assert config.sinks.webhook_urls == ("https://hooks.example.com/a",)
    assert [(e.job_id, e.interval_s, e.severity) for e in config.expectations] == [
        ("nightly-report", 86400.0, "error"),
        ("hourly", 3600.0, "critical"),
    ]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"check_interval_s": 0}, "check_interval_s"),
        ({"renotify_interval_s": -1}, "renotify_interval_s"),
        ({"election.mechanism": "etcd"}, "election.mechanism"),
        ({"sinks.webhook_urls": ["ftp://x"]}, "sinks.webhook_urls[0]"),
        ({"sinks.slack_webhook_url": "not a url"}, "sinks.slack_webhook_url"),
        ({"canary.enabled": True}, "canary.targets"),
        ({"canary.enabled": True, "canary.targets": ["h:1"]}, "canary.api_key"),
        ({"expectations": [{"tenant": "a", "job_id": "j", "interval_s": 0}]},
         "expectations[0].interval_s"),
        ({"expectations": [{"tenant": "", "job_id": "j", "interval_s": 1}]},
         "expectations[0].tenant"),
        ({"expectations": [{"tenant": "a", "job_id": "j", "interval_s": 1, "tolerance_s": -1}]},
         "expectations[0].tolerance_s"),
        ({"expectations": [{"tenant": "a", "job_id": "j", "interval_s": 1},
                           {"tenant": "a", "job_id": "j", "interval_s": 2}]},
         "expectations[1].job_id"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_key(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(WatchdogConfig, env={}, overrides=overrides)
    assert info.value.key == key


def test_lock_key_is_a_stable_signed_64_bit_hash() -> None:
    key = lock_key("chronoshard-watchdog")
    assert key == lock_key("chronoshard-watchdog")
    assert key != lock_key("other")
    assert -(2**63) <= key < 2**63


def test_the_watchdog_imports_nothing_from_the_scheduler() -> None:
    for path in WATCHDOG_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                assert not name.startswith("chronoshard.scheduler"), f"{path.name}: {name}"
    # And at run time nothing pulls it in indirectly.
    code = (
        "import sys, chronoshard.watchdog.service, chronoshard.watchdog.__main__;"
        "bad = [m for m in sys.modules if m.startswith('chronoshard.scheduler')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- WatchdogService request validation ---------------------------------------------------------


def seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    whole = int(value)
    d.seconds, d.nanos = whole, round((value - whole) * 1e9)
    return d


def request(**fields: object) -> watchdog_service_pb2.CreateExpectationRequest:
    base: dict[str, object] = {"job_id": "nightly", "interval": seconds(60)}
    return watchdog_service_pb2.CreateExpectationRequest(**{**base, **fields})  # type: ignore[arg-type]


def test_a_valid_request_with_defaults() -> None:
    spec = spec_from_pb(request(description="  the report  "))
    assert (spec.job_id, spec.interval_s, spec.tolerance_s) == ("nightly", 60.0, 0.0)
    assert spec.severity == "critical" and spec.enabled
    assert spec.description == "the report"
    full = spec_from_pb(
        request(tolerance=seconds(1.5), severity=watchdog_service_pb2.SEVERITY_INFO, enabled=False)
    )
    assert (full.tolerance_s, full.severity, full.enabled) == (1.5, "info", False)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"job_id": ""}, "job_id"),
        ({"job_id": "   "}, "job_id"),
        ({"job_id": "a\nb"}, "job_id"),
        ({"job_id": "x" * 201}, "job_id"),
        ({"interval": None}, "interval"),
        ({"interval": seconds(0)}, "interval"),
        ({"interval": seconds(-5)}, "interval"),
        ({"interval": seconds(400 * 86_400)}, "interval"),
        ({"tolerance": seconds(-0.5)}, "tolerance"),
        ({"severity": 99}, "severity"),
        ({"description": "x" * 1001}, "description"),
    ],
)
def test_malformed_requests_are_refused_naming_the_field(
    fields: dict[str, object], field: str
) -> None:
    if fields.get("interval", "") is None:
        req = watchdog_service_pb2.CreateExpectationRequest(job_id="nightly")
    else:
        req = request(**fields)
    with pytest.raises(InvalidArgument) as info:
        spec_from_pb(req)
    assert info.value.field == field


def test_page_tokens_round_trip_and_foreign_ones_are_refused() -> None:
    assert page_token_from_pb(page_token_to_pb("job/ä")) == "job/ä"
    assert page_token_from_pb("") == ""
    with pytest.raises(InvalidArgument) as info:
        page_token_from_pb("!!!")
    assert info.value.field == "page_token"


# --- the CLI -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0), ("1d", 86400.0), ("-2s", -2.0)],
)
def test_cli_durations(text: str, expected: float) -> None:
    assert cli._duration_s(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "5x", "infs", "nan"])
def test_cli_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(Exception, match="duration"):
        cli._duration_s(text)


def test_cli_expect_without_api_key_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CHRONOSHARD_API_KEY", raising=False)
    assert cli.main(["expect", "ls", "--target", "127.0.0.1:1"]) == cli.EXIT_USAGE
    assert "no API key" in capsys.readouterr().err


def test_watchdog_service_contract() -> None:
    from chronoshard.v1 import watchdog_service_pb2_grpc

    service = watchdog_service_pb2.DESCRIPTOR.services_by_name["WatchdogService"]
    assert service.full_name == "chronoshard.v1.WatchdogService"
    assert {m.name: (m.client_streaming, m.server_streaming) for m in service.methods} == {
        "CreateExpectation": (False, False),
        "ListExpectations": (False, False),
        "DeleteExpectation": (False, False),
        "ListIncidents": (False, False),
    }
    assert callable(watchdog_service_pb2_grpc.add_WatchdogServiceServicer_to_server)
    # `enabled` keeps presence: unset means true, an explicit false must survive the wire.
    sent = request(enabled=False)
    parsed = watchdog_service_pb2.CreateExpectationRequest.FromString(sent.SerializeToString())
    assert parsed.HasField("enabled") and not parsed.enabled
    assert not request().HasField("enabled")
    # Severity names after the prefix are the values stored in expectations.severity.
    names = {
        v.name.removeprefix("SEVERITY_").lower()
        for v in watchdog_service_pb2.Severity.DESCRIPTOR.values
    }
    assert names == {"unspecified", "critical", "error", "warning", "info"}
