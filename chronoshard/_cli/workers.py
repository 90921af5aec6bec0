"""``chronoshard workers ls``: the cluster's worker sessions
(``AdminService.ListWorkerSessions``), through :class:`chronoshard.SyncClient`.

One row per worker and node it has a stream with: what the worker serves, its slots, the
credits it granted that node and the tasks that node sent it, since when. A tenant's key
lists the sessions its own workers opened; an operator's key lists every session (and
its tenant). Turning sessions into rows is the pure :func:`session_rows`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from chronoshard._cli import output
from chronoshard._cli.common import (
    EXIT_OK,
    Command,
    add_api,
    client,
    positive_int,
)
from chronoshard.types import WorkerSession

DEFAULT_LIST_LIMIT = 200
MAX_LIST_PAGE = 1000
SESSION_HEADERS = (
    "WORKER",
    "NODE",
    "TENANT",
    "QUEUES",
    "TYPES",
    "SLOTS",
    "CREDITS",
    "RUNNING",
    "CONNECTED",
    "STATE",
)

LS_EPILOG = """\
examples:
  chronoshard workers ls
  chronoshard workers ls --node dev-node-2
  chronoshard workers ls --worker billing-7f3a -o json

A worker holds one stream with every node: it is listed once per node. CREDITS are the
ones it granted that node and the node has not used yet (what the node may still send
it); RUNNING the tasks that node sent it and it has not settled. Both are as of each
node's last record of its sessions (every workers.session_timeout_s / 3), live for the
node that answered. A tenant's key lists its own workers (those that connect with its
key); an operator's key lists every worker and its tenant."""


def session_rows(sessions: Sequence[WorkerSession], now: datetime) -> list[list[object]]:
    """The table's rows: one per session, as :data:`SESSION_HEADERS` names them."""
    rows: list[list[object]] = []
    for s in sessions:
        rows.append(
            [
                s.worker_id,
                s.node_id,
                s.tenant_name or s.tenant_id,
                ",".join(s.queues),
                ",".join(s.task_types),
                s.slots,
                s.credits,
                s.running,
                output.relative(s.connected_at, now),
                "draining" if s.draining else "serving",
            ]
        )
    return rows


def configure_ls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worker", metavar="WORKER_ID", help="only this worker (exact id)")
    parser.add_argument("--node", metavar="NODE_ID", help="only the sessions with this node")
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIST_LIMIT,
        help=f"show at most this many (default {DEFAULT_LIST_LIMIT})",
    )
    add_api(parser)


def run_ls(args: argparse.Namespace, out: TextIO) -> int:
    found: list[WorkerSession] = []
    token: str | None = None
    with client(args) as c:
        while True:
            page = c.list_worker_sessions(
                worker_id=args.worker,
                node_id=args.node,
                page_size=min(args.limit + 1, MAX_LIST_PAGE),
                page_token=token,
            )
            found.extend(page.sessions)
            if len(found) > args.limit or page.next_page_token is None:
                break
            token = page.next_page_token
    found, more = found[: args.limit], len(found) > args.limit
    if args.output == "json":
        data = {"sessions": found, "more": more, "restricted": page.restricted}
        print(output.dumps(data), file=out)
        return EXIT_OK
    if found:
        print(output.table(SESSION_HEADERS, session_rows(found, datetime.now(UTC))), file=out)
    else:
        print("no worker sessions", file=out)
    if more:
        print(f"(first {len(found)} shown; more match: raise --limit or narrow it)", file=out)
    if page.restricted:
        print("(this tenant's workers only: an operator key lists every worker)", file=out)
    return EXIT_OK


WORKER_COMMANDS: dict[str, Command] = {
    "ls": Command(
        "list the worker sessions: which worker is connected to which node, serving what",
        configure_ls,
        run_ls,
        LS_EPILOG,
    ),
}
