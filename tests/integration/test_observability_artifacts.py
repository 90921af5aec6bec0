"""The alert rules and the Grafana dashboard of deploy/, held against promtool and against
the real processes.

``promtool`` (Debian's ``prometheus`` package, installed by ``scripts/system-tools.sh``)
checks the rules and the example Prometheus config, runs the rules' unit tests
(deploy/prometheus/tests/), parses every dashboard query, and lints the /metrics pages of
the node, the watchdog and the SDK worker.
One scheduler node and one watchdog start on this module's database; tasks submitted
through the API run on an SDK worker and one waits in a queue nobody serves, and then each
process's /metrics is scraped once. Every metric a dashboard query or an alert names must
be in those scrapes, and every label a query groups or joins by must be on the series it
names: a renamed metric or label would otherwise leave a blank panel, or an alert that can
never fire.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvloop
import yaml
from fixtures.nodes import node_config, running_node
from fixtures.stores import tenant_with_key
from fixtures.system import promtool
from fixtures.waiting import eventually
from prometheus_client.parser import text_string_to_metric_families

from chronoshard.client import Client
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.services import EtcdProcess
from chronoshard.types import TaskStatus
from chronoshard.watchdog.config import DatabaseConfig, ElectionConfig, WatchdogConfig
from chronoshard.watchdog.service import Watchdog
from chronoshard.worker import TaskContext, Worker

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yaml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yaml"))
DASHBOARD = ROOT / "deploy" / "grafana" / "chronoshard.json"
OPERATIONS = ROOT / "docs" / "operations.md"

SHARDS = 4
ECHO_TASKS = 3
PARKED_QUEUE = "nobody-serves-this"
"""A queue no worker of this module serves: its task stays ready, so the ready gauges
have a labelled series to export."""

METRIC_NAME = re.compile(r"\b(chronoshard_[a-z0-9_]+|process_[a-z0-9_]+|python_[a-z0-9_]+|up)\b")
STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')
LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_]\w*)\s*\)")
PROMETHEUS_OWN = {"up"}
"""Series Prometheus writes itself for every target, not found on any /metrics page."""
TARGET_LABELS = {"instance", "job"}
"""Labels Prometheus adds to every scraped series."""
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


# ---- the real processes, scraped ------------------------------------------------------------


@dataclass(frozen=True)
class Scrapes:
    """The /metrics text of each process, taken while the work below was in place."""

    node: str
    watchdog: str
    worker: str

    def pages(self) -> dict[str, str]:
        return {"scheduler node": self.node, "watchdog": self.watchdog, "worker": self.worker}


def fetch(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
        return text


def sample_sum(text: str, name: str) -> float:
    """The sum of the samples called ``name`` in ``text`` (0 when there are none)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


async def drive_node(node: SchedulerNode) -> tuple[str, str]:
    """Tasks submitted through the API and run by an SDK worker, one parked in a queue no
    worker serves; the node's scrape, taken while the worker is connected and the parked
    task waits, and the worker's own, once it ran the tasks."""
    assert node.addresses is not None
    grpc_address, metrics_address = node.addresses.grpc, node.addresses.metrics
    await eventually(
        lambda: len(node.shards.epochs()) == SHARDS, timeout_s=10, what="all shards claimed"
    )
    _, api_key = await tenant_with_key(node.store, rate_limit_rps=1000.0)
    worker = Worker([grpc_address], api_key=api_key, slots=2, metrics_listen="127.0.0.1:0")

    @worker.task("echo")
    async def echo(ctx: TaskContext) -> dict[str, Any]:
        return dict(ctx.payload)

    running = asyncio.create_task(worker.run())
    try:
        async with Client(grpc_address, api_key=api_key) as client:
            # strict_timing: due now, not spread over the default jitter window.
            submitted = [
                (await client.submit("echo", {"i": i}, strict_timing=True)).task
                for i in range(ECHO_TASKS)
            ]
            await client.submit("echo", {"parked": True}, queue=PARKED_QUEUE, strict_timing=True)

            async def all_completed() -> bool:
                tasks = [await client.get(task.id) for task in submitted]
                return all(task.status is TaskStatus.COMPLETED for task in tasks)

            await eventually(all_completed, timeout_s=15, what="the echo tasks completed")

        async def scraped_with_the_work_in_place() -> str | None:
            text = await asyncio.to_thread(fetch, metrics_address)
            in_place = (
                sample_sum(text, "chronoshard_ready_tasks") >= 1
                and sample_sum(text, "chronoshard_dispatcher_dispatched_total") >= ECHO_TASKS
                and sample_sum(text, "chronoshard_worker_sessions") >= 1
            )
            return text if in_place else None

        node_text = await eventually(
            scraped_with_the_work_in_place,
            timeout_s=10,
            what="a scrape with the parked task ready and the worker connected",
        )
        assert worker.metrics_address is not None
        worker_text = await asyncio.to_thread(fetch, worker.metrics_address)
        assert sample_sum(worker_text, "chronoshard_sdk_attempts_total") >= ECHO_TASKS
        assert sample_sum(worker_text, "chronoshard_sdk_slots") == 2
        return node_text, worker_text
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=10)


