"""Procrastinate's side of the comparison:
``procrastinate --app bench._peers.procrastinate_app.app worker``.

The database is ``$BENCH_DSN`` (a fresh one per run, with Procrastinate's schema). The
worker's concurrency and polling interval are its command line's. A job deferred with
``schedule_at`` is found by the worker's fetch once that instant has passed, on its next
poll (``--fetch-job-polling-interval``) or notification.
"""

from __future__ import annotations

import os

import procrastinate

from bench._peers import stamps

DSN_ENV = "BENCH_DSN"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(DSN_ENV, ""))
)


@app.task(name="bench.stamp")
async def stamp(i: int) -> None:
    stamps.record(i)
