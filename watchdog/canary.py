"""Canaries: a real task through the whole path, every canary interval.

The active replica records a canary (``canary_executions``: id, scheduled time from the
database clock, status SUBMITTED), then submits a task through the public API exactly as a
user would (:class:`chronoshard.Client`: strict timing, critical priority, the reserved
canary queue, the canary tenant's API key, ``job_id = chronoshard.canary`` so its
completion lands in the ledger), and serves that queue itself with the built-in
:func:`canary_handler` through the worker SDK, in-process. The canary has therefore been
submitted, persisted, preloaded, fired, dispatched, run, completed and recorded by the
scheduler before the watchdog sees it done: the check (:mod:`.checker`) reads its
dispatch from ``task_attempts`` and its completion from ``task_completions`` and judges
it against the tolerance (:func:`~.incidents.canary_condition`).

The submit goes to any node that takes it: the client skips a dead node and carries the
keyed submit over to another when one fails with UNAVAILABLE (see
:mod:`chronoshard._failover`). When no node takes it (every node down, a blip of the
network), the same submit — same idempotency key, so never a second canary task — is
tried again with backoff (:func:`resubmit_after_s`) for as long as the canary can still be
on time. Only a canary that no node took within its tolerance is recorded as FAILED, and
it is late at its deadline like any other: with every scheduler node dead the canary
alert fires within one tolerance; with one node of three dead, nothing fires.

The worker is supervised separately: when it crashes it is rebuilt after a pause, and it
never takes the watchdog down with it.

Both reach the nodes over TLS when ``canary.tls`` (the system's roots) or a TLS file
(``canary.tls_ca``, ``canary.tls_cert``/``tls_key`` for nodes that require client
certificates) is set: :func:`canary_tls` reads the files, at start (a file that cannot be
read stops the watchdog, naming its key) and again at every leader term, so a renewed
client certificate is used from the next term on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chronoshard.client import Client
from chronoshard.client import TLSConfig as ClientTLS
from chronoshard.clock import Clock
from chronoshard.errors import ChronoshardError
from chronoshard.settings import ConfigError
from chronoshard.types import Priority
from chronoshard.watchdog.config import CanaryConfig
from chronoshard.watchdog.errors import DatabaseUnavailable
from chronoshard.watchdog.notifier import RetryPolicy, backoff_s
from chronoshard.watchdog.store import WatchdogStore
from chronoshard.worker import TaskContext, Worker
from chronoshard.worker import TLSConfig as WorkerTLS

log = logging.getLogger(__name__)

CANARY_TASK_TYPE = "chronoshard.canary"
CANARY_JOB_ID = "chronoshard.canary"
WORKER_RESTART_S = 2.0
WORKER_SLOTS = 4
MAX_SUBMIT_TIMEOUT_S = 10.0
RESUBMIT = RetryPolicy(initial_backoff_s=0.2, max_backoff_s=2.0)
"""Pauses between submits of one canary that no node took (``max_attempts`` unused: the
canary's tolerance bounds the attempts)."""


def canary_tls(config: CanaryConfig) -> tuple[ClientTLS | None, WorkerTLS | None]:
    """The TLS of the canary's client and of its worker (None, None: plaintext).

    Raises:
        ConfigError: a TLS file cannot be read (the error names its key).
    """
    if not config.uses_tls:
        return None, None
    files: dict[str, bytes | None] = {}
    for setting, path in (
        ("canary.tls_ca", config.tls_ca),
        ("canary.tls_cert", config.tls_cert),
        ("canary.tls_key", config.tls_key),
    ):
        try:
            files[setting] = None if path is None else Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(setting, f"cannot read {path}: {exc.strerror or exc}") from None
    ca, cert, key = files["canary.tls_ca"], files["canary.tls_cert"], files["canary.tls_key"]
    return ClientTLS(ca, cert, key), WorkerTLS(ca, cert, key)


def resubmit_after_s(failures: int, left_s: float, u: float) -> float | None:
    """The pause before submitting a canary again after ``failures`` failed submits, with
    ``left_s`` seconds left until its deadline (``u`` in [0, 1) jitters it); None when no
    further attempt would start before the deadline."""
    pause = backoff_s(failures, RESUBMIT, u)
    return pause if pause < left_s else None


async def canary_handler(ctx: TaskContext) -> dict[str, Any]:
    """The built-in canary handler: it only has to run and return. Any worker may
    register it for the canary queue (``worker.register(CANARY_TASK_TYPE,
    canary_handler)``)."""
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    return {"canary_id": payload.get("canary_id"), "worker_id": ctx.worker_id}


@dataclass
class CanaryStats:
    submitted: int = 0
    submit_failures: int = 0
    completed_on_time: int = 0
    late: int = 0
    worker_restarts: int = 0


class CanaryRunner:
    """The leader's canary work: the submit loop and the canary worker. ``run`` until
    cancelled (the end of the leader's term)."""

    def __init__(
        self,
        config: CanaryConfig,
        store: WatchdogStore,
        clock: Clock,
        stats: CanaryStats,
        *,
        node_id: str,
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self.stats = stats
        self._node_id = node_id
        self._timeout_s = min(MAX_SUBMIT_TIMEOUT_S, config.tolerance_s)
        self._client_tls, self._worker_tls = canary_tls(config)

    async def run(self) -> None:
        client = Client(
            list(self._config.targets),
            api_key=self._config.api_key,
            tls=self._client_tls or False,
            timeout_s=self._timeout_s,
        )
        worker_task = asyncio.create_task(self._serve(), name="canary-worker")
        try:
            await self._submit_loop(client)
        finally:
            worker_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker_task
            await client.close()

    async def _submit_loop(self, client: Client) -> None:
        interval = self._config.interval_s
        next_at = self._clock.monotonic()
        while True:
            try:
                await self.submit_one(client)
            except DatabaseUnavailable:
                raise  # the session is gone: the term ends
            except Exception:
                # A bug in one submit must not end canaries (or the term) for good.
                self.stats.submit_failures += 1
                log.exception("canary submit failed unexpectedly")
            # A fixed cadence: a slow submit does not push every later canary back.
            next_at += interval
            now = self._clock.monotonic()
            if next_at < now:
                next_at = now + interval
            await asyncio.sleep(next_at - now)

    async def submit_one(self, client: Client) -> uuid.UUID:
        """Record and submit one canary, again and again while it can be on time. A
        submit that never succeeded is recorded, never raised; DatabaseUnavailable (the
        session is gone) is raised."""
        canary_id = uuid.uuid4()
        scheduled_at = await self._store.insert_canary(canary_id)
        deadline = self._clock.monotonic() + self._config.tolerance_s
        self.stats.submitted += 1
        failures = 0
        while True:
            try:
                result = await client.submit(
                    CANARY_TASK_TYPE,
                    {"canary_id": str(canary_id), "node_id": self._node_id},
                    at=scheduled_at,
                    strict_timing=True,
                    priority=Priority.CRITICAL,
                    queue=self._config.queue,
                    job_id=CANARY_JOB_ID,
                    idempotency_key=f"canary-{canary_id}",
                    max_retries=0,
                    timeout_s=self._config.tolerance_s,
                )
                break
            except (ChronoshardError, ValueError, OSError) as exc:
                failures += 1
                left_s = deadline - self._clock.monotonic()
                retryable = isinstance(exc, ChronoshardError) and exc.retryable
                pause = resubmit_after_s(failures, left_s, random.random()) if retryable else None
                fields = {"canary_id": str(canary_id), "error": str(exc), "attempt": failures}
                if pause is None:
                    self.stats.submit_failures += 1
                    log.warning("canary submit failed", extra=fields)
                    await self._store.set_canary_failed(canary_id, f"submit failed: {exc}")
                    return canary_id
                log.info("canary submit failed; trying again", extra=fields)
                await asyncio.sleep(pause)
        await self._store.set_canary_task(canary_id, uuid.UUID(str(result.task.id)))
        return canary_id

    async def _serve(self) -> None:
        """Run the canary worker; rebuild it after a pause whenever it stops."""
        while True:
            worker = Worker(
                list(self._config.targets),
                queues=[self._config.queue],
                slots=WORKER_SLOTS,
                api_key=self._config.api_key,
                tls=self._worker_tls,
                drain_grace_s=1.0,
                drain_stop_s=0.5,
                worker_id=f"watchdog-canary-{self._node_id}-{uuid.uuid4().hex[:6]}",
            )
            worker.register(CANARY_TASK_TYPE, canary_handler, timeout_s=self._config.tolerance_s)
            try:
                await worker.run()
                log.warning("canary worker stopped; restarting")
            except asyncio.CancelledError:
                # run() closes the worker's streams itself when cancelled.
                raise
            except Exception:
                log.exception("canary worker crashed; restarting")
            self.stats.worker_restarts += 1
            await asyncio.sleep(WORKER_RESTART_S)
