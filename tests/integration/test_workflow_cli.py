"""``chronoshard workflows`` and the client's workflow methods against one real node (a
scheduler process of ``harness.cluster``, real PostgreSQL and etcd), no worker: the
tasks of a run stay where the scheduler put them, so every state read back is the
API's own.

What the node wrote is read back with plain SQL (``workflow_runs``, ``workflow_tasks``,
``task_dependencies``, ``tasks``), not only from what the CLI printed; a refused file
must print the message naming the place at fault, exit non-zero, and write nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fixtures.cli_runs import run
from harness.cluster import Cluster, running_cluster

from chronoshard import cli
from chronoshard.client import Client
from chronoshard.errors import FailedPreconditionError, InvalidArgumentError
from chronoshard.services import EtcdProcess
from chronoshard.types import TaskSpec, TaskStatus, WorkflowState, WorkflowTask

NODE = "node-1"

DIAMOND = """\
name: diamond
idempotency_key: diamond-1
delay: 1d  # past the preloader's lookahead (1 h): the tasks stay SCHEDULED
tasks:
  - {ref: fetch, type: records.fetch, payload: {day: 2030-01-02}, timeout: 10m}
  - {ref: left, type: records.left, after: fetch}
  - {ref: right, type: records.right, after: [fetch], priority: bulk}
  - {ref: join, type: records.join, trigger_rule: all_done}
edges:
  - [left, join]
  - {parent: right, child: join}
"""

CYCLE = """\
{"name": "loop", "tasks": [
  {"ref": "a", "type": "t"}, {"ref": "b", "type": "t", "after": ["a"]},
  {"ref": "c", "type": "t", "after": ["b"]}],
 "edges": [["c", "a"]]}
"""


@pytest.fixture
def cluster(
    fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path, no_cli_env: None
) -> Iterator[Cluster]:
    """One scheduler node owning every shard, and no worker process."""
    with running_cluster(
        fresh_db_dsn,
        etcd.endpoint,
        tmp_path,
        nodes=1,
        workers=0,
        shard_count=4,
        scheduler_env={"CHRONOSHARD_ETCD__LEASE_TTL_S": "5"},
    ) as running:
        yield running


def _common(cluster: Cluster, key: str | None = None) -> list[str]:
    return ["--target", cluster.nodes[NODE].address, "--api-key", key or cluster.api_key]


def sql(cluster: Cluster, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]  # a test's literal SQL
        return cur.fetchall() if cur.description else []


def counts(cluster: Cluster) -> tuple[int, int, int, int]:
    """Rows in workflow_runs, workflow_tasks, task_dependencies, and tasks of a run."""
    [row] = sql(
        cluster,
        "SELECT (SELECT count(*) FROM workflow_runs), (SELECT count(*) FROM workflow_tasks),"
        " (SELECT count(*) FROM task_dependencies),"
        " (SELECT count(*) FROM tasks WHERE workflow_id IS NOT NULL)",
    )
    return (row[0], row[1], row[2], row[3])


def statuses(cluster: Cluster, workflow_id: str) -> dict[str, str]:
    """Each ref's task status, read from the tables."""
    rows = sql(
        cluster,
        "SELECT w.ref, t.status FROM workflow_tasks w JOIN tasks t ON t.id = w.task_id"
        " WHERE w.workflow_id = %s",
        workflow_id,
    )
    return {ref: status for ref, status in rows}


