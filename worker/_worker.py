"""The Worker: the public object users build, register handlers on, run and drain.

Shape of a running worker (all on one event loop, uvloop in production):

- :class:`Topology` keeps one :class:`NodeSession` (a ``Connect`` stream with its own
  reconnect loop) per scheduler node, from ``GetTopology``;
- :class:`Settlements` gets every Ack/Complete/Fail/Release confirmed, on the stream or
  through the unary RPCs;
- :class:`RunManager` answers every message from a node: credits, assignments (one run
  task per accepted one, driving an :class:`Execution`), cancels, revocations, drains.

The Worker owns the lifecycle: ``run()`` supervises the long-running loops (any one
crashing stops the worker, like temporal's ``Worker._run``) and shuts down in the order
written out in :meth:`Worker._shutdown`: stop intake, let tasks finish within the
grace period, release the rest with their checkpoints, flush settlements, close the
loops, streams and channels.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import signal
import socket
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from chronoshard.clock import Clock, SystemClock
from chronoshard.http_endpoint import HttpServer
from chronoshard.wire import DEFAULT_QUEUE
from chronoshard.worker._context import StopReason, TaskContext
from chronoshard.worker._errors import ConfigurationError
from chronoshard.worker._execution import DRAIN_STOP_S, HandlerSpec, handler_spec
from chronoshard.worker._metrics import metrics_server
from chronoshard.worker._runs import RunManager
from chronoshard.worker._settlements import Settlements
from chronoshard.worker._topology import REFRESH_S, Topology
from chronoshard.worker._transport import TLSConfig, Transport

logger = logging.getLogger("chronoshard.worker")

HandlerT = TypeVar("HandlerT", bound=Callable[[TaskContext], Any])

DEFAULT_QUEUES = (DEFAULT_QUEUE,)
DEFAULT_SLOTS = 10
DEFAULT_DRAIN_GRACE_S = 30.0
"""On SIGTERM, how long running tasks may go on before they are asked to stop."""
DRAIN_STOP_MARGIN_S = 2.0
"""After ``drain_stop_s``, how long the releases of stopped handlers may take to queue."""
DRAIN_FLUSH_S = 30.0
"""After the drain, how long to wait for the last settlements to be confirmed. They are
resent with backoff meanwhile, so this covers a PostgreSQL restart (or failover) of up to
about this long: the worker exits 0 once the scheduler has them all."""
CLOSE_S = 3.0
"""The last step (loops, streams, handlers cancelled by a forced stop) waits this long."""
SHUTDOWN_MARGIN_S = DRAIN_STOP_MARGIN_S + DRAIN_FLUSH_S + CLOSE_S
"""What a shutdown adds to ``drain_grace_s + drain_stop_s`` at most (35 s)."""


def shutdown_bound_s(drain_grace_s: float, drain_stop_s: float) -> float:
    """The longest a graceful shutdown takes, signal to exit: every phase is capped.
    70 s with the defaults; the process manager must allow at least this much
    (Kubernetes ``terminationGracePeriodSeconds``, whose default of 30 s is shorter)."""
    return drain_grace_s + drain_stop_s + SHUTDOWN_MARGIN_S


@dataclass(frozen=True)
class DrainReport:
    """How a drain went. ``clean``: nothing left behind (``run_sync`` exits 0)."""

    finished: int  # tasks that ended on their own during the grace period
    released: int  # tasks handed back (Release DRAINING) with their last checkpoint
    unsettled: int  # settlements still without a receipt when the worker gave up
    stuck: int  # handlers still running at exit (a sync one in its thread, or an async one
    # that ignored its cancellation)
    forced: bool  # an immediate stop (second signal) cut the drain short

    @property
    def clean(self) -> bool:
        return self.unsettled == 0 and self.stuck == 0 and not self.forced


class _Signal:
    """A "something changed" notice: the shutdown waits for conditions without polling."""

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None

    def notify(self) -> None:
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)
        self._fut = None

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not condition():
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            if self._fut is None:
                self._fut = loop.create_future()
            await asyncio.wait({self._fut}, timeout=remaining)
        return True


def default_worker_id() -> str:
    """``host-pid-random``: stable for the process, unique in the cluster."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # not on Linux/macOS: the default loop works too
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


