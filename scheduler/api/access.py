"""Who may call what on a scheduler node: API keys on ``WorkerService`` and ``AdminService``.

``TaskService`` and ``WatchdogService`` authenticate inside their servicers, because every
call they answer is scoped to the caller's tenant and they need it. ``WorkerService`` and
``AdminService`` serve the cluster rather than one tenant, so a server interceptor guards
them before any handler runs, with the same :class:`~.auth.Authenticator` (same key
format, same cache, same single "missing or invalid API key" answer):

- **worker calls** (``Connect`` and the unary ``Complete``/``Fail``/``Release``) need a valid
  API key of any tenant. Workers serve every tenant of the cluster: which tasks a worker
  receives is decided by its queues and task types, not by the key it presents (see
  docs/architecture.md, Decisions). A refused ``Connect`` never opens a session, and a
  refused settlement is never queued, so nothing is written for a bad key;
- **reading the topology** (``GetTopology``) and **the worker sessions**
  (``ListWorkerSessions``) need a valid key too: workers discover nodes with the
  topology, whatever their key. What each answers depends on the key, so the servicer
  asks again whom it answers (:mod:`.admin`): an operator's key gets the cluster views
  (the shard map, epochs, metrics endpoints, every tenant's sessions), any other the
  nodes and its own workers' sessions;
- **the shard map** (``ListShards``) and **changing the cluster** (``DrainNode``,
  ``UndrainNode``) need an *operator* key: a tenant row with ``operator = true``
  (``chronoshard tenants create NAME --operator``). Any other valid key gets
  ``PERMISSION_DENIED``.

Health checks and reflection stay open: load balancers and ``grpcurl`` must work
without a key, and neither reveals tasks or tenants.

Where a client certificate can name the tenant (``grpc.tls_client_identities``), the
check needs the connection's peer certificate, which only the handler's context holds:
the interceptor then wraps the handler (:func:`checked_handler`) and the same check runs
inside it, before the servicer's code.

The decision of which rule applies is the pure :func:`rule_for`; the interceptor only
runs it and, for a refusal, answers with a handler of the same streaming shape that
aborts with the status and the ``ErrorInfo`` trailer every other refusal carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from chronoshard.scheduler.api import boundary
from chronoshard.scheduler.api.auth import AuthContext, Authenticator
from chronoshard.scheduler.errors import PermissionDenied, SchedulerError
from chronoshard.v1 import common_pb2

log = logging.getLogger(__name__)

WORKER_SERVICE_PREFIX = "/chronoshard.v1.WorkerService/"
ADMIN_SERVICE_PREFIX = "/chronoshard.v1.AdminService/"
OPERATOR_METHODS = frozenset(
    {
        "/chronoshard.v1.AdminService/ListShards",
        "/chronoshard.v1.AdminService/DrainNode",
        "/chronoshard.v1.AdminService/UndrainNode",
    }
)


class Rule(enum.Enum):
    """What a call must present."""

    OPEN = "open"
    """Nothing checked here: health, reflection, and the services that authenticate
    themselves (TaskService, WatchdogService)."""
    ANY_KEY = "any_key"
    """A valid API key of any tenant."""
    OPERATOR = "operator"
    """A valid API key of a tenant with the operator flag."""


def rule_for(method: str) -> Rule:
    """The rule for a full method name such as ``/chronoshard.v1.AdminService/DrainNode``."""
    if method in OPERATOR_METHODS:
        return Rule.OPERATOR
    if method.startswith((WORKER_SERVICE_PREFIX, ADMIN_SERVICE_PREFIX)):
        return Rule.ANY_KEY
    return Rule.OPEN


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses WorkerService and AdminService calls that lack the key (or client
    certificate) their rule needs."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        rule = rule_for(method)
        if rule is Rule.OPEN:
            return await continuation(handler_call_details)
        metadata = handler_call_details.invocation_metadata
        if self._authenticator.reads_certificates:
            handler = await continuation(handler_call_details)
            if handler is None:
                return None

            async def check(context: boundary.Context) -> common_pb2.ErrorInfo | None:
                return await self._refusal(method, rule, metadata, context.auth_context())

            return checked_handler(handler, check)
        info = await self._refusal(method, rule, metadata, None)
        if info is None:
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        return None if handler is None else refusal_handler(handler, info)

    async def _refusal(
        self, method: str, rule: Rule, metadata: Any, auth_context: AuthContext | None
    ) -> common_pb2.ErrorInfo | None:
        """Why the call may not go on; None when it may."""
        try:
            tenant = await self._authenticator.authenticate(metadata, auth_context)
            if rule is Rule.OPERATOR and not tenant.operator:
                raise PermissionDenied(
                    f"{method.rsplit('/', 1)[-1]} needs an operator API key "
                    "(chronoshard tenants create NAME --operator)"
                )
        except SchedulerError as exc:
            return boundary.error_info(exc)
        except Exception:  # a bug must not let the call through, nor kill the server
            log.exception("authentication failed unexpectedly", extra={"method": method})
            return boundary.internal_error()
        return None


OPENING_MESSAGE_WAIT_S = 2.0
"""How long a refused client-streaming call waits for its opening message."""


def refusal_handler(handler: grpc.RpcMethodHandler, info: common_pb2.ErrorInfo) -> Any:
    """A handler shaped like ``handler`` (same streaming, same serializers) that aborts
    every call with ``info``.

    A client-streaming call is refused only once its opening message (a worker's
    ``Hello``) has arrived, or after :data:`OPENING_MESSAGE_WAIT_S`: grpc.aio reports
    ``INTERNAL: Internal error from Core`` instead of the server's status when the client's
    write lands after the call has ended (grpc/grpc#36066), and a worker that reads
    "missing or invalid API key" can be fixed by its operator, one that reads INTERNAL cannot.
    """
    request_streaming = bool(handler.request_streaming)

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await _refuse(request, context, info, request_streaming=request_streaming)

    return _same_shape(handler, refuse)


def checked_handler(
    handler: grpc.RpcMethodHandler,
    check: Callable[[boundary.Context], Awaitable[common_pb2.ErrorInfo | None]],
) -> Any:
    """``handler`` with ``check`` run first in every call: a refusal it returns aborts
    the call as :func:`refusal_handler` would, before ``handler``'s behaviour runs."""
    request_streaming, response_streaming = boundary.streaming_of(handler)
    behaviour = boundary.behaviour_of(handler)

    async def admit(request: Any, context: boundary.Context) -> None:
        info = await check(context)
        if info is not None:
            await _refuse(request, context, info, request_streaming=request_streaming)

    async def unary_response(request: Any, context: boundary.Context) -> Any:
        await admit(request, context)
        return await behaviour(request, context)

    async def streamed_response(request: Any, context: boundary.Context) -> AsyncIterator[Any]:
        await admit(request, context)
        if inspect.isasyncgenfunction(behaviour):
            async for response in behaviour(request, context):
                yield response
        else:  # a coroutine that writes through the context (reader-writer API)
            await behaviour(request, context)

    return _same_shape(handler, streamed_response if response_streaming else unary_response)


async def _refuse(
    request: Any,
    context: boundary.Context,
    info: common_pb2.ErrorInfo,
    *,
    request_streaming: bool,
) -> NoReturn:
    if request_streaming:
        # Whatever the read ends in (message, timeout, a broken or garbled stream),
        # the answer is the same refusal.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(OPENING_MESSAGE_WAIT_S):
                await anext(aiter(request), None)
    await boundary.abort(context, info)


def _same_shape(handler: grpc.RpcMethodHandler, behaviour: Any) -> Any:
    """A method handler of ``handler``'s streaming shape and serializers, ``behaviour``'s."""
    shapes = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = shapes[boundary.streaming_of(handler)]
    return make(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
