"""The worker SDK's exceptions: one root for what the SDK raises, two for handlers to raise.

:class:`WorkerError` is the root of every error the SDK raises on purpose; gRPC errors
never leak through the public API, they are mapped once in ``_transport.py`` and chained
``from exc``; :class:`CheckpointRefused` is what ``ctx.heartbeat`` raises for a checkpoint
the scheduler would not store. Handlers may raise :class:`NonRetryableError` (fail
without using up the task's retries) and :class:`TaskCancelled`
(``ctx.raise_if_cancelled()``: acknowledge a cancel or a drain request).
:class:`LeaseLost`, a TaskCancelled, is what the fencing helpers (``ctx.check_lease()``,
``chronoshard.worker.commit``) raise once the attempt may no longer write.
"""

from __future__ import annotations


class WorkerError(Exception):
    """Root of every error the worker SDK raises on purpose."""


class ConfigurationError(WorkerError):
    """Raised when a :class:`Worker` is built or registered wrongly (bad slots, a task type
    registered twice, ``run()`` with no handler or no scheduler address)."""


class LoadError(WorkerError):
    """Raised by the runner when ``pkg.module:attr`` does not name a Worker (or a
    zero-argument factory returning one)."""


class CheckpointRefused(WorkerError, ValueError):
    """Raised by ``ctx.heartbeat(checkpoint=...)`` when the checkpoint is JSON the
    scheduler would not store (a NUL or a lone surrogate in a string, nesting deeper than
    100 levels, a number of more than 1000 digits written out: the rules of
    ``chronoshard.json_documents``). Nothing was recorded; the previous checkpoint stays.
    ``rule`` names the rule broken; the message says where (``$.items[3]``).

    A ValueError, as a checkpoint JSON cannot encode (NaN) raises one too.
    """

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


class CallFailed(WorkerError):
    """Raised by the transport when a unary call (settlement, topology) did not succeed.

    ``code`` is the gRPC status code name, ``reason`` the ErrorInfo reason when the node
    sent one (``STALE_FENCING_TOKEN`` for a fenced attempt), ``retryable`` whether the same
    request may succeed later (node down, deadline exceeded, shard in handoff).
    """

    def __init__(self, code: str, reason: str, message: str, *, retryable: bool) -> None:
        super().__init__(f"{code}/{reason or '-'}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.retryable = retryable

    @property
    def stale(self) -> bool:
        return self.reason == STALE_FENCING_TOKEN


RESULT_REFUSED = "chronoshard.worker.ResultRefused"
"""``Fail.error_type`` of an attempt whose handler returned a result the scheduler does
not store: one that breaks the document rules (checked by the SDK), or one a node
refused with ``INVALID_ARGUMENT`` (over its size limit, which the worker cannot know).
Never retryable: the same handler would return the same result."""

STALE_FENCING_TOKEN = "STALE_FENCING_TOKEN"
"""ErrorInfo.reason of a settlement whose attempt is no longer current (docs/architecture.md#d5)."""


class NonRetryableError(Exception):
    """Raise from a handler to fail the task without retrying it (straight to DEAD_LETTER).

    Any exception with a class attribute ``retryable = False`` is treated the same way.
    """

    retryable = False


class TaskCancelled(Exception):
    """Raised by ``ctx.raise_if_cancelled()`` once the SDK asked the handler to stop.

    Letting it propagate acknowledges the stop: a cancel ends the task CANCELLED, a drain
    releases it with its last checkpoint. Catching it and returning a value completes the
    task instead (the work was done).
    """


class LeaseLost(TaskCancelled):
    """Raised by ``ctx.check_lease()`` and every fencing helper of
    ``chronoshard.worker.commit`` once this attempt may no longer write: its lease lapsed
    with no renewal from any node (the worker fenced itself: partition, pause), its token
    was revoked, or the SDK already gave the attempt up (timeout, release, settlement).

    Another attempt may own the task now, or its outcome is in an operator's hands: do
    not write, do not retry inside the handler; let it propagate. Nothing of this
    attempt is settled.
    """
