"""The servicers' error boundary: how every refusal and every failure leaves a node.

Every servicer answers a failed call the same way, through :func:`abort`: the gRPC status
its :class:`~.errors.SchedulerError` names, a readable message, and an ``ErrorInfo``
(code, reason, field, retryable) in the trailing metadata (``chronoshard.wire``); an error
that says when to retry (``retry_after_s``: a tenant over its submit rate) adds the
standard ``google.rpc.Status`` trailer with a ``RetryInfo``. Both are
**bounded** here, whatever the servicer put in them: the message to
:data:`MAX_MESSAGE_BYTES`, the field to :data:`MAX_FIELD_CHARS`. Messages quote request
values only through :func:`~.errors.shown` (cut to 40 characters) anyway; the bound is
the guarantee that no request, however large, makes the status and trailer overflow
gRPC's 8 KiB header limit (a 1 MiB task id once did: the client saw
``RESOURCE_EXHAUSTED: Stream removed``, not the refusal). :func:`serve` runs one handler
inside that boundary: a ``SchedulerError`` becomes its status, anything else is a bug,
logged with its traceback and answered ``INTERNAL`` with a generic message.

Requests that are not even a valid protobuf message never reach a servicer. grpc.aio
deserializes a request before it calls the handler, and a deserializer that raises is
"Unexpected error" for grpc: ``UNKNOWN`` to the client, an ERROR traceback in the node's
log for every garbage request. :class:`RequestDecoding` (a server interceptor, before
every other) hands the handler raw bytes instead and decodes them itself, so bytes that
do not parse are ``INVALID_ARGUMENT`` (reason ``MALFORMED_REQUEST``) with one WARNING
line, for every service the node hosts, streams included.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeAlias, TypeVar

import grpc

from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.errors import SchedulerError
from chronoshard.v1 import common_pb2
from chronoshard.wire import error_info_metadata, status_details_metadata

log = logging.getLogger(__name__)

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
_Resp = TypeVar("_Resp")

MAX_MESSAGE_BYTES = 512
"""Longest status message (UTF-8 bytes); percent-encoded in ``grpc-message`` it stays
under 1.6 KiB."""
MAX_FIELD_CHARS = 200
INTERNAL_MESSAGE = "internal error; the server logged the details"
MALFORMED_REQUEST = "MALFORMED_REQUEST"


def clip(text: str, limit_bytes: int) -> str:
    """``text`` cut to at most ``limit_bytes`` UTF-8 bytes (at a character boundary)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit_bytes:
        return text
    return data[: limit_bytes - 3].decode("utf-8", "ignore") + "..."


def error_info(error: SchedulerError) -> common_pb2.ErrorInfo:
    """The ``ErrorInfo`` of ``error`` (bounded), as trailers and stream receipts carry it."""
    return bounded(
        common_pb2.ErrorInfo(
            code=error.grpc_code_name,
            reason=error.reason,
            message=str(error),
            field=getattr(error, "field", "") or "",
            retryable=error.retryable,
            metadata=getattr(error, "metadata", None) or {},
        )
    )


def bounded(info: common_pb2.ErrorInfo) -> common_pb2.ErrorInfo:
    info.message = clip(info.message, MAX_MESSAGE_BYTES)
    info.field = clip(info.field, MAX_FIELD_CHARS)
    for key in list(info.metadata):
        info.metadata[key] = clip(info.metadata[key], MAX_FIELD_CHARS)
    return info


def internal_error() -> common_pb2.ErrorInfo:
    return common_pb2.ErrorInfo(code="INTERNAL", reason="INTERNAL", message=INTERNAL_MESSAGE)


async def abort(
    context: Context, info: common_pb2.ErrorInfo, *, retry_after_s: float | None = None
) -> NoReturn:
    """End the call with ``info``'s status, its message, and ``info`` as the trailer (and
    a ``RetryInfo`` of ``retry_after_s`` when given)."""
    info = bounded(info)
    code = getattr(grpc.StatusCode, info.code)
    metadata = error_info_metadata(info)
    if retry_after_s is not None:
        metadata += status_details_metadata(code.value[0], info, retry_after_s)
    context.set_trailing_metadata(metadata)
    await context.abort(code, info.message)
    raise AssertionError("context.abort returned")  # it always raises


