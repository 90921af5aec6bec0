"""A worker whose side effect is fenced by the task's fencing token.

The scheduler refuses a zombie's heartbeat and settlement (DESIGN §5): a worker paused
past its lease comes back with a stale token. It cannot refuse what the handler wrote
to *another* system while it was paused, though. This example closes that gap for a
PostgreSQL table: every write carries ``ctx.fencing_token`` and the table keeps the
highest token that ever wrote the row, so a write from an older attempt changes nothing:

    INSERT ... ON CONFLICT (task_id) DO UPDATE SET ...
     WHERE example_side_effects.fencing_token < EXCLUDED.fencing_token

Each dispatch of a task increments its token, so "older attempt" is exactly "smaller
token". The handler also checks ``ctx.cancelled`` before writing (a revoked attempt
skips the write), but that check races with the revocation; the fence does not.

The handler is a plain ``def`` (it runs in the worker's thread pool) to show the case the
fence is for: a thread cannot be interrupted, so a handler that was paused in the middle
of its work resumes and tries to write even if its token was revoked meanwhile.

Try it against a local cluster::

    chronoshard dev                                  # in one shell; leaves .chronoshard/
    python examples/fenced_side_effect.py worker     # in another
    python examples/fenced_side_effect.py submit --work-s 2

``submit`` waits for the task and prints the stored side effect. Pause the worker
(``kill -STOP``) during the work, wait past the lease (30 s by default) with a second
worker running, then ``kill -CONT`` it: the first worker logs ``side effect refused``
and a ``zombie`` warning, and the row keeps the second worker's write.

Settings come from the environment, else from ``.chronoshard/cluster.json`` (written by
``chronoshard dev``): ``FENCED_EXAMPLE_DSN`` (else ``CHRONOSHARD_DSN``, else the dev
cluster's database) for the side-effect table, ``CHRONOSHARD_TARGET`` and
``CHRONOSHARD_API_KEY`` for the scheduler, ``CHRONOSHARD_WORKER_ID`` to name the worker.
The worker is also loadable by the runner: ``python -m chronoshard.worker
fenced_side_effect:worker`` with ``examples/`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from chronoshard.worker import TaskContext, Worker

TASK_TYPE = "example.fenced_write"
DEV_CLUSTER_FILE = Path(".chronoshard") / "cluster.json"

log = logging.getLogger("fenced_side_effect")

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS example_side_effects (
    task_id uuid PRIMARY KEY,
    fencing_token bigint NOT NULL,
    worker_id text NOT NULL,
    value jsonb NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
)
"""

# The fence: a row is (re)written only by a newer attempt than the one that wrote it.
FENCED_WRITE = """
INSERT INTO example_side_effects AS s (task_id, fencing_token, worker_id, value)
VALUES (%(task_id)s, %(token)s, %(worker_id)s, %(value)s)
ON CONFLICT (task_id) DO UPDATE
   SET fencing_token = EXCLUDED.fencing_token,
       worker_id = EXCLUDED.worker_id,
       value = EXCLUDED.value,
       written_at = now()
 WHERE s.fencing_token < EXCLUDED.fencing_token
"""

STORED_TOKEN = "SELECT fencing_token FROM example_side_effects WHERE task_id = %s"


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


def write_fenced(
    conn: psycopg.Connection[Any], task_id: uuid.UUID, token: int, worker_id: str, value: Any
) -> bool:
    """Write this attempt's side effect; False if a newer attempt already wrote it.

    Repeating the write within one attempt is harmless: the row already holds our token,
    which counts as written.
    """
    params = {
        "task_id": task_id,
        "token": token,
        "worker_id": worker_id,
        "value": json.dumps(value),
    }
    if conn.execute(FENCED_WRITE, params).rowcount == 1:
        return True
    stored = conn.execute(STORED_TOKEN, (task_id,)).fetchone()
    return stored is not None and stored[0] == token


_table_ready = threading.Event()
_table_lock = threading.Lock()


def ensure_table(conn: psycopg.Connection[Any]) -> None:
    """Create the side-effect table once per process (handlers run in many threads)."""
    if _table_ready.is_set():
        return
    with _table_lock:
        if not _table_ready.is_set():
            # Two processes may race to create it: the loser's IF NOT EXISTS can still
            # collide on the catalog, which means the table exists.
            with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                conn.execute(CREATE_TABLE)
            _table_ready.set()


def build_worker() -> Worker:
    worker = Worker(
        [os.environ["CHRONOSHARD_TARGET"]] if os.environ.get("CHRONOSHARD_TARGET") else [],
        slots=int(os.environ.get("FENCED_EXAMPLE_SLOTS", "10")),
        worker_id=os.environ.get("CHRONOSHARD_WORKER_ID") or None,
    )
    worker.register(TASK_TYPE, fenced_write)
    return worker


def fenced_write(ctx: TaskContext) -> dict[str, Any]:
    """Do the work (``payload.work_s`` of waiting stands in for it), then record the
    result in ``example_side_effects`` under this attempt's fencing token."""
    fields = {"task_id": ctx.task_id, "token": ctx.fencing_token, "worker_id": ctx.worker_id}
    log.info("working on %s", ctx.task_id, extra={**fields, "event": "work_started"})
    if ctx.wait_cancelled_sync(float(ctx.payload.get("work_s", 0))):
        ctx.raise_if_cancelled()
    value = {"amount": ctx.payload.get("amount", 0), "attempt": ctx.attempt}
    # Cheap and early, but racy: the token may be revoked right after this check.
    ctx.raise_if_cancelled()
    with psycopg.connect(database_dsn(), autocommit=True) as conn:
        ensure_table(conn)
        written = write_fenced(conn, ctx.task_id, ctx.fencing_token, ctx.worker_id, value)
    if not written:
        log.warning(
            "side effect refused: a newer attempt of %s already wrote it",
            ctx.task_id,
            extra={**fields, "event": "side_effect_refused"},
        )
        # The scheduler will refuse this attempt's completion too (stale token).
        return {"written": False}
    log.info("side effect written", extra={**fields, "event": "side_effect_written"})
    return {"written": True, "token": ctx.fencing_token}


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
        ensure_table(conn)
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
            idempotent=True,  # the fence makes a re-run after a lost lease safe
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
