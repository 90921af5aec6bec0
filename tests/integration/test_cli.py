"""The ``chronoshard`` CLI against one real node (a scheduler process of
``harness.cluster``, real PostgreSQL and etcd) and an in-process worker: what scripts
rely on — JSON output, exit codes, errors on stderr."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fixtures.cli_runs import run
from fixtures.waiting import eventually
from harness.cluster import Cluster, running_cluster

from chronoshard import cli
from chronoshard.services import EtcdProcess
from chronoshard.worker import TaskContext, Worker

SHARDS = 4
NODE = "node-1"


@pytest.fixture
def cluster(
    fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path, no_cli_env: None
) -> Iterator[Cluster]:
    """One scheduler node (``NODE``) and no worker process: the tests that need one run
    the in-process ``worker``."""
    with running_cluster(
        fresh_db_dsn,
        etcd.endpoint,
        tmp_path,
        nodes=1,
        workers=0,
        shard_count=SHARDS,
        scheduler_env={
            "CHRONOSHARD_ETCD__LEASE_TTL_S": "5",
            "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
        },
    ) as running:
        yield running


async def _key(cluster: Cluster, name: str, *, operator: bool = False) -> str:
    """The API key of another tenant of the cluster's database."""
    made = await asyncio.to_thread(cluster.new_tenant, name, operator=operator)
    return made.api_key


def _common(cluster: Cluster, key: str | None = None) -> list[str]:
    """The arguments every call to the node takes: its address and an API key (the
    cluster's tenant's unless given)."""
    return ["--target", cluster.nodes[NODE].address, "--api-key", key or cluster.api_key]


@pytest.fixture
async def worker(cluster: Cluster) -> AsyncIterator[Worker]:
    """Serves cli.ok (completes) and cli.fail (always fails) for the cluster's tenant."""
    made = Worker(cluster.targets(), api_key=cluster.api_key, worker_id="cli-worker", slots=4)

    @made.task("cli.ok")
    async def ok(ctx: TaskContext) -> dict[str, Any]:
        return {"got": ctx.payload}

    @made.task("cli.fail")
    async def fail(ctx: TaskContext) -> None:
        raise RuntimeError(f"cli.fail attempt {ctx.attempt} fails on purpose")

    running = asyncio.create_task(made.run())
    try:
        yield made
    finally:
        made.stop()
        await running


