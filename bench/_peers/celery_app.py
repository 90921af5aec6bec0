"""Celery's side of the comparison: ``celery -A bench._peers.celery_app worker``.

The broker is ``$BENCH_CELERY_BROKER`` (Redis), the queue ``$BENCH_CELERY_QUEUE`` (one
per run, so no earlier run's messages count). No result backend: nothing reads results,
and storing them would be a cost the other systems do not pay. The worker's prefork
pool size and prefetch multiplier are its command line's (``--concurrency 2
--prefetch-multiplier 4`` in the comparison). A task with an ``eta`` is held by the
worker's main process and handed to the pool at that instant: that is how Celery runs a
task at a given time.
"""

from __future__ import annotations

import os

from celery import Celery

from bench._peers import stamps

BROKER_ENV = "BENCH_CELERY_BROKER"
QUEUE_ENV = "BENCH_CELERY_QUEUE"

app = Celery("bench_peers", broker=os.environ.get(BROKER_ENV, "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "bench-peers"),
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    enable_utc=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.stamp")
def stamp(i: int) -> None:
    stamps.record(i)
