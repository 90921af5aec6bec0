"""The client's exception hierarchy: one root, one class per gRPC status a caller handles.

Every error the client raises on purpose derives from :class:`ChronoshardError`; grpc's
own exceptions never leak out of the public API. A failed call arrives as a gRPC status
code, a readable ``details`` string and, from a Chronoshard server, an ``ErrorInfo`` in
the trailing metadata (see :mod:`chronoshard.wire`) with a stable ``reason``, the request
``field`` at fault and a ``retryable`` flag. :func:`from_rpc_error` is the one place that
turns those into an exception, choosing the class by status code (and, for fencing, by
reason); the client raises the result ``from`` the grpc error so the original stays in the
traceback. Batch items that fail on their own carry the same fields without a gRPC call
around them; :func:`error_for` builds their exception from the pieces.

A refusal that says when to try again carries the delay in gRPC's standard
``google.rpc.RetryInfo`` (see :mod:`chronoshard.wire`): the exception's ``retry_after_s``.
A tenant over its submit rate is :class:`QuotaExceededError` (``RESOURCE_EXHAUSTED``,
reason ``QUOTA_EXCEEDED``): nothing was written, and the same call may be sent again after
``retry_after_s`` (the client does so by itself within ``max_quota_wait_s``).

``retryable`` is the server's word when it sent one. Without it (a transport failure, a
proxy, an older server) the class default applies: UNAVAILABLE, DEADLINE_EXCEEDED,
RESOURCE_EXHAUSTED and ABORTED are worth sending again later, the rest are not. Note that a
deadline or an UNAVAILABLE that happened after the request left may hide a write that *was*
applied: resend submits with an ``idempotency_key`` to make that safe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import grpc

from chronoshard.wire import error_info_from_metadata, retry_delay_from_metadata

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "ChronoshardError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "NotSentError",
    "PermissionDeniedError",
    "ProtocolError",
    "QuotaExceededError",
    "ResourceExhaustedError",
    "StaleFencingTokenError",
    "UnauthenticatedError",
    "UnavailableError",
    "WrongRegionError",
    "error_for",
    "from_rpc_error",
]


class ChronoshardError(Exception):
    """Root of every error the client raises for a failed call.

    Raised as such only for statuses without a class of their own (CANCELLED,
    UNIMPLEMENTED, OUT_OF_RANGE). Attributes: ``code`` (:class:`grpc.StatusCode`),
    ``reason`` (the server's machine-readable reason, or the code's name), ``field`` (the
    request field at fault, or None), ``retryable``, ``details`` (readable text) and
    ``retry_after_s`` (how long the server asked the caller to wait before sending it
    again, from its ``RetryInfo``; None when it said nothing) and ``metadata`` (facts of
    the reason, by name, from the server's ``ErrorInfo``; empty when it gave none).
    """

    default_retryable: ClassVar[bool] = False

    def __init__(
        self,
        details: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str | None = None,
        field: str | None = None,
        retryable: bool | None = None,
        retry_after_s: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(details)
        self.metadata: Mapping[str, str] = dict(metadata or {})
        self.code = code
        self.reason = reason or code.name
        self.field = field or None
        self.retryable = self.default_retryable if retryable is None else retryable
        self.details = details
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.code.name}/{self.reason}{where}: {self.details}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, "
            f"field={self.field!r}, retryable={self.retryable}, details={self.details!r})"
        )


class InvalidArgumentError(ChronoshardError):
    """Raised when the server refused a request field (INVALID_ARGUMENT), e.g. an empty
    type or a payload over the size limit (reason ``PAYLOAD_TOO_LARGE``). ``field`` names
    the field. Nothing was written."""


class NotFoundError(ChronoshardError):
    """Raised when the task (or schedule) does not exist (NOT_FOUND). Another tenant's
    answers the same way, so this never tells whether an id exists elsewhere."""


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class AlreadyExistsError(ChronoshardError):
    """Raised when an idempotency key was reused with a *different* request
    (ALREADY_EXISTS), or when a schedule is created under a name the tenant already uses.
    A repeat of the same submit is not an error: it returns the original task with
    ``created=False``. ``original_task_id`` is the task id the server named in its
    message, when it named one (best effort; ``details`` has the full text)."""

    @property
    def original_task_id(self) -> str | None:
        match = _UUID.search(self.details)
        return match.group(0).lower() if match else None


class FailedPreconditionError(ChronoshardError):
    """Raised when the request is valid but the task's state forbids it
    (FAILED_PRECONDITION): cancelling a completed task, retrying one that is not
    dead-lettered, or a tenant homed in another region (the details name the region)."""


class StaleFencingTokenError(FailedPreconditionError):
    """Raised when a fencing token is no longer the task's (reason ``STALE_FENCING_TOKEN``):
    another attempt owns the task now, and the caller must stop acting on it."""


class WrongRegionError(FailedPreconditionError):
    """Raised when the tenant is homed in another region than the cluster that was asked
    (FAILED_PRECONDITION, reason ``WRONG_REGION``): nothing was done. ``home_region`` is
    where its calls belong; a :class:`~chronoshard.Client` given ``regions`` follows it."""

    @property
    def home_region(self) -> str | None:
        return self.metadata.get("home_region")


class ResourceExhaustedError(ChronoshardError):
    """Raised when the tenant is over a quota or the message is too large for the channel
    (RESOURCE_EXHAUSTED). Quota errors are retryable after a pause."""

    default_retryable = True


class QuotaExceededError(ResourceExhaustedError):
    """Raised when the tenant is over its submit rate (RESOURCE_EXHAUSTED, reason
    ``QUOTA_EXCEEDED``). Nothing was written: send the same call again after
    ``retry_after_s`` seconds (the server's ``RetryInfo``)."""


class UnavailableError(ChronoshardError):
    """Raised when no server could take the call (UNAVAILABLE): the node is down or
    unreachable, or the task's shard is being handed to another node. Retry later."""

    default_retryable = True


class UnauthenticatedError(ChronoshardError):
    """Raised when the API key is missing, unknown or revoked (UNAUTHENTICATED)."""


class PermissionDeniedError(ChronoshardError):
    """Raised when the caller is known but not allowed to do this (PERMISSION_DENIED)."""


class AbortedError(ChronoshardError):
    """Raised when a compare-and-set lost a race with another writer (ABORTED): the task
    moved on while the request was handled. Reading it again and retrying is safe."""

    default_retryable = True


class DeadlineExceededError(ChronoshardError):
    """Raised when the call's deadline passed (DEADLINE_EXCEEDED), including time spent
    waiting for a free call slot (reason ``CLIENT_QUEUE_TIMEOUT``: that call was never
    sent). Otherwise the request may or may not have been applied."""

    default_retryable = True


class InternalError(ChronoshardError):
    """Raised when the server failed unexpectedly (INTERNAL, UNKNOWN, DATA_LOSS)."""


class ProtocolError(ChronoshardError):
    """Raised when the server answered with something this client cannot read (an enum
    value it does not know, a payload that is not JSON): usually a version mismatch."""


class NotSentError(ChronoshardError):
    """The outcome of batch items that were never sent because an earlier chunk of the
    same ``submit_batch`` failed as a whole. Nothing was written for them; they are
    retryable. Returned in the result list, never raised."""

    default_retryable = True


_BY_CODE: Mapping[grpc.StatusCode, type[ChronoshardError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
    grpc.StatusCode.DATA_LOSS: InternalError,
}

# Reasons precise enough to deserve a class of their own, whatever the status.
_BY_REASON: Mapping[str, type[ChronoshardError]] = {
    "STALE_FENCING_TOKEN": StaleFencingTokenError,
    "QUOTA_EXCEEDED": QuotaExceededError,
    "WRONG_REGION": WrongRegionError,
}


def status_code_from_name(name: str) -> grpc.StatusCode:
    """``"NOT_FOUND"`` -> ``grpc.StatusCode.NOT_FOUND``; unknown names give UNKNOWN."""
    try:
        return grpc.StatusCode[name]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


def error_for(
    code: grpc.StatusCode,
    details: str,
    *,
    reason: str | None = None,
    field: str | None = None,
    retryable: bool | None = None,
    retry_after_s: float | None = None,
    metadata: Mapping[str, str] | None = None,
) -> ChronoshardError:
    """Build (not raise) the exception for a failure described by its parts."""
    cls = _BY_REASON.get(reason or "") or _BY_CODE.get(code, ChronoshardError)
    return cls(
        details,
        code=code,
        reason=reason,
        field=field,
        retryable=retryable,
        retry_after_s=retry_after_s,
        metadata=metadata,
    )


def from_rpc_error(exc: grpc.RpcError) -> ChronoshardError:
    """Map a failed gRPC call (``grpc.aio.AioRpcError`` or a sync ``grpc.RpcError``) to its
    Chronoshard exception, with ``__cause__`` set to ``exc``. Raise the result."""
    code = _call_attr(exc, "code", grpc.StatusCode.UNKNOWN)
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details = _call_attr(exc, "details", None) or ""
    trailers = _call_attr(exc, "trailing_metadata", None)
    info = error_info_from_metadata(trailers)
    retry_after_s = retry_delay_from_metadata(trailers)
    if info is None:
        error = error_for(code, details or code.name, retry_after_s=retry_after_s)
    else:
        error = error_for(
            code,
            details or info.message or code.name,
            reason=info.reason or None,
            field=info.field or None,
            retryable=info.retryable,
            retry_after_s=retry_after_s,
            metadata=dict(info.metadata),
        )
    error.__cause__ = exc
    return error


def _call_attr(exc: grpc.RpcError, name: str, default: Any) -> Any:
    """Call ``exc.<name>()`` if it exists: a bare ``grpc.RpcError`` has none of them."""
    method = getattr(exc, name, None)
    return method() if callable(method) else default
