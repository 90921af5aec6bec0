"""The watchdog end to end: real scheduler, worker and two watchdog replica processes,
real PostgreSQL and etcd, and a real HTTP server receiving the alerts.

A job runs every 2 s (this test submits a task with ``job_id = heartbeat`` every 2 s
through the public client; a worker process runs it) and is watched with interval 2 s,
tolerance 1 s, checked every second. Canaries go every second with a 3 s tolerance. The
tests run in file order on one cluster, each leaving it healthy for the next, except the
last, which kills the scheduler.

Bounds are named and measured: an alert must arrive within interval + tolerance + check
interval + 1 s of the fault (stopping the scheduler, killing the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from e2e.watchdog_receiver import Receiver, running_receiver
from fixtures.waiting import eventually
from harness.cluster import Cluster, running_cluster
from harness.processes import ManagedProcess

from chronoshard import ChronoshardError, Client, cli
from chronoshard._dev.processes import free_ports
from chronoshard.services import EtcdProcess

NODE = "node-1"
JOB = "heartbeat"
JOB_EVERY_S = 2.0
INTERVAL_S = 2.0
TOLERANCE_S = 1.0
CHECK_S = 1.0
SLACK_S = 1.0
ALERT_BOUND_S = INTERVAL_S + TOLERANCE_S + CHECK_S + SLACK_S
CANARY_INTERVAL_S = 1.0
CANARY_TOLERANCE_S = 3.0
# A canary submitted just after the fault is late one tolerance later, and seen at the
# next check.
CANARY_ALERT_BOUND_S = CANARY_INTERVAL_S + CANARY_TOLERANCE_S + CHECK_S + SLACK_S
# After the fault is repaired: a worker reconnects, the next job task runs, the next check.
RESOLVE_BOUND_S = 15.0
ELECTION_RETRY_S = 0.5
HANDOVER_BOUND_S = ELECTION_RETRY_S + 2.0

MEASURED: dict[str, float] = {}


@dataclass
class Replica:
    process: ManagedProcess
    http: str

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://{self.http}/healthz", timeout=2) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read()))
        except OSError:
            return None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=2) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        for line in self.metrics().splitlines():
            series, _, value = line.rpartition(" ")
            if series == name or (
                series.startswith(name + "{")
                and all(f'{k}="{v}"' in series for k, v in labels.items())
            ):
                return float(value)
        return 0.0


@dataclass
class Watchdogs:
    """Two watchdog replicas watching the job of the cluster's tenant (and canaries), and
    the receiver their alerts reach."""

    cluster: Cluster
    receiver: Receiver
    replicas: list[Replica]

    @property
    def job_dedup_key(self) -> str:
        return f"chronoshard/job/{self.cluster.tenant.tenant.id}/{JOB}"

    def leader(self) -> Replica | None:
        leaders = [r for r in self.replicas if r.process.alive() and _role(r) == "leader"]
        assert len(leaders) <= 1, "two watchdog replicas lead at once"
        return leaders[0] if leaders else None

    def job_events(self, event: str | None = None) -> list[Any]:
        return [r for r in self.receiver.received(event=event) if r.dedup_key == self.job_dedup_key]

    def canary_events(self, event: str | None = None) -> list[Any]:
        return self.receiver.received(event=event, kind="canary_late")

    def start_user_worker(self, name: str) -> ManagedProcess:
        """A worker running the watched job's tasks (``watchdog_workers.py``)."""
        return self.cluster.start_worker(name, "watchdog_workers:worker")

    def logs(self) -> str:
        parts = [self.cluster.logs()]
        parts += [f"==== {r.process.name}\n{r.process.log()}" for r in self.replicas]
        return "\n".join(parts)


def _role(replica: Replica) -> str | None:
    health = replica.health()
    return None if health is None else str(health.get("role"))