class Worker:
    """Runs task handlers for a Chronoshard cluster.

    ::

        worker = Worker(["scheduler:7070"], queues=["default"], slots=10)

        @worker.task("send-email", timeout_s=60)
        async def send_email(ctx: TaskContext) -> dict:
            ...

        worker.run_sync()  # until SIGTERM/SIGINT; drains, exits 0 when clean

    ``slots`` handlers run at once. ``prefetch`` more assignments may be held, each
    starting as soon as a slot frees up, without waiting for a round trip to a node
    (:mod:`._slots`: for many short tasks; a held task does not move to another worker
    with a free slot, so leave it 0 for long ones). Nodes see ``slots + prefetch``.
    """

    def __init__(
        self,
        targets: Sequence[str],
        *,
        queues: Sequence[str] = DEFAULT_QUEUES,
        slots: int = DEFAULT_SLOTS,
        prefetch: int = 0,
        worker_id: str | None = None,
        api_key: str | None = None,
        heartbeat_interval_s: float | None = None,
        drain_grace_s: float = DEFAULT_DRAIN_GRACE_S,
        drain_stop_s: float = DRAIN_STOP_S,
        tls: TLSConfig | bool | None = None,
        clock: Clock | None = None,
        topology_refresh_s: float = REFRESH_S,
        metrics_listen: str | None = None,
    ) -> None:
        if isinstance(targets, str):
            targets = [targets]
        if slots < 1:
            raise ConfigurationError(f"slots must be at least 1, got {slots}")
        if prefetch < 0:
            raise ConfigurationError(f"prefetch must not be negative, got {prefetch}")
        if not queues or isinstance(queues, str) or any(not q for q in queues):
            raise ConfigurationError("queues must be a sequence of non-empty names")
        if heartbeat_interval_s is not None and heartbeat_interval_s <= 0:
            raise ConfigurationError("heartbeat_interval_s must be positive")
        if drain_grace_s < 0 or drain_stop_s < 0:
            raise ConfigurationError("drain_grace_s and drain_stop_s must not be negative")
        self._targets = list(targets)
        self.queues = tuple(queues)
        self.slots = slots
        self.prefetch = prefetch
        self._worker_id = worker_id or default_worker_id()
        self._api_key = api_key
        self.heartbeat_interval_s = heartbeat_interval_s
        self.drain_grace_s = drain_grace_s
        self.drain_stop_s = drain_stop_s
        self._tls = TLSConfig() if tls is True else (tls or None)
        self._clock: Clock = clock or SystemClock()
        self._topology_refresh_s = topology_refresh_s
        # host:port of this worker's /metrics while it runs (worker/_metrics.py); None: off.
        self.metrics_listen = metrics_listen
        self.metrics_address: str | None = None
        self._metrics: HttpServer | None = None
        self._handlers: dict[str, HandlerSpec] = {}
        self._rng = random.Random()

        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._fatal: asyncio.Future[None] | None = None
        self._forced = False
        self._finished = False
        self._report = DrainReport(0, 0, 0, 0, False)
        self._stop_event = asyncio.Event()
        self._changed = _Signal()
        self._build()

    def _build(self) -> None:
        """(Re)build the I/O parts from the current settings; nothing connects yet."""
        self._transport = Transport(tls=self._tls, api_key=self._api_key)
        self._runs = RunManager(
            worker_id=self._worker_id,
            handlers=self._handlers,
            queues=self.queues,
            slots=self.slots,
            prefetch=self.prefetch,
            clock=self._clock,
            drain_grace_s=self.drain_grace_s,
            drain_stop_s=self.drain_stop_s,
            on_change=self._changed.notify,
        )
        self._topology = Topology(
            targets=self._targets,
            transport=self._transport,
            host=self._runs,
            spawn=self._spawn,
            heartbeat_interval_s=self.heartbeat_interval_s,
            refresh_s=self._topology_refresh_s,
            rng=self._rng,
        )
        self._settlements = Settlements(
            worker_id=self._worker_id,
            transport=self._transport,
            topology=self._topology,
            clock=self._clock,
            on_stale=self._runs.stale,
            on_change=self._changed.notify,
            rng=self._rng,
        )
        self._runs.bind(self._topology, self._settlements)

    # ---- configuration ---------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self._targets)

    def set_targets(self, targets: Sequence[str]) -> None:
        """Replace the scheduler addresses (before ``run``; the runner's ``--target``)."""
        self._check_not_started()
        self._targets = list(targets)
        self._build()

    def set_api_key(self, api_key: str | None) -> None:
        """Replace the API key (before ``run``)."""
        self._check_not_started()
        self._api_key = api_key
        self._build()

    def set_tls(self, tls: TLSConfig | bool | None) -> None:
        """Replace the TLS settings, as ``tls=`` takes them (before ``run``; the runner's
        ``--tls-ca`` and friends)."""
        self._check_not_started()
        self._tls = TLSConfig() if tls is True else (tls or None)
        self._build()

    @property
    def task_types(self) -> tuple[str, ...]:
        return tuple(sorted(self._handlers))

    def task(
        self, task_type: str, *, timeout_s: float | None = None
    ) -> Callable[[HandlerT], HandlerT]:
        """Decorator registering an ``async def`` or plain ``def`` handler for ``task_type``.

        A plain function runs in a thread pool sized to ``slots``. The function is
        returned unchanged, so it can still be called and tested directly
        (``chronoshard.worker.testing.run_task``). ``timeout_s`` caps every attempt; the
        task's own timeout, when tighter, wins.
        """

        def register(fn: HandlerT) -> HandlerT:
            self.register(task_type, fn, timeout_s=timeout_s)
            return fn

        return register

    def register(
        self, task_type: str, fn: Callable[[TaskContext], Any], *, timeout_s: float | None = None
    ) -> None:
        """Register ``fn`` for ``task_type`` (the non-decorator form of :meth:`task`)."""
        self._check_not_started()
        if not task_type:
            raise ConfigurationError("task type must be a non-empty string")
        if task_type in self._handlers:
            raise ConfigurationError(f"a handler for {task_type!r} is already registered")
        try:
            self._handlers[task_type] = handler_spec(task_type, fn, timeout_s)
        except ValueError as exc:
            raise ConfigurationError(f"{task_type}: {exc}") from exc

    def _check_not_started(self) -> None:
        if self._started:
            raise ConfigurationError("the worker is already running")

    # ---- state for callers and tests -------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._runs.draining

    @property
    def shutdown_bound_s(self) -> float:
        """The longest a graceful drain takes, from ``stop()`` (or SIGTERM) to exit."""
        return shutdown_bound_s(self.drain_grace_s, self.drain_stop_s)

    @property
    def running(self) -> int:
        """Slots held by tasks (waiting for due_at, running, or a handler still stopping)."""
        return self._runs.ledger.occupied

    def stats(self) -> dict[str, Any]:
        """Plain counters for logs and metrics."""
        return {
            "worker_id": self._worker_id,
            "sessions": {a: s.live for a, s in self._topology.sessions.items()},
            "credits": self._runs.ledger.stats(),
            "outbox": self._settlements.outbox.stats(),
            "outcomes": dict(self._runs.counts),
        }

    def _log(self, level: int, msg: str, *args: Any, **fields: Any) -> None:
        logger.log(level, msg, *args, extra={"worker_id": self._worker_id, **fields})

    # ---- running ---------------------------------------------------------------------

    async def run(self) -> DrainReport:
        """Run until ``stop()``/``drain()`` (or a signal under ``run_sync``), then drain.

        Raises the exception of a worker loop that crashed (after a forced shutdown).
        """
        self._check_not_started()
        if not self._handlers:
            raise ConfigurationError("no task handlers registered")
        if not self._targets:
            raise ConfigurationError("no scheduler address given")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._fatal = self._loop.create_future()
        if any(not spec.is_async for spec in self._handlers.values()):
            self._executor = ThreadPoolExecutor(self.slots, thread_name_prefix="chronoshard-task")
            self._runs.executor = self._executor
        self._log(
            logging.INFO,
            "worker starting: types %s, queues %s, %d slots, prefetch %d",
            ", ".join(self.task_types),
            ", ".join(self.queues),
            self.slots,
            self.prefetch,
            event="worker_start",
        )
        if self.metrics_listen is not None:
            self._metrics = metrics_server(self.metrics_listen, self.stats)
            self.metrics_address = await self._metrics.start()
            self._log(logging.INFO, "metrics on http://%s/metrics", self.metrics_address)
        loops = [
            asyncio.create_task(self._topology.run(), name="chronoshard-worker topology"),
            asyncio.create_task(self._settlements.run(), name="chronoshard-worker settlements"),
        ]
        stop_wait = asyncio.create_task(self._stop_event.wait(), name="chronoshard-worker stop")
        watched: list[asyncio.Future[Any]] = [*loops, stop_wait, self._fatal]
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._forced = True
            await self._close(loops)
            raise
        finally:
            stop_wait.cancel()
        crash = next(
            (f.exception() for f in done if f is not stop_wait and not f.cancelled()), None
        )
        if not self._fatal.done():
            self._fatal.cancel()
        if crash is None and any(f in done for f in loops):
            crash = RuntimeError("a worker loop ended unexpectedly")
        if crash is not None:
            self._log(logging.ERROR, "worker loop crashed: %r", crash, event="worker_crash")
            self._forced = True
        report = await self._shutdown(loops)
        if crash is not None:
            raise crash
        return report

    def stop(self, *, immediate: bool = False) -> None:
        """Start a graceful drain (thread-safe, returns at once); ``run()`` returns when done.

        ``immediate=True`` skips the grace period and the release of running tasks: they
        are left to their leases.
        """
        loop = self._loop
        if loop is None or loop.is_closed() or self._loop_thread == threading.get_ident():
            self._request_stop(immediate)
        else:
            loop.call_soon_threadsafe(self._request_stop, immediate)

    async def drain(self) -> DrainReport:
        """Stop gracefully and wait until the drain ended (while ``run()`` runs)."""
        if not self._started:
            raise ConfigurationError("drain() needs a running worker: call run() first")
        self.stop()
        await self._changed.wait_until(lambda: self._finished, None)
        return self._report

    def _request_stop(self, immediate: bool) -> None:
        if immediate:
            self._forced = True
        self._stop_event.set()
        self._changed.notify()

    def run_sync(self) -> int:
        """Run on uvloop until SIGTERM/SIGINT (the first drains, a second stops at once).

        Returns the process exit code: 0 when the drain was clean (every task finished
        or was released, every settlement confirmed), 1 otherwise.
        """

        async def main() -> int:
            loop = asyncio.get_running_loop()
            received = 0

            def on_signal(signum: int) -> None:
                nonlocal received
                received += 1
                self._log(
                    logging.WARNING,
                    "%s received: %s",
                    signal.Signals(signum).name,
                    "draining" if received == 1 else "stopping now",
                    event="signal",
                )
                self._request_stop(immediate=received > 1)

            handled = (signal.SIGTERM, signal.SIGINT)
            for sig in handled:
                loop.add_signal_handler(sig, on_signal, sig)
            try:
                report = await self.run()
            finally:
                for sig in handled:
                    loop.remove_signal_handler(sig)
            return 0 if report.clean else 1

        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(main())

    # ---- shutdown --------------------------------------------------------------------

    async def _shutdown(self, loops: list[asyncio.Task[None]]) -> DrainReport:
        d = self._runs

        def forced() -> bool:
            return self._forced

        # 1. Stop intake: no new credits, DrainStarted to every node.
        d.start_drain()
        self._log(
            logging.INFO,
            "draining: %d tasks running, grace %.1f s, exit within %.1f s",
            len(d.runs),
            self.drain_grace_s,
            self.shutdown_bound_s,
            event="drain_start",
        )
        ended_before, released_before = d.ended(), d.counts["released"]
        # 2. Let running tasks finish within the grace period.
        await self._changed.wait_until(lambda: not d.runs or forced(), self.drain_grace_s)
        # Held tasks that had not begun (prefetch) were released at once: not finished.
        finished = d.ended() - ended_before - (d.counts["released"] - released_before)
        # 3. Ask the rest to stop (ctx.draining, ctx.cancelled) and release each with its
        #    last checkpoint; Execution gives a handler drain_stop_s to return first.
        d.stop_all(StopReason.DRAINING)
        await self._changed.wait_until(
            lambda: all(r.decided for r in d.runs.values()) or forced(),
            self.drain_stop_s + DRAIN_STOP_MARGIN_S,
        )
        released = d.counts["released"] - released_before
        # 4. Flush settlements: sessions and the resend loop still run, so receipts
        #    arrive and broken streams fall back to the unary RPCs.
        await self._changed.wait_until(
            lambda: len(self._settlements) == 0 or forced(), DRAIN_FLUSH_S
        )
        unsettled = len(self._settlements)
        if unsettled:
            self._log(
                logging.ERROR,
                "%d settlements unconfirmed at shutdown; their leases will expire",
                unsettled,
                event="drain_unsettled",
            )
        # 5-6. Stop the loops, close streams and channels; count handlers we cannot stop.
        stuck = await self._close(loops)
        self._report = DrainReport(finished, released, unsettled, stuck, self._forced)
        self._finished = True
        self._changed.notify()
        self._log(logging.INFO, "drain finished: %s", self._report, event="drain_end")
        return self._report

    async def _close(self, loops: list[asyncio.Task[None]]) -> int:
        # 5. The background loops first (nothing reconnects or resends any more), then
        #    the streams.
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self._topology.close()
        if self._metrics is not None:
            await self._metrics.close()
        # 6. Runs still here were cut short (a forced stop): cancel them. A thread cannot
        #    be cancelled; it is counted as stuck and left to finish on its own (its
        #    ctx.cancelled is set).
        runs = list(self._runs.runs.values())
        stuck = sum(
            1 for r in runs if r.execution.handler_running and not r.execution.spec.is_async
        )
        self._runs.stop_all(StopReason.DRAINING)
        run_tasks = [r.task for r in runs if r.task is not None]
        for task in run_tasks:
            task.cancel()
        if run_tasks:
            # A handler that swallows its cancellation must not hold the exit past the
            # documented bound: it is counted as stuck and left behind.
            _, pending = await asyncio.wait(run_tasks, timeout=CLOSE_S)
            stuck += sum(1 for r in runs if r.task in pending and r.execution.spec.is_async)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        await self._transport.close()
        return stuck

    # ---- supervision -----------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task whose unexpected exception stops the worker (supervised)."""
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._check_crash)
        return task

    def _check_crash(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._fatal is not None and not self._fatal.done():
            self._fatal.set_exception(exc)
