"""A worker whose side effects happen once: the task commit protocol of the SDK.

The scheduler refuses a zombie's heartbeat and settlement (docs/architecture.md#d5): a worker paused
or partitioned past its lease comes back with a stale token, and it stops its attempts on its own
before the lease runs out (worker self-fencing). What a handler writes to
*another* system is its own business, though: two attempts of one task may run (an
idempotent task after a lost lease, an operator's retry of an unknown outcome), and a
thread cannot be stopped. ``chronoshard.worker.commit`` closes that gap:

- ``example.fenced_write`` records a payment in PostgreSQL with ``PostgresEffects``: the
  ``example_side_effects`` row and the task's effect row (``example_effects``, keyed by
  task id, with the token and the result) commit in one transaction. A second attempt
  finds the effect row and gets the stored result back instead of paying again; an
  attempt that lost its lease is refused before it writes (``LeaseLost``), and its
  transaction is bounded by what is left of the lease.
- ``example.published_file`` writes a report with ``publish_file``: staged beside the
  target, fsynced, published with an atomic link only while the lease holds; a second
  attempt finds it published.

The handlers are plain ``def`` functions (they run in the worker's thread pool) to show the
case the helpers are for: a thread cannot be interrupted, so a handler that was paused in
the middle of its work resumes and tries to write even if its lease was lost meanwhile.

Try it against a local cluster::

    chronoshard dev                                  # in one shell; leaves .chronoshard/
    python examples/fenced_side_effect.py worker     # in another
    python examples/fenced_side_effect.py submit --work-s 2

``submit`` waits for the task and prints the stored side effect. Pause the worker
(``kill -STOP``) during the work, wait past the lease (30 s by default) with a second
worker running, then ``kill -CONT`` it: the first worker logs ``lease_lost`` and
``side effect refused``, and the row holds the second worker's write only.

Settings come from the environment, else from ``.chronoshard/cluster.json`` (written by
``chronoshard dev``): ``FENCED_EXAMPLE_DSN`` (else ``CHRONOSHARD_DSN``, else the dev
cluster's database) for the side-effect tables, ``FENCED_EXAMPLE_DIR`` for the published
files, ``CHRONOSHARD_TARGET`` and ``CHRONOSHARD_API_KEY`` for the scheduler,
``CHRONOSHARD_WORKER_ID`` to name the worker. The worker is also loadable by the runner:
``python -m chronoshard.worker fenced_side_effect:worker`` with ``examples/`` on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from chronoshard.worker import LeaseLost, TaskContext, Worker
from chronoshard.worker.commit import PostgresEffects, publish_file

TASK_TYPE = "example.fenced_write"
FILE_TASK_TYPE = "example.published_file"
DEV_CLUSTER_FILE = Path(".chronoshard") / "cluster.json"

log = logging.getLogger("fenced_side_effect")

# The side effect proper. No token guard is needed on it: the effect row makes sure it is
# written once per task, and its primary key would refuse a second write anyway.
CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS example_side_effects (
    task_id uuid PRIMARY KEY,
    fencing_token bigint NOT NULL,
    worker_id text NOT NULL,
    value jsonb NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
)
"""
RECORD_PAYMENT = """
INSERT INTO example_side_effects (task_id, fencing_token, worker_id, value)
VALUES (%(task_id)s, %(token)s, %(worker_id)s, %(value)s)
"""

effects = PostgresEffects("example_effects")