def _start_replica(name: str, config_path: Path, dsn: str, log_dir: Path) -> Replica:
    (port,) = free_ports(1)
    http = f"127.0.0.1:{port}"
    process = ManagedProcess(
        name=name,
        argv=[sys.executable, "-m", "chronoshard.watchdog", "--config", str(config_path)],
        env={
            **os.environ,
            "CHRONOSHARD_NODE_ID": name,
            "CHRONOSHARD_HTTP_LISTEN": http,
            "CHRONOSHARD_DATABASE__DSN": dsn,
        },
        log_path=log_dir / f"{name}.log",
    )
    process.start()
    return Replica(process, http)


def _write_config(
    path: Path, *, node: str, canary_key: str, webhook: str, dead: str, job_tenant: str
) -> None:
    path.write_text(
        f"""
log_format = "text"
check_interval_s = {CHECK_S}
renotify_interval_s = 0
[database]
outage_tolerance_s = 30
[election]
lock_name = "e2e-{uuid.uuid4().hex}"
retry_interval_s = {ELECTION_RETRY_S}
[sinks]
webhook_urls = ["{webhook}", "{dead}"]
max_attempts = 3
initial_backoff_s = 0.1
max_backoff_s = 0.5
timeout_s = 2
[canary]
enabled = true
targets = ["{node}"]
api_key = "{canary_key}"
interval_s = {CANARY_INTERVAL_S}
tolerance_s = {CANARY_TOLERANCE_S}
[[expectations]]
tenant = "{job_tenant}"
job_id = "from-config"
interval_s = 86400
"""
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def cluster(
    db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One scheduler node (``NODE``); its workers are the watched job's, started by
    ``watchdogs``."""
    with running_cluster(
        db_dsn,
        etcd.endpoint,
        tmp_path_factory.mktemp("watchdog-e2e-logs"),
        nodes=1,
        workers=0,
        scheduler_env={
            "CHRONOSHARD_GRPC__KEEPALIVE_TIME_S": "1",
            "CHRONOSHARD_GRPC__KEEPALIVE_TIMEOUT_S": "1",
            "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
        },
    ) as running:
        yield running


@pytest.fixture(scope="module")
def watchdogs(cluster: Cluster, receiver: Receiver) -> Iterator[Watchdogs]:
    canary_tenant = cluster.new_tenant(f"wd-canary-{uuid.uuid4().hex[:8]}")
    log_dir = cluster.group.log_dir
    replicas: list[Replica] = []
    try:
        (dead_port,) = free_ports(1)
        config_path = log_dir / "watchdog.toml"
        _write_config(
            config_path,
            node=cluster.nodes[NODE].address,
            canary_key=canary_tenant.api_key,
            webhook=receiver.url("/hook"),
            dead=f"http://127.0.0.1:{dead_port}/nobody-listens",
            job_tenant=cluster.tenant.tenant.name,
        )
        replicas = [
            _start_replica(name, config_path, cluster.dsn, log_dir) for name in ("wd-a", "wd-b")
        ]
        made = Watchdogs(cluster, receiver, replicas)
        made.start_user_worker("user-worker-1")
        yield made
    finally:
        for replica in replicas:
            with contextlib.suppress(Exception):
                replica.process.resume()
                replica.process.stop(timeout_s=15)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def job_loop(cluster: Cluster, watchdogs: Watchdogs) -> AsyncIterator[list[float]]:
    """Submit one task of the watched job every 2 s for the whole module (failures, while
    the scheduler is stopped or dead, are expected and ignored). Yields the monotonic
    times of the submits that succeeded."""
    submitted: list[float] = []

    async def loop() -> None:
        address = cluster.nodes[NODE].address
        async with Client(address, api_key=cluster.api_key, timeout_s=1.0) as client:
            while True:
                with contextlib.suppress(ChronoshardError):
                    await client.submit("e2e.job", job_id=JOB, strict_timing=True, max_retries=0)
                    submitted.append(time.monotonic())
                await asyncio.sleep(JOB_EVERY_S)

    task = asyncio.create_task(loop())
    yield submitted
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# pytest-asyncio: the module-scoped async fixture and the tests share the module's loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _completions(dsn: str, tenant: uuid.UUID) -> list[float]:
    """Ages in seconds (database clock) of the job's completions, newest first."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM now() - completed_at) FROM task_completions"
            " WHERE tenant_id = %s AND job_id = %s ORDER BY completed_at DESC",
            (tenant, JOB),
        )
        return [float(age) for (age,) in await cur.fetchall()]


async def _notified(dsn: str, alert_id: int) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT last_notified_at FROM alerts WHERE id = %s", (alert_id,))
        row = await cur.fetchone()
    return row is not None and row[0] is not None


def _cli(*args: str) -> tuple[int, str]:
    import io

    out = io.StringIO()
    return cli.main(list(args), out=out), out.getvalue()


async def _show_logs_on_failure(watchdogs: Watchdogs, coro: Any) -> Any:
    try:
        return await coro
    except AssertionError:
        print(watchdogs.logs())
        raise


async def test_expectations_are_registered_and_malformed_ones_refused(
    cluster: Cluster, watchdogs: Watchdogs, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ["--target", cluster.nodes[NODE].address, "--api-key", cluster.api_key]
    code, _ = await asyncio.to_thread(
        _cli, "expect", "add", JOB, "--every", "2s", "--tolerance", "1s", *api
    )
    assert code == 0, capsys.readouterr().err

    code, _ = await asyncio.to_thread(_cli, "expect", "add", "bad", "--every", "0s", *api)
    assert code == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "(field interval)" in err and "must be positive" in err
    stranger = ["--target", cluster.nodes[NODE].address, "--api-key", "cs_" + "x" * 43]
    code, _ = await asyncio.to_thread(_cli, "expect", "add", "bad", "--every", "5s", *stranger)
    assert code == cli.EXIT_FAILURE
    assert "UNAUTHENTICATED" in capsys.readouterr().err

    # The watchdog's config file registered one too, once a replica led.
    await eventually(lambda: watchdogs.leader() is not None, timeout_s=30, what="a leader")
    code, out = await asyncio.to_thread(_cli, "expect", "ls", *api)
    assert code == 0
    lines = sorted(out.splitlines())
    assert lines[0].split() == [
        "from-config",
        "every",
        "1d",
        "+0s",
        "critical",
        "enabled",
        "config",
    ]
    assert lines[1].split()[:5] == [JOB, "every", "2s", "+1s", "critical"]


async def test_healthy_cluster_canaries_complete_and_nothing_alerts(
    cluster: Cluster, watchdogs: Watchdogs, job_loop: list[float]
) -> None:
    async def healthy() -> bool:
        leader = watchdogs.leader()
        return (
            leader is not None
            and leader.metric("chronoshard_watchdog_canaries_completed_total") >= 3
            and len(await _completions(cluster.dsn, cluster.tenant.tenant.id)) >= 2
        )

    await _show_logs_on_failure(watchdogs, eventually(healthy, timeout_s=45, what="healthy flow"))
    leader = watchdogs.leader()
    assert leader is not None
    assert leader.metric("chronoshard_watchdog_canary_latency_seconds_count") >= 3
    latency_sum = leader.metric("chronoshard_watchdog_canary_latency_seconds_sum")
    MEASURED["canary_latency_mean_s"] = latency_sum / leader.metric(
        "chronoshard_watchdog_canary_latency_seconds_count"
    )
    assert watchdogs.receiver.received() == [], "an alert in a healthy cluster"
    assert leader.metric("chronoshard_watchdog_overdue_jobs") == 0
    standby = [r for r in watchdogs.replicas if r is not leader]
    assert [_role(r) for r in standby] == ["standby"]


async def test_killed_user_worker_alerts_the_job_while_canaries_still_pass(
    cluster: Cluster, watchdogs: Watchdogs, job_loop: list[float]
) -> None:
    leader = watchdogs.leader()
    assert leader is not None
    [worker] = [w for w in cluster.group.workers if w.alive()]
    canaries_before = leader.metric("chronoshard_watchdog_canaries_completed_total")
    worker.kill()
    killed = time.monotonic()

    await _show_logs_on_failure(
        watchdogs,
        watchdogs.receiver.wait_for(
            "job trigger",
            lambda: bool(watchdogs.job_events("trigger")),
            timeout_s=ALERT_BOUND_S + 10,
        ),
    )
    [trigger] = watchdogs.job_events("trigger")
    MEASURED["worker_killed_alert_s"] = trigger.at - killed
    assert trigger.at - killed <= ALERT_BOUND_S, f"{trigger.at - killed:.2f} s"
    # Canaries (own queue, own worker) keep completing on time: no canary alert, even a
    # canary tolerance after the fault.
    await asyncio.sleep(max(0.0, killed + CANARY_TOLERANCE_S + CHECK_S - time.monotonic()))
    assert leader.metric("chronoshard_watchdog_canaries_completed_total") > canaries_before
    assert watchdogs.canary_events() == []

    watchdogs.start_user_worker("user-worker-2")
    restarted = time.monotonic()
    await _show_logs_on_failure(
        watchdogs,
        watchdogs.receiver.wait_for(
            "job resolve", lambda: bool(watchdogs.job_events("resolve")), timeout_s=RESOLVE_BOUND_S
        ),
    )
    MEASURED["worker_restarted_resolve_s"] = watchdogs.job_events("resolve")[0].at - restarted
    assert [e.event for e in watchdogs.job_events()] == ["trigger", "resolve"]


async def test_stopped_scheduler_alerts_once_and_resolves_once(
    cluster: Cluster, watchdogs: Watchdogs, job_loop: list[float]
) -> None:
    before = len(watchdogs.job_events())
    cluster.nodes[NODE].process.pause()
    stopped = time.monotonic()
    try:
        await _show_logs_on_failure(
            cluster,
            watchdogs.receiver.wait_for(
                "job trigger",
                lambda: len(watchdogs.job_events()) > before,
                timeout_s=ALERT_BOUND_S + 10,
            ),
        )
    finally:
        cluster.nodes[NODE].process.resume()
    resumed = time.monotonic()
    trigger = watchdogs.job_events()[before]
    assert trigger.event == "trigger"
    MEASURED["scheduler_stopped_alert_s"] = trigger.at - stopped
    assert trigger.at - stopped <= ALERT_BOUND_S, f"{trigger.at - stopped:.2f} s"

    await _show_logs_on_failure(
        watchdogs,
        watchdogs.receiver.wait_for(
            "job resolve",
            lambda: len(watchdogs.job_events("resolve")) >= 2,
            timeout_s=RESOLVE_BOUND_S,
        ),
    )
    MEASURED["scheduler_resumed_resolve_s"] = watchdogs.job_events("resolve")[-1].at - resumed
    # Exactly one trigger and one resolve for this incident, in that order.
    assert [e.event for e in watchdogs.job_events()[before:]] == ["trigger", "resolve"]
    # The scheduler being stopped stalled canaries too; they recover on their own.
    await watchdogs.receiver.wait_for(
        "canaries healthy again",
        lambda: len(watchdogs.canary_events("resolve")) == len(watchdogs.canary_events("trigger")),
        timeout_s=RESOLVE_BOUND_S,
    )


async def test_killing_the_active_replica_hands_over_without_lost_or_duplicate_alerts(
    cluster: Cluster, watchdogs: Watchdogs, job_loop: list[float]
) -> None:
    # Run alone, this test may start before the replicas elected a leader.
    leader = await eventually(watchdogs.leader, timeout_s=15, what="a watchdog leader")
    [standby] = [r for r in watchdogs.replicas if r is not leader]
    before = len(watchdogs.job_events())
    for worker in cluster.group.workers:
        worker.kill()
    await watchdogs.receiver.wait_for(
        "job trigger", lambda: len(watchdogs.job_events()) > before, timeout_s=ALERT_BOUND_S + 10
    )
    trigger = watchdogs.job_events()[before]
    assert trigger.node_id == leader.process.name
    # Delivery is at least once: a replica killed between the receiver's 200 and writing
    # down that it notified (a few milliseconds) leaves its successor to send it again.
    # Kill it once the delivery is on record, which is the guarantee being tested.
    await eventually(
        lambda: _notified(cluster.dsn, trigger.body["alert"]["id"]),
        timeout_s=5,
        what="the trigger recorded as delivered",
    )

    leader.process.kill()
    killed = time.monotonic()
    await eventually(lambda: _role(standby) == "leader", timeout_s=10, what="standby leads")
    MEASURED["replica_handover_s"] = time.monotonic() - killed
    assert time.monotonic() - killed <= HANDOVER_BOUND_S
    # The successor sees the open, notified alert: it sends nothing for it...
    checks = standby.metric("chronoshard_watchdog_checks_total")
    await eventually(
        lambda: standby.metric("chronoshard_watchdog_checks_total") >= checks + 3,
        timeout_s=10,
        what="the successor checks",
    )
    assert len(watchdogs.job_events()) == before + 1, [
        (e.event, e.node_id, e.body["alert"]["id"], round(e.at - killed, 2))
        for e in watchdogs.job_events()
    ]
    # ...until the job runs again: then it resolves the incident, once.
    watchdogs.start_user_worker("user-worker-3")
    await _show_logs_on_failure(
        watchdogs,
        watchdogs.receiver.wait_for(
            "job resolve",
            lambda: len(watchdogs.job_events()) > before + 1,
            timeout_s=RESOLVE_BOUND_S,
        ),
    )
    events = watchdogs.job_events()[before:]
    assert [e.event for e in events] == ["trigger", "resolve"]
    assert events[1].node_id == standby.process.name
    assert events[1].body["alert"]["id"] == events[0].body["alert"]["id"]

    # The unreachable second webhook was retried and counted; it never stopped the loop.
    await eventually(
        lambda: standby.metric("chronoshard_watchdog_alerts_failed_total", sink="webhook-2") >= 1,
        timeout_s=5,
        what="the failed delivery to the unreachable webhook counted",
    )
    assert standby.metric("chronoshard_watchdog_delivery_retries_total", sink="webhook-2") >= 2
    assert standby.metric("chronoshard_watchdog_check_failures_total") == 0


async def test_with_every_scheduler_node_dead_the_canary_alert_fires(
    cluster: Cluster, watchdogs: Watchdogs, job_loop: list[float]
) -> None:
    leader = watchdogs.leader()
    assert leader is not None
    canary_triggers = len(watchdogs.canary_events("trigger"))
    cluster.nodes[NODE].process.kill()
    killed = time.monotonic()
    await _show_logs_on_failure(
        watchdogs,
        watchdogs.receiver.wait_for(
            "canary trigger",
            lambda: len(watchdogs.canary_events("trigger")) > canary_triggers,
            timeout_s=CANARY_ALERT_BOUND_S + 10,
        ),
    )
    alert = watchdogs.canary_events("trigger")[-1]
    MEASURED["schedulers_dead_canary_alert_s"] = alert.at - killed
    assert alert.at - killed <= CANARY_ALERT_BOUND_S, f"{alert.at - killed:.2f} s"
    assert leader.metric("chronoshard_watchdog_canary_submit_failures_total") >= 1
    health = leader.health()
    assert health is not None and health["status"] == "ok"  # the watchdog itself is fine
    print("watchdog e2e measurements:", {k: round(v, 3) for k, v in MEASURED.items()})