async def test_submit_get_ls_cancel_and_tenancy(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    common = _common(cluster)
    first = await run(
        capsys, "submit", "cli.later", "--payload", '{"a": 1}', "--in", "2h",
        "--job-id", "j1", "--idempotency-key", "k1", "--priority", "bulk",
        "--max-retries", "5", "--timeout", "90s", "-o", "json", *common,
    )  # fmt: skip
    assert first.code == cli.EXIT_OK, first.err
    submitted = first.json()
    task = submitted["task"]
    assert submitted["created"] is True
    assert (task["type"], task["status"], task["payload"], task["job_id"]) == (
        "cli.later", "SCHEDULED", {"a": 1}, "j1",
    )  # fmt: skip
    assert (task["priority"], task["max_retries"], task["timeout_s"]) == ("bulk", 5, 90.0)
    again = await run(
        capsys, "submit", "cli.later", "--payload", '{"a": 1}', "--in", "2h", "--job-id", "j1",
        "--idempotency-key", "k1", "--priority", "bulk", "--max-retries", "5",
        "--timeout", "90s", "-o", "json", *common,
    )  # fmt: skip
    assert again.code == 0 and again.json()["created"] is False
    assert again.json()["task"]["id"] == task["id"]
    later = (datetime.now(UTC) + timedelta(hours=5)).astimezone(timezone(timedelta(hours=1)))
    second = await run(
        capsys, "submit", "cli.later", "--at", later.isoformat(), "--strict", *common
    )
    assert second.code == 0 and second.out.startswith("submitted ")
    second_id = second.out.split()[1]

    got = await run(capsys, "tasks", "get", task["id"], "-o", "json", *common)
    assert got.code == 0 and got.json()["id"] == task["id"]
    table = await run(capsys, "tasks", "get", task["id"], *common)
    assert "status:" in table.out and "SCHEDULED" in table.out and '{"a": 1}' in table.out

    listed = await run(capsys, "tasks", "ls", "--type", "cli.later", "-o", "json", *common)
    assert [t["id"] for t in listed.json()["tasks"]] == [task["id"], second_id]
    assert listed.json()["more"] is False
    page = await run(capsys, "tasks", "ls", "--limit", "1", "-o", "json", *common)
    assert [t["id"] for t in page.json()["tasks"]] == [task["id"]] and page.json()["more"]
    by_time = await run(capsys, "tasks", "ls", "--until", "+3h", *common)
    assert by_time.code == 0 and task["id"] in by_time.out and second_id not in by_time.out
    by_job = await run(capsys, "tasks", "ls", "--job-id", "j1", "-o", "json", *common)
    assert [t["id"] for t in by_job.json()["tasks"]] == [task["id"]]
    none = await run(capsys, "tasks", "ls", "--status", "dead_letter", *common)
    assert (none.code, none.out) == (0, "no tasks match\n")

    # Another tenant's key sees nothing and touches nothing: "not found", exit code 3.
    theirs = _common(cluster, await _key(cluster, "theirs"))
    for command in (("tasks", "get", task["id"]), ("tasks", "cancel", task["id"])):
        refused = await run(capsys, *command, *theirs)
        assert refused.code == cli.EXIT_NOT_FOUND
        assert "NOT_FOUND/TASK_NOT_FOUND" in refused.err
    assert (await run(capsys, "tasks", "ls", "-o", "json", *theirs)).json()["tasks"] == []

    cancelled = await run(
        capsys, "tasks", "cancel", task["id"], "--reason", "not needed", "-o", "json", *common
    )
    assert cancelled.code == 0
    assert (cancelled.json()["status"], cancelled.json()["last_error"]) == (
        "CANCELLED",
        "not needed",
    )
    repeat = await run(capsys, "tasks", "cancel", task["id"], *common)
    assert (repeat.code, repeat.out) == (0, f"cancelled {task['id']}\n")
    missing = await run(capsys, "tasks", "get", str(uuid.uuid4()), *common)
    assert missing.code == cli.EXIT_NOT_FOUND
    malformed = await run(capsys, "tasks", "get", "not-a-uuid", *common)
    assert malformed.code == cli.EXIT_FAILURE and "INVALID_ARGUMENT" in malformed.err


async def test_keys_and_usage_errors(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = await run(capsys, "tasks", "ls", *_common(cluster, "cs_no-such-key"))
    assert wrong.code == cli.EXIT_FAILURE
    assert "UNAUTHENTICATED" in wrong.err and wrong.out == ""
    nothing = await run(capsys, "submit", "cli.x", "--target", cluster.nodes[NODE].address)
    assert nothing.code == cli.EXIT_USAGE and "no API key" in nothing.err
    listed = await run(capsys, "tasks", "ls", "-o", "json", *_common(cluster))
    assert listed.json()["tasks"] == []  # neither call wrote anything

    common = _common(cluster)
    not_object = await run(capsys, "submit", "cli.x", "--payload", "[1, 2]", *common)
    assert not_object.code == cli.EXIT_USAGE and "JSON object" in not_object.err
    not_json = await run(capsys, "submit", "cli.x", "--payload", "{oops", *common)
    assert not_json.code == cli.EXIT_USAGE and "not JSON" in not_json.err
    refused = await run(capsys, "submit", "", *common)
    assert refused.code == cli.EXIT_FAILURE and "(field type)" in refused.err
    for argv in (
        ["submit", "cli.x", "--at", "2030-01-01T00:00:00", *common],  # no UTC offset
        ["submit", "cli.x", "--in", "soon", *common],
        ["tasks", "ls", "--limit", "0", *common],
        ["tasks", "frobnicate"],
    ):
        with pytest.raises(SystemExit) as exited:
            await run(capsys, *argv)
        assert exited.value.code == cli.EXIT_USAGE
    bad_status = await run(capsys, "tasks", "ls", "--status", "finished", *common)
    assert bad_status.code == cli.EXIT_USAGE and "unknown status" in bad_status.err


async def test_payload_file_wait_attempts_and_retry(
    cluster: Cluster, worker: Worker, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    common = _common(cluster)
    payload = tmp_path / "payload.json"
    payload.write_text('{"n": 7}')
    ok = await run(
        capsys, "submit", "cli.ok", "--payload-file", str(payload), "--strict", "--wait",
        "-o", "json", *common,
    )  # fmt: skip
    assert ok.code == cli.EXIT_OK, ok.err
    assert ok.json()["task"]["status"] == "COMPLETED"
    assert ok.json()["task"]["result"] == {"got": {"n": 7}}

    failed = await run(
        capsys, "submit", "cli.fail", "--max-retries", "0", "--strict", "--wait", *common
    )
    assert failed.code == cli.EXIT_FAILURE
    assert "ended DEAD_LETTER" in failed.err and "fails on purpose" in failed.err
    task_id = failed.out.split()[1]

    history = await run(capsys, "tasks", "get", task_id, "--attempts", "-o", "json", *common)
    attempts = history.json()["attempts"]
    assert [(a["attempt"], a["state"], a["worker_id"]) for a in attempts] == [
        (1, "FAILED", "cli-worker")
    ]
    table = await run(capsys, "tasks", "get", task_id, "--attempts", *common)
    assert "FAILED" in table.out and "cli-worker" in table.out and "on purpose" in table.out

    retried = await run(capsys, "tasks", "retry", task_id, "--in", "2h", "-o", "json", *common)
    assert retried.code == cli.EXIT_OK and retried.json()["status"] == "SCHEDULED"
    completed_id = ok.json()["task"]["id"]
    refused = await run(capsys, "tasks", "retry", completed_id, *common)
    assert refused.code == cli.EXIT_FAILURE and "INVALID_TRANSITION" in refused.err
    finished = await run(capsys, "tasks", "cancel", completed_id, *common)
    assert finished.code == cli.EXIT_FAILURE and "TASK_ALREADY_FINISHED" in finished.err

    # tasks resolve: only an OUTCOME_UNKNOWN task (made so here as the reconciler would).
    nothing = await run(capsys, "tasks", "resolve", completed_id, "--retry", *common)
    assert nothing.code == cli.EXIT_FAILURE and "NOTHING_TO_RESOLVE" in nothing.err
    with pytest.raises(SystemExit) as no_choice:  # --retry or --fail is required
        await run(capsys, "tasks", "resolve", completed_id, *common)
    assert no_choice.value.code == cli.EXIT_USAGE
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE tasks SET status = 'OUTCOME_UNKNOWN', lease_expires_at = NULL WHERE id = %s",
            (task_id,),
        )
    held = await run(capsys, "tasks", "ls", "--status", "outcome_unknown", "-o", "json", *common)
    assert [t["id"] for t in held.json()["tasks"]] == [task_id]
    resolved = await run(
        capsys, "tasks", "resolve", task_id, "--fail", "--reason", "done by hand", *common
    )
    assert resolved.code == cli.EXIT_OK, resolved.err
    assert resolved.out.strip() == f"resolved {task_id}: DEAD_LETTER"


async def test_status_and_drain(
    cluster: Cluster, worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    done = await run(capsys, "submit", "cli.ok", "--strict", "--wait", *_common(cluster))
    assert done.code == 0, done.err
    ops = _common(cluster, await _key(cluster, "ops", operator=True))
    status = await run(capsys, "status", "-o", "json", *ops)
    assert status.code == 0, status.err
    report = status.json()
    [node] = report["nodes"]
    assert node["node_id"] == NODE and node["metrics_error"] is None
    assert node["metrics"]["worker_sessions"] >= 1
    assert node["metrics"]["dispatched"] >= 1 and node["metrics"]["lateness_p50_s"] is not None
    assert report["shard_count"] == SHARDS and report["unowned_shards"] == []
    assert report["restricted"] is False
    assert sorted(s["shard"] for s in report["shards"]) == list(range(SHARDS))
    assert all(s["epoch"] > 0 and s["node_id"] == node["node_id"] for s in report["shards"])
    table = await run(capsys, "status", "--shards", *ops)
    assert node["node_id"] in table.out and "serving" in table.out and "EPOCH" in table.out
    # A tenant's key: the nodes, and why there is no more.
    tenants = await run(capsys, "status", *_common(cluster))
    assert tenants.code == 0, tenants.err
    assert NODE in tenants.out and "serving" in tenants.out and "EPOCH" not in tenants.out
    assert "not an operator's" in tenants.out
    restricted = await run(capsys, "status", "-o", "json", *_common(cluster))
    assert restricted.json()["restricted"] is True and restricted.json()["shards"] == []

    node_id = node["node_id"]
    denied = await run(capsys, "drain", node_id, *_common(cluster))
    assert denied.code == cli.EXIT_FAILURE and "PERMISSION_DENIED" in denied.err
    after = await run(capsys, "status", "-o", "json", *_common(cluster))
    assert after.json()["nodes"][0]["draining"] is False
    unknown = await run(capsys, "drain", "no-such-node", *ops)
    assert unknown.code == cli.EXIT_NOT_FOUND
    drained = await run(capsys, "drain", node_id, "-o", "json", *ops)
    assert drained.code == 0 and drained.json() == {"node_id": node_id, "draining": True}
    shown = await run(capsys, "status", "-o", "json", *_common(cluster))
    assert shown.json()["nodes"][0]["draining"] is True
    denied = await run(capsys, "undrain", node_id, *_common(cluster))
    assert denied.code == cli.EXIT_FAILURE and "PERMISSION_DENIED" in denied.err
    undrained = await run(capsys, "undrain", node_id, *ops)
    assert undrained.code == 0 and undrained.out.strip() == f"undrained {node_id}"
    back = await run(capsys, "status", "-o", "json", *_common(cluster))
    assert back.json()["nodes"][0]["draining"] is False


async def test_workers_ls(
    cluster: Cluster, worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    async def listed() -> Any:
        shown = await run(capsys, "workers", "ls", "-o", "json", *_common(cluster))
        assert shown.code == cli.EXIT_OK, shown.err
        return shown.json() if shown.json()["sessions"] else None

    mine = await eventually(listed, timeout_s=10, what="the worker's session")
    assert mine["restricted"] is True and mine["more"] is False
    [session] = mine["sessions"]
    assert (session["worker_id"], session["node_id"], session["slots"]) == ("cli-worker", NODE, 4)
    assert session["task_types"] == ["cli.fail", "cli.ok"] and session["queues"] == ["default"]
    assert session["tenant_name"] == cluster.tenant.tenant.name

    ops = _common(cluster, await _key(cluster, "ops-workers", operator=True))
    table = await run(capsys, "workers", "ls", *ops)
    assert table.code == cli.EXIT_OK, table.err
    assert "WORKER" in table.out and "CREDITS" in table.out and "cli-worker" in table.out
    assert cluster.tenant.tenant.name in table.out and "tenant's workers only" not in table.out
    other = await run(capsys, "workers", "ls", *_common(cluster, await _key(cluster, "other")))
    assert other.out.splitlines()[0] == "no worker sessions"
    assert "tenant's workers only" in other.out
    bad = await run(capsys, "workers", "ls", "--worker", "x" * 201, *_common(cluster))
    assert bad.code == cli.EXIT_FAILURE
    assert "INVALID_ARGUMENT" in bad.err and "worker_id: must be at most 200" in bad.err


async def test_tenants_on_the_database(
    fresh_db_dsn: str, capsys: pytest.CaptureFixture[str], no_cli_env: None
) -> None:
    made = await run(
        capsys, "tenants", "create", "acme", "--operator", "--dsn", fresh_db_dsn, "-o", "json"
    )
    assert made.code == 0
    assert made.json()["api_key"].startswith("cs_") and made.json()["operator"] is True
    taken = await run(capsys, "tenants", "create", "acme", "--dsn", fresh_db_dsn)
    assert taken.code == cli.EXIT_FAILURE and "already exists" in taken.err
    rotated = await run(
        capsys, "tenants", "create", "acme", "--rotate", "--no-operator", "--dsn", fresh_db_dsn
    )
    assert rotated.code == 0 and "(operator)" not in rotated.out
    listed = await run(capsys, "tenants", "ls", "--dsn", fresh_db_dsn, "-o", "json")
    [acme] = [t for t in listed.json() if t["name"] == "acme"]
    assert acme["operator"] is False
    no_dsn = await run(capsys, "tenants", "ls")
    assert no_dsn.code == cli.EXIT_USAGE and cli.DSN_ENV in no_dsn.err


def test_help_teaches_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["submit", "--help"], ["tasks", "ls", "--help"], ["dev", "--help"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 0
        text = capsys.readouterr().out
        assert "examples:" in text or "getting started:" in text
        assert "exit codes:" in text