def _dev_cluster() -> dict[str, Any]:
    """What ``chronoshard dev`` wrote about the running cluster, or nothing."""
    try:
        loaded = json.loads(DEV_CLUSTER_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def database_dsn() -> str:
    dsn = os.environ.get("FENCED_EXAMPLE_DSN") or os.environ.get("CHRONOSHARD_DSN")
    dsn = dsn or _dev_cluster().get("dsn")
    if not dsn:
        raise SystemExit(
            "no database: set FENCED_EXAMPLE_DSN, or run `chronoshard dev` in this directory"
        )
    return str(dsn)


def files_dir() -> Path:
    return Path(os.environ.get("FENCED_EXAMPLE_DIR") or Path(".chronoshard") / "example-files")


def create_tables(conn: psycopg.Connection[Any]) -> None:
    """The side-effect table and the effect rows' table (idempotent; autocommit)."""
    # Two processes may race to create them: the loser's IF NOT EXISTS can still collide
    # on the catalog, which means the table exists.
    for create in (
        lambda: conn.execute(CREATE_TABLE),
        lambda: effects.create_table_sync(conn),
    ):
        with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            create()


def build_worker() -> Worker:
    worker = Worker(
        [os.environ["CHRONOSHARD_TARGET"]] if os.environ.get("CHRONOSHARD_TARGET") else [],
        slots=int(os.environ.get("FENCED_EXAMPLE_SLOTS", "10")),
        worker_id=os.environ.get("CHRONOSHARD_WORKER_ID") or None,
    )
    worker.register(TASK_TYPE, fenced_write)
    worker.register(FILE_TASK_TYPE, published_file)
    return worker


def _work(ctx: TaskContext) -> None:
    """``payload.work_s`` of waiting stands in for the work; a stop request ends it,
    unless ``payload.blocking`` makes it a blocking call that cannot notice one (the case
    the helpers are for: the write that follows is refused instead)."""
    log.info(
        "working on %s",
        ctx.task_id,
        extra={"task_id": ctx.task_id, "token": ctx.fencing_token, "event": "work_started"},
    )
    work_s = float(ctx.payload.get("work_s", 0))
    if ctx.payload.get("blocking"):
        time.sleep(work_s)
    elif ctx.wait_cancelled_sync(work_s):
        ctx.raise_if_cancelled()


def fenced_write(ctx: TaskContext) -> dict[str, Any]:
    """Do the work, then record the payment once for the task."""
    fields = {"task_id": ctx.task_id, "token": ctx.fencing_token, "worker_id": ctx.worker_id}
    _work(ctx)
    value = {"amount": ctx.payload.get("amount", 0), "attempt": ctx.attempt}

    def record(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        conn.execute(RECORD_PAYMENT, {**fields, "value": json.dumps(value)})
        return {"written": True, "token": ctx.fencing_token}

    try:
        with psycopg.connect(database_dsn(), autocommit=True) as conn:
            done = effects.once_sync(conn, ctx, record)
    except LeaseLost as exc:
        # Lost its lease (paused or cut off past it): another attempt may own the task,
        # or its outcome waits for an operator. Write nothing; settle nothing.
        log.warning(
            "side effect refused: %s", exc, extra={**fields, "event": "side_effect_refused"}
        )
        raise
    if done.replayed:
        log.info(
            "side effect already written by the attempt with token %d",
            done.fencing_token,
            extra={**fields, "event": "side_effect_replayed"},
        )
    else:
        log.info("side effect written", extra={**fields, "event": "side_effect_written"})
    return dict(done.result)


def published_file(ctx: TaskContext) -> dict[str, Any]:
    """Do the work, then publish ``<dir>/<task id>.json`` once for the task."""
    _work(ctx)
    target = files_dir() / f"{ctx.task_id}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"amount": ctx.payload.get("amount", 0), "token": ctx.fencing_token})
    done = publish_file(ctx, target, lambda f: f.write(body.encode()))
    return {"path": str(done.path), "replayed": done.replayed}


worker = build_worker()


# ---- command line ------------------------------------------------------------------------


def _scheduler() -> tuple[str, str | None]:
    cluster = _dev_cluster()
    target = os.environ.get("CHRONOSHARD_TARGET") or next(iter(cluster.get("grpc", [])), None)
    if not target:
        raise SystemExit("no scheduler: set CHRONOSHARD_TARGET, or run `chronoshard dev` here")
    return target, os.environ.get("CHRONOSHARD_API_KEY") or cluster.get("api_key")


def _run_worker() -> int:
    target, api_key = _scheduler()
    with psycopg.connect(database_dsn(), autocommit=True) as conn:
        create_tables(conn)
    worker.set_targets([target])
    worker.set_api_key(api_key)
    return worker.run_sync()


def _submit(work_s: float, amount: int, wait_s: float) -> int:
    from chronoshard.sync_client import SyncClient

    target, api_key = _scheduler()
    with SyncClient(target, api_key=api_key) as client:
        submitted = client.submit(
            TASK_TYPE,
            {"work_s": work_s, "amount": amount},
            strict_timing=True,  # run now, not within the default jitter window
            # Its effect goes through the commit helpers, so a re-run after a lost lease
            # is safe: let the scheduler run it again rather than hold it OUTCOME_UNKNOWN.
            idempotent=True,
        )
        print(f"submitted {submitted.task.id}")
        deadline = time.monotonic() + wait_s
        task = client.get(submitted.task.id)
        while not task.status.is_terminal and time.monotonic() < deadline:
            time.sleep(0.5)
            task = client.get(submitted.task.id)
    print(f"status {task.status.value}, token {task.fencing_token}, result {task.result}")
    with psycopg.connect(database_dsn()) as conn:
        row = conn.execute(
            "SELECT fencing_token, worker_id, value FROM example_side_effects WHERE task_id = %s",
            (uuid.UUID(str(submitted.task.id)),),
        ).fetchone()
    print(f"side effect: {row}")
    return 0 if task.status.is_terminal else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("worker", help="run the worker until SIGTERM/SIGINT")
    submit = commands.add_parser("submit", help="submit one task and wait for it")
    submit.add_argument("--work-s", type=float, default=1.0, help="how long the work takes")
    submit.add_argument("--amount", type=int, default=42)
    submit.add_argument("--wait-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.command == "worker":
        return _run_worker()
    return _submit(args.work_s, args.amount, args.wait_s)


if __name__ == "__main__":
    sys.exit(main())
