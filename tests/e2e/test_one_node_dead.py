"""One scheduler node of three SIGKILLed: clients built with all three targets and the
watchdog's canary carry on with the other two. Real etcd, PostgreSQL, three scheduler
processes, a worker process and a watchdog process with its canary.

The issue: such a client failed 1 of 6 ``GetTask`` calls (and a ``ListTasks``) with
UNAVAILABLE, and the canary raised a critical "could not be submitted" alert while two
nodes served. Here every call kind is made many times through the kill and after it —
by a client that had a connection to the node that dies, and by one built afterwards —
and none may fail; the canary must raise no alert and keep completing. (With every node
dead the canary alert must still fire: tests/e2e/test_watchdog.py checks that.)

A canary whose task lands on the dead node's shards waits for them to move (lease TTL
plus a few seconds), so the canary tolerance here is longer than that, as the default
(30 s against a 10 s TTL) is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from fixtures.waiting import eventually
from harness.history import EFFECTS_DDL
from harness.processes import ManagedProcess, ProcessGroup, SchedulerHandle

from chronoshard import Client, SubmitResult, SyncClient, TaskSpec, TaskStatus
from chronoshard._dev.processes import free_ports
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess

E2E_DIR = Path(__file__).resolve().parent
LEASE_TTL_S = 3.0
CANARY_INTERVAL_S = 1.0
CANARY_TOLERANCE_S = 12.0
CHECK_S = 1.0
# Long enough for a canary submitted right after the kill to be judged, and checked.
OBSERVE_S = CANARY_TOLERANCE_S + 2 * CHECK_S
DEAD_LETTERS = 8


@dataclass
class Cluster:
    group: ProcessGroup
    dsn: str
    api_key: str
    nodes: list[SchedulerHandle]
    watchdog: ManagedProcess

    def targets(self) -> list[str]:
        return [n.address for n in self.nodes]

    def logs(self) -> str:
        return self.group.logs() + f"\n==== watchdog\n{self.watchdog.log()}"


@pytest.fixture
def cluster(fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path) -> Iterator[Cluster]:
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
    api_key = create_tenant(fresh_db_dsn, f"dead-{uuid.uuid4().hex[:8]}").api_key
    canary_key = create_tenant(fresh_db_dsn, f"canary-{uuid.uuid4().hex[:8]}").api_key
    group = ProcessGroup(
        log_dir=tmp_path,
        dsn=fresh_db_dsn,
        etcd_endpoint=etcd.endpoint,
        cluster=f"dead-{uuid.uuid4().hex[:8]}",
        scheduler_env={
            "CHRONOSHARD_ETCD__LEASE_TTL_S": str(LEASE_TTL_S),
            "CHRONOSHARD_ETCD__SELF_FENCE_MARGIN_S": "1",
            "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
        },
    )
    watchdog: ManagedProcess | None = None
    try:
        nodes = [group.start_scheduler(f"node-{i + 1}") for i in range(3)]
        targets = [n.address for n in nodes]
        group.start_worker(
            "worker",
            "e2e_workers:worker",
            targets,
            pythonpath=E2E_DIR,
            E2E_DSN=fresh_db_dsn,
            CHRONOSHARD_API_KEY=api_key,
        )
        (http_port,) = free_ports(1)
        watchdog = ManagedProcess(
            name="watchdog",
            argv=[sys.executable, "-m", "chronoshard.watchdog"],
            env={
                **os.environ,
                "CHRONOSHARD_NODE_ID": "watchdog",
                "CHRONOSHARD_HTTP_LISTEN": f"127.0.0.1:{http_port}",
                "CHRONOSHARD_DATABASE__DSN": fresh_db_dsn,
                "CHRONOSHARD_LOG_FORMAT": "text",
                "CHRONOSHARD_ELECTION__MECHANISM": "none",
                "CHRONOSHARD_CHECK_INTERVAL_S": str(CHECK_S),
                "CHRONOSHARD_CANARY__ENABLED": "true",
                "CHRONOSHARD_CANARY__TARGETS": ",".join(targets),
                "CHRONOSHARD_CANARY__API_KEY": canary_key,
                "CHRONOSHARD_CANARY__INTERVAL_S": str(CANARY_INTERVAL_S),
                "CHRONOSHARD_CANARY__TOLERANCE_S": str(CANARY_TOLERANCE_S),
            },
            log_path=tmp_path / "watchdog.log",
        )
        watchdog.start()
        yield Cluster(group, fresh_db_dsn, api_key, nodes, watchdog)
    finally:
        if watchdog is not None and watchdog.alive():
            watchdog.stop(timeout_s=15)
        group.close()


def _canaries(dsn: str, since: datetime) -> Counter[str]:
    """Statuses of the canaries scheduled since ``since``."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT status FROM canary_executions WHERE scheduled_time >= %s", (since,)
        ).fetchall()
    return Counter(status for (status,) in rows)


