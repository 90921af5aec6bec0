"""A worker partitioned from every scheduler node by a network namespace (issue 12, item 2).

Worker P runs inside a network namespace made by the test (``ip netns`` + a veth pair on a
private /24; tests/harness/netns.py); two scheduler nodes listen on the host side of the
veth. P's database (its handlers' side effects) stays reachable through a second host
address, while a blackhole route inside the namespace cuts P off from both nodes for
longer than its lease. Worker Q, on the host, takes over what may be taken over.

Five tasks run on P when the cut comes (gates, tests/e2e/partition_workers.py, decide
when a handler goes on):

=========  ==============  =============================================================
task       idempotent      what P's handler does, and what must become of the task
=========  ==============  =============================================================
unknown    no (async)      waits; cancelled when P fences itself; OUTCOME_UNKNOWN, then
                           resolved RETRY during the cut: runs once on Q
failed     no (blocking)   its thread cannot be stopped; its write after the fence is
                           refused; OUTCOME_UNKNOWN, then resolved MARK_FAILED
late       no (async)      writes its effect during the cut, before the fence; its
                           Complete cannot get out: OUTCOME_UNKNOWN until the cut heals,
                           then P's late Complete makes it COMPLETED under token 1
again      yes (async)     cancelled at the fence; re-dispatched to Q lease + margin after
                           its lease ran out, not earlier; its effect commits once on Q
again-b    yes (blocking)  its write after the fence is refused; re-dispatched to Q
=========  ==============  =============================================================

Checked: P fenced itself (handlers cancelled before the node's lease ran out, writes
refused), no effect committed twice and none by an attempt that lost its lease (history
I1/I2 for the completed ones, the effect rows for all), no write under a superseded epoch
(I3), and every re-dispatch or unknown outcome came lease + margin after the lease ran out
(I4: within the reconciler's latency).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fixtures.system import network_namespaces
from fixtures.waiting import eventually
from harness.history import EFFECTS_DDL, check, epoch_regressions, lease_expired_at
from harness.netns import NetworkNamespace, TcpForwarder
from harness.processes import ManagedProcess, ProcessGroup, SchedulerHandle
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chronoshard import Client, Resolution, SubmitResult, Task, TaskSpec
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess
from chronoshard.worker.commit import PostgresEffects

E2E_DIR = Path(__file__).resolve().parent
LEASE_S = 4.0
HEARTBEAT_S = 1.0
LEASE_MARGIN_S = 1.0
# The reconciler acts at lease_expires_at + margin within this (docs/failure-model.md).
REPAIR_LATENCY_BOUND_S = 0.5
WORKER_READY_S = 30.0
# A settlement queued behind a cut gets out within the SDK's resend backoff (at most 5 s)
# after the cut heals, plus a reconnect.
RESEND_BOUND_S = 15.0
SCHEDULER_ENV = {
    "CHRONOSHARD_WORKERS__TASK_LEASE_S": str(LEASE_S),
    "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
    "CHRONOSHARD_WORKERS__LEASE_MARGIN_S": str(LEASE_MARGIN_S),
    "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": "3",
    # A stream whose peer stopped answering is dropped within 2 s.
    "CHRONOSHARD_GRPC__KEEPALIVE_TIME_S": "1",
    "CHRONOSHARD_GRPC__KEEPALIVE_TIMEOUT_S": "1",
}
SETUP_DDL = [
    EFFECTS_DDL,
    "CREATE TABLE partition_gates (name text PRIMARY KEY)",
    "CREATE TABLE partition_ledger (task_id uuid NOT NULL, token bigint NOT NULL,"
    " worker_id text NOT NULL, event text NOT NULL, detail jsonb,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
]
TASKS = {
    # name: (type, idempotent, gate)
    "unknown": ("partition.async", False, None),
    "failed": ("partition.blocking", False, "blocked"),
    "late": ("partition.async", False, "late"),
    "again": ("partition.async", True, None),
    "again-b": ("partition.blocking", True, "blocked"),
}


@dataclass
class Partition:
    ns: NetworkNamespace
    group: ProcessGroup
    nodes: list[SchedulerHandle]
    dsn: str
    inside_dsn: str
    api_key: str

    def worker(self, name: str, *, inside: bool) -> ManagedProcess:
        return self.group.start_worker(
            name,
            "partition_workers:worker",
            [n.address for n in self.nodes],
            pythonpath=E2E_DIR,
            wrap=self.ns.exec_argv if inside else None,
            PARTITION_DSN=self.inside_dsn if inside else self.dsn,
            PARTITION_HOLD="1" if inside else "",
            CHRONOSHARD_WORKER_ID=name,
            CHRONOSHARD_API_KEY=self.api_key,
        )

    async def metric(self, name: str) -> float:
        values = [await asyncio.to_thread(n.metric, name) for n in self.nodes]
        return sum(v or 0.0 for v in values)


@pytest.fixture
def partition(fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path) -> Iterator[Partition]:
    ip = network_namespaces()
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        for ddl in SETUP_DDL:
            conn.execute(ddl)
        # The effect rows of partition_workers.py's commit helper.
        PostgresEffects("partition_effects").create_table_sync(conn)
    api_key = create_tenant(fresh_db_dsn, f"part-{uuid.uuid4().hex[:8]}").api_key
    with NetworkNamespace(ip) as ns:
        params = conninfo_to_dict(fresh_db_dsn)
        forwarder = TcpForwarder(
            (ns.db_address, 0), (str(params.get("host", "127.0.0.1")), int(params["port"]))
        ).start()
        group = ProcessGroup(
            log_dir=tmp_path,
            dsn=fresh_db_dsn,
            etcd_endpoint=etcd.endpoint,
            cluster=f"part-{uuid.uuid4().hex[:8]}",
            shard_count=8,
            scheduler_env=SCHEDULER_ENV,
        )
        try:
            nodes = [group.start_scheduler(f"node-{i}", host=ns.host_address) for i in (1, 2)]
            inside_dsn = make_conninfo(fresh_db_dsn, host=ns.db_address, port=forwarder.port)
            yield Partition(ns, group, nodes, fresh_db_dsn, inside_dsn, api_key)
        finally:
            group.close()
            forwarder.close()


async def _sql(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query.encode(), params)  # type: ignore[arg-type]
        return await cur.fetchall() if cur.description else []


def _row_now(dsn: str, task_id: str) -> Any:
    """For a failure's report: the task row as it is."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT status, fencing_token, worker_id, lease_expires_at, last_error FROM tasks"
            " WHERE id = %s",
            (task_id,),
        ).fetchall()