async def serve(name: str, context: Context, call: Callable[[], Awaitable[_Resp]]) -> _Resp:
    """``await call()`` inside the boundary; ``name`` ("TaskService.SubmitTask") is for logs."""
    try:
        return await call()
    except Exception as exc:
        info, retry_after_s = refusal_of(name, exc)
        await abort(context, info, retry_after_s=retry_after_s)


def refusal_of(name: str, exc: Exception) -> tuple[common_pb2.ErrorInfo, float | None]:
    """What a call (or one request of a stream) answers for ``exc``, and the RetryInfo
    delay it carries: a :class:`SchedulerError`'s own ErrorInfo (logged when retryable),
    anything else ``INTERNAL`` with nothing of it shown (logged with its traceback)."""
    if isinstance(exc, SchedulerError):
        if exc.retryable:
            log.warning(
                "%s: %s", name, clip(str(exc), MAX_MESSAGE_BYTES), extra={"reason": exc.reason}
            )
        return error_info(exc), getattr(exc, "retry_after_s", None)
    log.error("%s failed", name, exc_info=exc)
    return internal_error(), None


class Authenticates(Protocol):
    @property
    def reads_certificates(self) -> bool: ...

    async def authenticate(self, metadata: Any, auth_context: Any = None) -> Tenant: ...


def credentials_of(context: Context, auth: Authenticates) -> tuple[Any, Any]:
    """What ``auth`` reads of a call: its metadata, and its peer's TLS properties when a
    client certificate can name the tenant (``grpc.tls_client_identities``)."""
    return (
        context.invocation_metadata(),
        context.auth_context() if auth.reads_certificates else None,
    )


async def serve_tenant(
    name: str,
    context: Context,
    auth: Authenticates,
    call: Callable[[Tenant], Awaitable[_Resp]],
) -> _Resp:
    """:func:`serve` for an RPC a tenant makes: its key is checked first, inside the
    boundary (an unknown key is ``UNAUTHENTICATED`` like any refusal)."""

    async def authenticated() -> _Resp:
        return await call(await auth.authenticate(*credentials_of(context, auth)))

    return await serve(name, context, authenticated)


# --- undecodable requests ---------------------------------------------------------------


def malformed(method: str) -> common_pb2.ErrorInfo:
    return common_pb2.ErrorInfo(
        code="INVALID_ARGUMENT",
        reason=MALFORMED_REQUEST,
        message=f"the request is not a valid {method.rsplit('/', 1)[-1]} request message "
        "(protobuf could not decode it)",
    )


class _Undecodable(Exception):
    """A streamed request message did not decode; the stream ends as if closed."""


class RequestDecoding(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Decodes every request inside the handler, so garbage is ``INVALID_ARGUMENT``.

    A method's decoding handler is built once and kept for as long as the server hands
    out the same handler for it (building it on every call cost each call its closures
    and its method handler)."""

    def __init__(self) -> None:
        self._decoding: dict[str, tuple[grpc.RpcMethodHandler, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        built = self._decoding.get(method)
        if built is None or built[0] is not handler:
            built = self._decoding[method] = (handler, decoding_handler(handler, method))
        return built[1]


Streaming: TypeAlias = tuple[bool, bool]
"""A method's shape: (request streaming, response streaming)."""
Parse: TypeAlias = Callable[[bytes], Any]
"""A request deserializer inside the boundary: raises :class:`_Undecodable` on garbage."""


def streaming_of(handler: grpc.RpcMethodHandler) -> Streaming:
    return (bool(handler.request_streaming), bool(handler.response_streaming))


def behaviour_of(handler: grpc.RpcMethodHandler) -> Any:
    """The one behaviour of ``handler`` that its shape says it has."""
    return {
        (False, False): handler.unary_unary,
        (False, True): handler.unary_stream,
        (True, False): handler.stream_unary,
        (True, True): handler.stream_stream,
    }[streaming_of(handler)]


def decodes_inside(handler: grpc.RpcMethodHandler) -> bool:
    """Whether :func:`decoding_handler` moves ``handler``'s deserializer inside: it has
    one, and its behaviour is async (grpc.aio runs a sync one in a thread with another
    context type, which the boundary cannot abort)."""
    behaviour = behaviour_of(handler)
    is_async = inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)
    return handler.request_deserializer is not None and is_async