async def drive_and_scrape(dsn: str, etcd_endpoint: str) -> Scrapes:
    """The node and the watchdog side by side on one database; both stopped at the end."""
    watchdog = Watchdog(
        WatchdogConfig(
            node_id="wd-observability",
            log_format="text",
            check_interval_s=0.25,
            http_listen="127.0.0.1:0",
            database=DatabaseConfig(dsn=dsn, connect_timeout_s=2, statement_timeout_s=5),
            election=ElectionConfig(lock_name="observability", retry_interval_s=0.1),
        )
    )
    await watchdog.start()
    try:
        async with running_node(node_config(dsn, etcd_endpoint, shard_count=SHARDS)) as node:
            node_text, worker_text = await drive_node(node)
        # Its last-check gauge appears with its first check.
        await eventually(
            lambda: watchdog.check_stats.checks >= 1, timeout_s=10, what="a watchdog check"
        )
        watchdog_text = await asyncio.to_thread(fetch, watchdog.http_address)
    finally:
        await watchdog.stop()
    return Scrapes(node=node_text, watchdog=watchdog_text, worker=worker_text)


@pytest.fixture(scope="module")
def scrapes(db_dsn: str, etcd: EtcdProcess) -> Scrapes:
    # The whole scenario on a loop of its own (uvloop, as in production), once per module:
    # the tests only read what it scraped.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(drive_and_scrape(db_dsn, etcd.endpoint))


