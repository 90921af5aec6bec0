"""Group commit: many concurrent callers, one statement per batch.

Acks, heartbeats and settlements arrive from many worker streams at once; one
transaction each would cap the node at the database's commit rate. A
:class:`GroupCommitter` queues requests, and a single flusher task takes everything
queued (up to ``max_batch``), runs one ``flush`` for the lot, and resolves each caller's
future with its own answer. While a flush runs, new requests queue up, so the batch size
grows with load and the latency of a lone request is one flush plus at most
``linger_s`` (docs/architecture.md#d7: "one statement per few milliseconds per node"). A caller is
answered only after its batch committed: nothing is acknowledged early.

The linger is spent only when the previous batch had company (more than one request):
then other callers are about, and waiting a little lets them share the commit. A lone
caller after a lone batch (one producer submitting one task at a time) is flushed at
once; lingering for it bought nothing and cost every sequential submit ``linger_s``
(issue 14: a single producer reached ~170 submits/s, a 2 ms linger on every ~1 ms commit
among what held it there).

``stop`` lets the flush under way finish and flushes what is still queued before the
flusher ends: cancelling a flush midway would leave its callers without an answer, and
a worker's settlement whose batch committed without a Receipt would wait for its
resend. The wait is bounded (``stop_timeout_s``); past it the flusher is cancelled, and
the callers of the batch it cut short get :class:`~.errors.CommitOutcomeUnknown` (it may
have committed). Once ``stop`` began, ``submit`` refuses at once with
:class:`~.errors.CommitterStopped` (nothing queued, nothing written), and whatever is
still queued when the flusher ends, however it ends, is failed the same way: a request
queued with no flusher left to take it waited for ever, and so did its caller (a worker's
settlement arriving while the node stopped never got its Receipt).

What a failed flush means depends on the caller, so the committer is told:

- A result that is an exception is that caller's own failure (a submit's reused key),
  raised to it alone.
- ``whole_batch_errors``: the transaction failed as a whole and nothing was written
  (``StoreUnavailable``); each caller gets its own exception of that kind, built from
  the message (they are raised in many coroutines at once).
- ``isolate``: any other exception may come from one bad request taking its batch down,
  so each request of the batch is run again alone through ``isolate`` and the culprit
  fails by itself, exactly as without batching (submits use it).
- Otherwise every caller of the batch gets the exception (settlements: a retryable
  refusal the worker resends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar, Generic, TypeVar

from chronoshard.scheduler.errors import CommitOutcomeUnknown, CommitterStopped

log = logging.getLogger(__name__)

DEFAULT_STOP_TIMEOUT_S = 10.0

Req = TypeVar("Req")
Res = TypeVar("Res")


class GroupCommitter(Generic[Req, Res]):
    """Batches ``submit`` calls into calls of ``flush(requests) -> results`` (same order)."""

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset({"queued"})

    def __init__(
        self,
        name: str,
        flush: Callable[[Sequence[Req]], Awaitable[Sequence[Res | Exception]]],
        *,
        max_batch: int = 1000,
        linger_s: float = 0.002,
        isolate: Callable[[Req], Awaitable[Res]] | None = None,
        whole_batch_errors: tuple[type[Exception], ...] = (),
    ) -> None:
        self.name = name
        self._flush = flush
        self._isolate = isolate
        self._whole_batch_errors = whole_batch_errors
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._pending: list[tuple[Req, asyncio.Future[Res]]] = []
        self._wakeup = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._had_company = False
        # batches flushed, requests in them, flushes that failed, requests run alone
        self._stats: dict[str, int] = {"batches": 0, "requests": 0, "failures": 0, "isolated": 0}

    def start(self) -> None:
        if self._task is None and not self._stopping.is_set():
            self._task = asyncio.create_task(self._run(), name=f"group-commit-{self.name}")
            self._task.add_done_callback(self._flusher_ended)

    async def stop(self, stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Refuse new requests, finish the flush under way, flush what is queued, then
        stop (bounded). No caller is left without an answer."""
        self._stopping.set()
        self._wakeup.set()
        task, self._task = self._task, None
        if task is not None:
            _, pending = await asyncio.wait({task}, timeout=stop_timeout_s)
            if pending:
                log.warning(
                    "group commit still flushing at stop; cancelled",
                    extra={"committer": self.name, "queued": len(self._pending)},
                )
                task.cancel()
                await asyncio.wait({task})
        # Not started, or cut short: nothing flushes what is queued any more.
        self._fail_queued()

    def get_stats(self) -> dict[str, int]:
        """The totals, and ``queued``: requests waiting for the next flush (a level)."""
        return {**self._stats, "queued": len(self._pending)}

    @property
    def accepting(self) -> bool:
        """Whether ``submit`` queues (False once ``stop`` began or the flusher ended)."""
        return not self._stopping.is_set() and not (self._task is not None and self._task.done())

    async def submit(self, request: Req) -> Res:
        """``request``'s result once its batch committed; :class:`CommitterStopped` at
        once if the committer no longer takes requests."""
        if not self.accepting:
            raise CommitterStopped(self.name)
        future: asyncio.Future[Res] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._wakeup.set()
        return await future

    async def submit_many(self, requests: Sequence[Req]) -> list[Res]:
        if not self.accepting:
            raise CommitterStopped(self.name)
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in requests]
        self._pending.extend(zip(requests, futures, strict=True))
        self._wakeup.set()
        return list(await asyncio.gather(*futures))

    async def _run(self) -> None:
        while True:
            if self._stopping.is_set():
                if not self._pending:
                    return
            else:
                await self._wakeup.wait()
                if (
                    self._linger_s > 0
                    and self._had_company
                    and len(self._pending) < self._max_batch
                ):
                    # Let concurrent callers join this batch (a stop ends the wait).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._linger_s):
                            await self._stopping.wait()
            await self._flush_once()

    async def _flush_once(self) -> None:
        batch = self._pending[: self._max_batch]
        self._pending = self._pending[self._max_batch :]
        if not self._pending:
            self._wakeup.clear()
        live = [(req, fut) for req, fut in batch if not fut.cancelled()]
        if not live:
            return
        self._had_company = len(live) > 1
        self._stats["batches"] += 1
        self._stats["requests"] += len(live)
        try:
            results = await self._flush([req for req, _ in live])
        except asyncio.CancelledError:
            # The flusher was cancelled at stop, past its bound: the batch may or may not
            # have committed, and its callers must hear so rather than wait for ever.
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(
                        CommitOutcomeUnknown(
                            f"the scheduler node stopped while its {self.name!r} group "
                            "commit ran: it may or may not have committed"
                        )
                    )
            raise
        except Exception as exc:
            self._stats["failures"] += 1
            if isinstance(exc, self._whole_batch_errors):
                # Nothing of the batch was written: each caller gets its own exception.
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(type(exc)(str(exc)))
            elif self._isolate is not None and len(live) > 1:
                log.warning(
                    "group commit failed; running its requests one by one",
                    exc_info=True,
                    extra={"committer": self.name},
                )
                await self._run_alone(live)
            else:
                # Every caller of the batch learns of the failure; the loop carries on.
                log.warning(
                    "group commit failed", extra={"committer": self.name, "error": str(exc)}
                )
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
            return
        if len(results) != len(live):
            # A bug in ``flush``. Raised out of the loop it ended the flusher and left this
            # batch's callers, and every later one, waiting for ever.
            self._stats["failures"] += 1
            error = RuntimeError(f"{self.name}: flush returned {len(results)} for {len(live)}")
            log.error("group commit flush broke its contract", extra={"committer": self.name})
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(error)
            return
        for (_, fut), result in zip(live, results, strict=True):
            _answer(fut, result)

    async def _run_alone(self, live: list[tuple[Req, asyncio.Future[Res]]]) -> None:
        assert self._isolate is not None
        self._stats["isolated"] += len(live)
        for request, fut in live:
            try:
                result = await self._isolate(request)
            except asyncio.CancelledError:
                for _, rest in live:  # cut short at stop: as for a cancelled flush
                    _answer(rest, CommitOutcomeUnknown(f"{self.name}: stopped mid-batch"))
                raise
            except Exception as exc:
                _answer(fut, exc)
            else:
                _answer(fut, result)

    def _flusher_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "group commit flusher failed",
                exc_info=task.exception(),
                extra={"committer": self.name},
            )
        self._fail_queued()

    def _fail_queued(self) -> None:
        queued, self._pending = self._pending, []
        for _, fut in queued:
            if not fut.done():
                fut.set_exception(CommitterStopped(self.name))


def _answer(future: asyncio.Future[Res], result: Res | Exception) -> None:
    # A caller that went away (its RPC cancelled) left a done future behind.
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