def _canary_alerts(dsn: str) -> list[tuple[str, datetime]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT summary, opened_at FROM alerts WHERE kind = 'canary_late'"
        ).fetchall()
    return [(str(summary), opened_at) for summary, opened_at in rows]


def _max_canary_latency_s(dsn: str, since: datetime) -> float | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT max(extract(epoch FROM completed_time - scheduled_time))"
            " FROM canary_executions WHERE scheduled_time >= %s",
            (since,),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


class Calls:
    """Every TaskService call kind through one client, counting outcomes per kind.
    ``dead_letters`` are DEAD_LETTER tasks, one used up by each RetryTask."""

    def __init__(self, name: str, client: Client, dead_letters: list[str]) -> None:
        self.name = name
        self.client = client
        self.dead_letters = dead_letters
        self.ok: Counter[str] = Counter()
        self.failed: list[str] = []
        self._far = datetime.now(UTC) + timedelta(days=1)

    async def _one(self, kind: str, call: Callable[[], Awaitable[object]]) -> object:
        try:
            result = await call()
        except Exception as exc:
            self.failed.append(f"{self.name} {kind}: {type(exc).__name__}: {exc}")
            return None
        self.ok[kind] += 1
        return result

    async def reads(self, task_id: str) -> None:
        await self._one("get", lambda: self.client.get(task_id, attempts=True))
        await self._one("list", lambda: self.client.list(page_size=5))

    async def every_kind(self, i: int) -> None:
        c = self.client
        later = self._far + timedelta(seconds=i)
        key = f"{self.name}-{i}"
        submitted = await self._one("submit", lambda: c.submit("e2e.record", at=later))
        await self._one("submit keyed", lambda: c.submit("e2e.record", idempotency_key=key))
        specs = [TaskSpec("e2e.record", at=later), TaskSpec("e2e.record", idempotency_key=key)]
        await self._one("submit_batch", lambda: _batch_ok(c, specs))
        await self._one("iter_tasks", lambda: _first_pages(c))
        if isinstance(submitted, SubmitResult):
            await self.reads(submitted.task.id)
            await self._one("cancel", lambda: c.cancel(submitted.task.id, reason="e2e"))
        if self.dead_letters:
            task_id = self.dead_letters.pop()
            await self._one("retry", lambda: c.retry(task_id, delay_s=3600))


async def _batch_ok(client: Client, specs: list[TaskSpec]) -> None:
    results = await client.submit_batch(specs)
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise errors[0]


async def _first_pages(client: Client) -> None:
    """The first three pages of two (stopping early, and closing the generator)."""
    async with contextlib.aclosing(client.iter_tasks(page_size=2)) as tasks:
        seen = 0
        async for _ in tasks:
            seen += 1
            if seen >= 6:
                return