async def test_submit_get_ls_cancel_retry(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    common = _common(cluster)
    before = datetime.now(UTC)
    diamond = tmp_path / "diamond.yaml"
    diamond.write_text(DIAMOND, encoding="utf-8")

    made = await run(capsys, "workflows", "submit", str(diamond), "-o", "json", *common)
    assert made.code == cli.EXIT_OK, made.err
    created = made.json()
    workflow = created["workflow"]
    assert created["created"] is True
    assert (workflow["name"], workflow["state"]) == ("diamond", "RUNNING")
    assert (workflow["task_count"], workflow["edge_count"]) == (4, 4)
    starts = datetime.fromisoformat(workflow["scheduled_at"])  # delay: 1d
    assert before + timedelta(days=1) <= starts <= datetime.now(UTC) + timedelta(days=1)
    assert sorted(created["task_ids"]) == ["fetch", "join", "left", "right"]
    assert counts(cluster) == (1, 4, 4, 4)
    edges = sql(
        cluster,
        "SELECT p.ref, c.ref FROM task_dependencies d"
        " JOIN workflow_tasks p ON p.task_id = d.parent_task_id"
        " JOIN workflow_tasks c ON c.task_id = d.child_task_id ORDER BY 1, 2",
    )
    assert edges == [("fetch", "left"), ("fetch", "right"), ("left", "join"), ("right", "join")]
    assert sql(cluster, "SELECT ref, trigger_rule FROM workflow_tasks ORDER BY ref") == [
        ("fetch", "all_success"),
        ("join", "all_done"),
        ("left", "all_success"),
        ("right", "all_success"),
    ]
    fetch_id = created["task_ids"]["fetch"]
    [(payload,)] = sql(cluster, "SELECT payload FROM tasks WHERE id = %s", fetch_id)
    assert payload == {"day": "2030-01-02"}  # a YAML date stays the string it reads as

    # The same file again: its idempotency key returns the run created first.
    again = await run(capsys, "workflows", "submit", str(diamond), *common)
    assert again.code == cli.EXIT_OK, again.err
    assert again.out.startswith(f"already created (idempotency key) workflow {workflow['id']} ")
    assert counts(cluster) == (1, 4, 4, 4)

    got = await run(capsys, "workflows", "get", workflow["id"], "-o", "json", *common)
    assert got.code == cli.EXIT_OK, got.err
    detail = got.json()
    refs = [t["ref"] for t in detail["tasks"]]
    assert refs[0] == "fetch" and refs[-1] == "join"  # parents before children
    assert {t["task"]["status"] for t in detail["tasks"]} == {"SCHEDULED"}
    by_ref = {t["ref"]: t for t in detail["tasks"]}
    assert by_ref["right"]["task"]["priority"] == "bulk"
    assert by_ref["fetch"]["task"]["timeout_s"] == 600.0
    assert by_ref["join"]["trigger_rule"] == "all_done"
    assert len(detail["edges"]) == 4 and detail["workflow"]["state"] == "RUNNING"
    shown = await run(capsys, "workflows", "get", workflow["id"], *common)
    assert shown.code == cli.EXIT_OK, shown.err
    lines = shown.out.splitlines()
    assert "tasks:           4 (SCHEDULED 4)" in lines
    drawing = lines[lines.index("layer 0") :]
    assert drawing[1].split()[:3] == ["fetch", "SCHEDULED", fetch_id]
    assert drawing[2] == "layer 1"
    assert {line.split()[0] for line in drawing[3:5]} == {"left", "right"}
    assert drawing[5] == "layer 2"
    assert drawing[6].split()[0] == "join" and "<- " in drawing[6] and "[all_done]" in drawing[6]
    assert "(waits for 2)" in drawing[6]

    listed = await run(capsys, "workflows", "ls", "-o", "json", *common)
    assert listed.code == cli.EXIT_OK, listed.err
    assert [w["id"] for w in listed.json()["workflows"]] == [workflow["id"]]
    assert listed.json()["more"] is False
    failed = await run(capsys, "workflows", "ls", "--state", "failed", *common)
    assert failed.out == "no workflows\n"
    table = await run(capsys, "workflows", "ls", *common)
    assert table.out.splitlines()[0].split()[:3] == ["ID", "NAME", "STATE"]
    assert "diamond" in table.out and "RUNNING" in table.out

    # A running run cannot be retried: the server's reason, readable, exit 1.
    running = await run(capsys, "workflows", "retry", workflow["id"], *common)
    assert running.code == cli.EXIT_FAILURE and running.out == ""
    assert running.err.startswith("chronoshard workflows retry: FAILED_PRECONDITION/")
    assert workflow["id"] in running.err

    cancelled = await run(
        capsys, "workflows", "cancel", workflow["id"], "--reason", "test over", "-o", "json",
        *common,
    )  # fmt: skip
    assert cancelled.code == cli.EXIT_OK, cancelled.err
    assert cancelled.json()["cancelled"] == 4 and cancelled.json()["stopping"] == 0
    assert cancelled.json()["workflow"]["state"] == "CANCELLED"
    assert set(statuses(cluster, workflow["id"]).values()) == {"CANCELLED"}
    assert sql(cluster, "SELECT DISTINCT last_error FROM tasks WHERE workflow_id IS NOT NULL") == [
        ("test over",)
    ]
    twice = await run(capsys, "workflows", "cancel", workflow["id"], *common)
    assert twice.code == cli.EXIT_OK
    assert twice.out == f"workflow {workflow['id']} is CANCELLED: nothing to cancel\n"

    # A finished run retries from its failures on: here every task, back to SCHEDULED.
    retried = await run(capsys, "workflows", "retry", workflow["id"], *common)
    assert retried.code == cli.EXIT_OK, retried.err
    assert retried.out == (
        f"retrying workflow {workflow['id']}: 4 tasks back to SCHEDULED; now RUNNING\n"
    )
    # fetch, whose parents (none) all completed, is due at once: the node may preload it.
    reopened = statuses(cluster, workflow["id"])
    assert reopened["fetch"] in ("SCHEDULED", "PRELOADED")
    assert {reopened[ref] for ref in ("left", "right", "join")} == {"SCHEDULED"}

    # Another tenant sees none of it and changes nothing.
    theirs = _common(cluster, (await asyncio.to_thread(cluster.new_tenant, "theirs")).api_key)
    assert (await run(capsys, "workflows", "ls", "-o", "json", *theirs)).json()["workflows"] == []
    for command in ("get", "cancel", "retry"):
        refused = await run(capsys, "workflows", command, workflow["id"], *theirs)
        assert refused.code == cli.EXIT_NOT_FOUND, (command, refused.err)
        assert "NOT_FOUND" in refused.err
    unchanged = statuses(cluster, workflow["id"])
    assert unchanged["fetch"] in ("SCHEDULED", "PRELOADED")
    assert {unchanged[ref] for ref in ("left", "right", "join")} == {"SCHEDULED"}


async def test_refused_files_write_nothing(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    common = _common(cluster)
    cyclic = tmp_path / "loop.json"
    cyclic.write_text(CYCLE, encoding="utf-8")
    refused = await run(capsys, "workflows", "submit", str(cyclic), *common)
    assert refused.code == cli.EXIT_FAILURE and refused.out == ""
    assert "INVALID_ARGUMENT/" in refused.err and "(field edges): " in refused.err
    assert "a cycle: " in refused.err
    for ref in ("a", "b", "c"):
        assert f"{ref} -> " in refused.err
    assert counts(cluster) == (0, 0, 0, 0)

    # The server names a task by its index in the request, which is the file's.
    bad_ref = tmp_path / "bad.yaml"
    bad_ref.write_text("name: x\ntasks:\n  - {ref: ok, type: t}\n  - {ref: 'no spaces', type: t}\n")
    named = await run(capsys, "workflows", "submit", str(bad_ref), *common)
    assert named.code == cli.EXIT_FAILURE and "(field tasks[1].ref): " in named.err

    # Unknown keys: refused by the CLI before any call, every one named.
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: x\ntasks:\n  - {ref: a, tpye: t}\nedge: []\n")
    usage = await run(capsys, "workflows", "submit", str(typo), *common)
    assert usage.code == cli.EXIT_USAGE
    assert f"{typo}: 3 problems:" in usage.err
    assert "  tasks[0].tpye: unknown key (did you mean type?)" in usage.err
    assert "  edge: unknown key (did you mean edges?)" in usage.err
    assert counts(cluster) == (0, 0, 0, 0)


async def test_the_async_client(cluster: Cluster) -> None:
    async with Client(cluster.targets(), api_key=cluster.api_key) as client:
        tasks = [
            WorkflowTask("first", TaskSpec(type="py.first", payload={"n": 1})),
            WorkflowTask("second", TaskSpec(type="py.second"), "all_done"),  # type: ignore[arg-type]
        ]
        made = await client.create_workflow("py", tasks, [("first", "second")], delay_s=86_400)
        assert made.created and set(made.task_ids) == {"first", "second"}
        detail = await client.get_workflow(made.workflow.id)
        assert [t.ref for t in detail.tasks] == ["first", "second"]
        assert detail.tasks[1].task.unresolved_dependencies == 1
        assert detail.tasks[0].task.payload == {"n": 1}
        assert [w.id async for w in client.iter_workflows(state=WorkflowState.RUNNING)] == [
            made.workflow.id
        ]
        with pytest.raises(FailedPreconditionError):
            await client.retry_workflow(made.workflow.id)
        with pytest.raises(InvalidArgumentError) as cycle:
            await client.create_workflow("c", tasks, [("first", "second"), ("second", "first")])
        assert cycle.value.field == "edges"
        result = await client.cancel_workflow(made.workflow.id)
        assert result.workflow.state is WorkflowState.CANCELLED and result.cancelled == 2
        after = await client.get_workflow(made.workflow.id)
        assert {t.task.status for t in after.tasks} == {TaskStatus.CANCELLED}