def decoding_handler(handler: grpc.RpcMethodHandler, method: str) -> Any:
    """``handler`` with its request deserializer moved inside the behaviour.

    Handlers without a deserializer, and sync ones, are returned as they are
    (:func:`decodes_inside`).
    """
    if not decodes_inside(handler):
        return handler
    shape = streaming_of(handler)
    parse = _parser(handler.request_deserializer, method)
    decoding = _DECODING_WRAPPERS[shape](behaviour_of(handler), parse, method)
    return _METHOD_HANDLERS[shape](decoding, response_serializer=handler.response_serializer)


def _parser(decode: Callable[[bytes], Any], method: str) -> Parse:
    def parse(raw: bytes) -> Any:
        try:
            return decode(raw)
        except Exception as exc:  # whatever the decoder raises, the bytes are the fault
            log.warning(
                "undecodable request",
                extra={"method": method, "bytes": len(raw), "error": clip(str(exc), 200)},
            )
            raise _Undecodable from None

    return parse


async def _unary_request(parse: Parse, method: str, raw: bytes, context: Context) -> Any:
    """The one request of a unary-request call, or the call ends ``INVALID_ARGUMENT``."""
    try:
        return parse(raw)
    except _Undecodable:
        await abort(context, malformed(method))


async def _messages(
    parse: Parse, raw_iterator: AsyncIterator[bytes], bad: list[bool]
) -> AsyncIterator[Any]:
    """The requests of a streamed call, ending at the first that does not decode (which
    is noted in ``bad``, so the wrapper can say why the stream ended)."""
    async for raw in raw_iterator:
        try:
            yield parse(raw)
        except _Undecodable:
            bad.append(True)
            return


def _decoding_unary_unary(behaviour: Any, parse: Parse, method: str) -> Any:
    async def unary_unary(raw: bytes, context: Context) -> Any:
        return await behaviour(await _unary_request(parse, method, raw, context), context)

    return unary_unary


def _decoding_unary_stream(behaviour: Any, parse: Parse, method: str) -> Any:
    async def unary_stream(raw: bytes, context: Context) -> AsyncIterator[Any]:
        request = await _unary_request(parse, method, raw, context)
        async for response in _responses(behaviour, request, context):
            yield response

    return unary_stream


def _decoding_stream_unary(behaviour: Any, parse: Parse, method: str) -> Any:
    async def stream_unary(raw_iterator: AsyncIterator[bytes], context: Context) -> Any:
        bad: list[bool] = []
        response = await behaviour(_messages(parse, raw_iterator, bad), context)
        if bad:
            await abort(context, malformed(method))
        return response

    return stream_unary


def _decoding_stream_stream(behaviour: Any, parse: Parse, method: str) -> Any:
    async def stream_stream(
        raw_iterator: AsyncIterator[bytes], context: Context
    ) -> AsyncIterator[Any]:
        bad: list[bool] = []
        async for response in _responses(behaviour, _messages(parse, raw_iterator, bad), context):
            yield response
        if bad:
            # The handler saw the stream end at the bad message and finished; the
            # client learns why it ended.
            await abort(context, malformed(method))

    return stream_stream


_DECODING_WRAPPERS: dict[Streaming, Callable[[Any, Parse, str], Any]] = {
    (False, False): _decoding_unary_unary,
    (False, True): _decoding_unary_stream,
    (True, False): _decoding_stream_unary,
    (True, True): _decoding_stream_stream,
}
_METHOD_HANDLERS: dict[Streaming, Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


async def _responses(behaviour: Any, request: Any, context: Context) -> AsyncIterator[Any]:
    """The responses of a response-streaming behaviour, an async generator or a coroutine
    that writes through ``context`` (reader-writer API) and returns None."""
    if inspect.isasyncgenfunction(behaviour):
        async for response in behaviour(request, context):
            yield response
    else:
        await behaviour(request, context)