async def test_clients_and_the_canary_carry_on_with_one_node_of_three_dead(
    cluster: Cluster,
) -> None:
    dsn = cluster.dsn
    started = datetime.now(UTC)
    try:
        await eventually(
            lambda: _canaries(dsn, started)["COMPLETED"] >= 2,
            timeout_s=60,
            what="canaries completing on the healthy cluster",
        )
    except AssertionError:
        print(cluster.logs())
        raise
    async with Client(cluster.targets(), api_key=cluster.api_key, timeout_s=5) as client:
        # Setup: tasks that end DEAD_LETTER, for RetryTask after the kill.
        # strict: a task due now is otherwise jittered by up to two minutes.
        failing = [
            await client.submit("e2e.fatal", max_retries=0, strict_timing=True)
            for _ in range(DEAD_LETTERS)
        ]
        dead_letters = [r.task.id for r in failing]

        async def all_dead_lettered() -> bool:
            tasks = [await client.get(t) for t in dead_letters]
            return all(t.status is TaskStatus.DEAD_LETTER for t in tasks)

        try:
            await eventually(all_dead_lettered, timeout_s=30, what="the setup tasks dead-lettered")
        except AssertionError:
            print(cluster.logs())
            raise
        # Connections to every node are open: the victim's too.
        calls = Calls("old", client, dead_letters[:5])
        await calls.every_kind(-1)
        assert calls.failed == []

        # Reads keep going while the node is killed under them.
        stop_reading = asyncio.Event()

        async def read_through_the_kill() -> None:
            while not stop_reading.is_set():
                await calls.reads(dead_letters[0])

        reader = asyncio.create_task(read_through_the_kill())
        await asyncio.sleep(0.5)
        victim = cluster.nodes[1]
        victim.process.kill()
        killed_at = datetime.now(UTC)
        killed = time.monotonic()
        await asyncio.sleep(1.0)
        stop_reading.set()
        await reader

        # Every call kind, many times, from this client and from one built now.
        async with Client(cluster.targets(), api_key=cluster.api_key, timeout_s=5) as fresh:
            new_calls = Calls("new", fresh, dead_letters[5:])
            i = 0
            while time.monotonic() - killed < OBSERVE_S:
                await calls.every_kind(i)
                await new_calls.every_kind(i)
                i += 1
        sync_failed: list[str] = []
        with SyncClient(cluster.targets(), api_key=cluster.api_key, timeout_s=5) as sync:
            for task_id in dead_letters:
                for call in (functools.partial(sync.get, task_id), sync.list):
                    try:
                        await asyncio.to_thread(call)
                    except Exception as exc:
                        sync_failed.append(f"sync: {type(exc).__name__}: {exc}")

    failed = calls.failed + new_calls.failed + sync_failed
    assert failed == [], f"{len(failed)} calls failed:\n" + "\n".join(failed)
    print("calls after the kill:", dict(calls.ok), dict(new_calls.ok))
    assert calls.ok["get"] >= 20 and calls.ok["submit"] >= 5
    assert set(calls.ok) == {
        "submit",
        "submit keyed",
        "submit_batch",
        "get",
        "list",
        "iter_tasks",
        "cancel",
        "retry",
    }

    # The canary: no alert, and canaries scheduled after the kill keep completing.
    await eventually(
        lambda: _canaries(dsn, killed_at + timedelta(seconds=2))["COMPLETED"] >= 5,
        timeout_s=30,
        what="canaries completing after the kill",
    )
    after = _canaries(dsn, killed_at)
    latency = _max_canary_latency_s(dsn, killed_at)
    print(f"canaries since the kill: {dict(after)}; slowest {latency} s")
    assert after["FAILED"] == 0 and after["LATE"] == 0, (after, cluster.watchdog.log())
    assert _canary_alerts(dsn) == [], cluster.watchdog.log()
    # Not even a retry: the client carried each keyed submit over to a live node.
    assert "canary submit failed" not in cluster.watchdog.log()