async def _ledger(dsn: str) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """(task id, event, token) -> its ledger rows."""
    found: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for task_id, token, worker_id, event, detail, at in await _sql(
        dsn, "SELECT task_id::text, token, worker_id, event, detail, at FROM partition_ledger"
    ):
        row = {"worker_id": worker_id, "detail": detail, "at": at}
        found.setdefault((task_id, event, token), []).append(row)
    return found


async def _open_gate(dsn: str, name: str) -> None:
    await _sql(dsn, "INSERT INTO partition_gates (name) VALUES (%s)", name)


def _expired_lease(attempt: Any) -> datetime:
    return lease_expired_at(attempt.error)


async def _wait_logged(process: ManagedProcess, what: str, *needles: str) -> None:
    await eventually(
        lambda: process.logged(*needles), timeout_s=WORKER_READY_S, what=what, interval_s=0.1
    )


async def test_a_partitioned_worker_fences_itself_and_nothing_runs_twice(
    partition: Partition,
) -> None:
    p = partition.worker("part-p", inside=True)
    q: ManagedProcess | None = None
    cut = False
    address = partition.ns.host_address
    ids: dict[str, str] = {}
    try:
        await _wait_logged(p, "P connected", "event=session_open")
        async with Client(
            [n.address for n in partition.nodes], api_key=partition.api_key
        ) as client:
            results = await client.submit_batch(
                [
                    TaskSpec(
                        type=kind,
                        payload={"name": name, "gate": gate},
                        queue="partition",
                        strict_timing=True,
                        idempotent=idempotent,
                        max_retries=0,
                    )
                    for name, (kind, idempotent, gate) in TASKS.items()
                ]
            )
            ids.update(
                (name, r.task.id)
                for name, r in zip(TASKS, results, strict=True)
                if isinstance(r, SubmitResult)
            )
            assert len(ids) == len(TASKS)

            async def all_started_on_p() -> bool:
                rows = await _ledger(partition.dsn)
                return all((ids[n], "started", 1) in rows for n in TASKS)

            await eventually(all_started_on_p, timeout_s=WORKER_READY_S, what="5 runs on P")
            # Q is ready before the cut (P holds every task), so what it takes over shows
            # the reconciler's timing, not Q's start-up.
            q = partition.worker("part-q", inside=False)
            await _wait_logged(q, "Q connected", "event=session_open")

            partition.ns.cut(address)
            cut = True
            # During the cut, P's "late" handler does its effect (the database is
            # reachable, its lease still holds) and cannot report it.
            await _open_gate(partition.dsn, "late")
            fenced = ("unknown", "failed", "again", "again-b")
            for name in fenced:
                await _wait_logged(p, f"P fenced {name}", f"task_id={ids[name]}", "lease_lost")
            # Only now may the blocked threads go on: their writes come after the fence.
            await _open_gate(partition.dsn, "blocked")

            async def statuses(*names: str) -> dict[str, str]:
                return {n: (await client.get(ids[n])).status.value for n in names}

            async def held_and_taken_over() -> bool:
                now = await statuses(*TASKS)
                return now == {
                    "unknown": "OUTCOME_UNKNOWN",
                    "failed": "OUTCOME_UNKNOWN",
                    "late": "OUTCOME_UNKNOWN",
                    "again": "COMPLETED",
                    "again-b": "COMPLETED",
                }

            await eventually(
                held_and_taken_over,
                timeout_s=LEASE_S + LEASE_MARGIN_S + WORKER_READY_S,
                what="non-idempotent tasks held, idempotent ones done by Q",
            )
            held_gauge = await partition.metric("chronoshard_outcome_unknown_tasks")
            entered = await partition.metric("chronoshard_reconciler_outcome_unknown_total")
            rows_in_cut = await _ledger(partition.dsn)
            # Resolved while P is still cut off, so only Q can be given the new attempt:
            # P's handler of "unknown" would hold it forever (no gate), and once P is
            # back it is as likely as Q to be chosen.
            await client.resolve(ids["unknown"], Resolution.RETRY, reason="no effect row")

            partition.ns.heal(address)
            cut = False

            async def late_completed() -> Task | None:
                task = await client.get(ids["late"], attempts=True)
                return task if task.status.value == "COMPLETED" else None

            late = await eventually(
                late_completed, timeout_s=RESEND_BOUND_S, what="P's late Complete accepted"
            )
            await client.resolve(ids["failed"], Resolution.MARK_FAILED, reason="gave up")

            async def resolved() -> bool:
                now = await statuses("unknown", "failed")
                return now == {"unknown": "COMPLETED", "failed": "DEAD_LETTER"}

            await eventually(resolved, timeout_s=30, what="the resolutions applied")
            tasks = {n: await client.get(ids[n], attempts=True) for n in TASKS}

            async def gauge_cleared() -> bool:
                return await partition.metric("chronoshard_outcome_unknown_tasks") == 0

            await eventually(gauge_cleared, timeout_s=15, what="the gauge back to 0")
    except BaseException:
        print(partition.group.logs())
        for name, task_id in ids.items():
            print(name, task_id, _row_now(partition.dsn, task_id))
        raise
    finally:
        if cut:
            partition.ns.heal(address)
        p.kill()
        if q is not None:
            q.kill()

    # P fenced itself: its async handlers were cancelled for the lost lease, before the
    # node's lease ran out (the database's clock on both sides), and its blocked threads'
    # writes were refused. Nothing of P's attempts was committed but "late"'s.
    for name in ("unknown", "again"):
        [cancelled] = rows_in_cut[(ids[name], "cancelled", 1)]
        assert cancelled["worker_id"] == "part-p"
        assert cancelled["detail"] == {"reason": "lease_lost"}
        assert cancelled["at"] <= _expired_lease(tasks[name].attempts[0]), name
    for name in ("failed", "again-b"):
        [refused] = rows_in_cut[(ids[name], "refused", 1)]
        assert refused["worker_id"] == "part-p"
    assert (ids["late"], "committed", 1) in rows_in_cut
    assert not p.logged(f"task_id={ids['late']}", "lease_lost"), "its outcome was decided"

    # Held while its outcome was unknown, counted; then known from P's own report.
    assert held_gauge >= 3 and entered >= 3
    assert late.fencing_token == 1 and late.result == {"token": 1, "replayed": False}
    assert [(a.attempt, a.state.value, a.worker_id) for a in late.attempts] == [
        (1, "SUCCEEDED", "part-p")
    ]
    history = {
        n: [(a.attempt, a.state.value, a.worker_id, a.resolution) for a in tasks[n].attempts]
        for n in TASKS
    }
    assert history["unknown"] == [
        (1, "OUTCOME_UNKNOWN", "part-p", Resolution.RETRY),
        (2, "SUCCEEDED", "part-q", None),
    ]
    assert history["failed"] == [(1, "OUTCOME_UNKNOWN", "part-p", Resolution.MARK_FAILED)]
    for name in ("again", "again-b"):
        assert history[name] == [
            (1, "ABANDONED", "part-p", None),
            (2, "SUCCEEDED", "part-q", None),
        ]
    # I4: given up lease + margin after the lease ran out, not earlier, and at once then.
    for name, given_up in (
        ("again", tasks["again"].attempts[1].entered_at),
        ("again-b", tasks["again-b"].attempts[1].entered_at),
        ("unknown", tasks["unknown"].attempts[0].finished_at),
        ("failed", tasks["failed"].attempts[0].finished_at),
    ):
        assert given_up is not None
        after_s = (given_up - _expired_lease(tasks[name].attempts[0])).total_seconds()
        assert LEASE_MARGIN_S <= after_s <= LEASE_MARGIN_S + REPAIR_LATENCY_BOUND_S, (name, after_s)

    # I1/I2 for every completed task; no effect at all for the one marked failed, none by
    # an attempt of P but "late"'s; I3 for all.
    completed = [uuid.UUID(ids[n]) for n in ("unknown", "late", "again", "again-b")]
    violations = check(partition.dsn, completed, job_ledger=False)
    assert not violations, violations.summary()
    effects = await _sql(
        partition.dsn, "SELECT task_id::text, token, worker_id FROM effects ORDER BY task_id"
    )
    by_task = {task_id: (token, worker) for task_id, token, worker in effects}
    assert len(effects) == len(by_task) == 4, effects
    assert by_task == {
        ids["unknown"]: (2, "part-q"),
        ids["late"]: (1, "part-p"),
        ids["again"]: (2, "part-q"),
        ids["again-b"]: (2, "part-q"),
    }
    assert epoch_regressions(partition.dsn, [uuid.UUID(i) for i in ids.values()]) == []
    print(
        "partition: "
        + json.dumps({n: tasks[n].status.value for n in TASKS})
        + f", held gauge peak {held_gauge:.0f}"
    )