# ---- what the deploy files query ------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but the rows, nested in collapsed rows or not."""
    for panel in board["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def variable_queries(board: dict[str, Any]) -> list[str]:
    out = []
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            out.append(query["query"] if isinstance(query, dict) else query)
    return out


def queries() -> dict[str, str]:
    """Every PromQL expression of the deploy files, by where it is."""
    board = dashboard()
    found = {f"alert {rule['alert']}": rule["expr"] for rule in alert_rules()}
    for panel in panels(board):
        for target in panel["targets"]:
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for query in variable_queries(board):
        found[f"variable query {query}"] = query
    return found


def metric_names(expr: str) -> set[str]:
    """The series names ``expr`` selects (string literals, i.e. label values, left out)."""
    return set(METRIC_NAME.findall(STRING_LITERAL.sub('""', expr)))


def grouping_labels(expr: str) -> set[str]:
    return {
        label.strip()
        for labels in LABEL_LIST.findall(expr)
        for label in labels.split(",")
        if label.strip()
    }


def grafana_free(expr: str) -> str:
    """``expr`` with Grafana's variables replaced by what Prometheus would see."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr.replace("$node", ".*")


# ---- what the processes export --------------------------------------------------------------

SERIES_OF_TYPE = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
}


def exported_series(text: str) -> dict[str, set[str]]:
    """Series name -> label names seen on it, of a /metrics page. A family with no sample
    yet (a labelled counter nothing incremented) still names the series its type has."""
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SERIES_OF_TYPE.get(family.type, ("",)):
            exported.setdefault(family.name + suffix, set())
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


def all_exported(scrapes: Scrapes) -> dict[str, set[str]]:
    merged: dict[str, set[str]] = {}
    for text in scrapes.pages().values():
        for name, labels in exported_series(text).items():
            merged.setdefault(name, set()).update(labels)
    return merged


# ---- promtool -------------------------------------------------------------------------------


def run_promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [promtool(), *args], input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    print(f"$ promtool {' '.join(args)} -> {done.returncode}\n{done.stdout}{done.stderr}")
    return done


def test_the_alert_rules_and_the_example_config_pass_promtool_check() -> None:
    assert run_promtool("check", "rules", str(ALERTS)).returncode == 0
    assert run_promtool("check", "config", str(PROMETHEUS / "prometheus.yml")).returncode == 0


def test_the_alert_rules_pass_their_promtool_unit_tests() -> None:
    assert RULE_TESTS, "no unit tests in deploy/prometheus/tests"
    assert run_promtool("test", "rules", *map(str, RULE_TESTS)).returncode == 0


def test_every_alert_has_a_unit_test_where_it_fires_and_one_where_it_does_not() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = {rule["alert"] for rule in alert_rules()}
    assert sorted(alerts - fires) == [], "alerts no unit test sees firing"
    assert sorted(alerts - quiet) == [], "alerts no unit test sees quiet"
    assert sorted((fires | quiet) - alerts) == [], "unit tests of alerts that do not exist"


def test_every_alert_has_a_severity_annotations_and_a_runbook_anchor() -> None:
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', OPERATIONS.read_text()))
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/operations.md" and anchor in anchors, (name, anchor)


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool has no expression checker of its own: each query becomes a recording rule
    of a rule file it checks."""
    exprs = [grafana_free(expr) for where, expr in queries().items() if where.startswith("panel ")]
    assert exprs
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert run_promtool("check", "rules", str(path)).returncode == 0


@pytest.mark.parametrize("page", ["scheduler node", "watchdog", "worker"])
def test_promtool_finds_no_problem_in_a_metrics_page(scrapes: Scrapes, page: str) -> None:
    done = run_promtool("check", "metrics", stdin=scrapes.pages()[page])
    assert done.returncode == 0 and (done.stdout + done.stderr).strip() == ""


# ---- the dashboard --------------------------------------------------------------------------


def test_the_dashboard_is_a_well_formed_grafana_dashboard() -> None:
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variable_queries(board) == [
        "label_values(chronoshard_dispatch_lateness_seconds_bucket, node)"
    ]
    assert variables["node"]["multi"] and variables["node"]["includeAll"]

    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    shown = list(panels(board))
    titles = [panel["title"] for panel in shown]
    assert len(titles) == len(set(titles)), "panel titles repeat"
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    for panel in shown:
        assert panel["datasource"] == datasource, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            assert target["datasource"] == datasource, panel["title"]
            assert target["expr"].strip() and target["refId"], panel["title"]
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]


# ---- the deploy files against the real /metrics ------------------------------------------------


def test_every_metric_the_alerts_and_the_dashboard_query_is_exported(scrapes: Scrapes) -> None:
    exported = all_exported(scrapes)
    missing: dict[str, list[str]] = {}
    for where, expr in queries().items():
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        for name in sorted(names - PROMETHEUS_OWN):
            if name not in exported:
                missing.setdefault(name, []).append(where)
    assert missing == {}, "queried but exported by neither process"


def test_every_label_the_queries_group_by_is_on_the_series_they_name(scrapes: Scrapes) -> None:
    """A ``by (kind)`` on a metric without ``kind`` draws one unlabelled line. Checked
    where the scrape has samples of the metrics an expression names (a labelled counter
    nothing has incremented yet shows no labels)."""
    exported = all_exported(scrapes)
    wrong: dict[str, set[str]] = {}
    for where, expr in queries().items():
        seen = set().union(*(exported.get(name, set()) for name in metric_names(expr)))
        if not seen:
            continue
        unknown = grouping_labels(expr) - seen - TARGET_LABELS - {""}
        if unknown:
            wrong[where] = unknown
    assert wrong == {}
    for query in variable_queries(dashboard()):
        for metric, label in LABEL_VALUES.findall(query):
            assert label in exported.get(metric, set()), query
