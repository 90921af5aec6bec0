"""The node's gRPC server: its options, its listening port (TLS or not), and health.

The node builds one ``grpc.aio`` server with :func:`server_options` (docs/architecture.md#d12:
explicit keepalives and a ping policy that allows the clients' rate, so a stopped peer
is detected in seconds, not minutes), binds it with :func:`bind` and serves gRPC health
through :class:`HealthServicer`, each service's status published by
:class:`HealthPublisher` from the rules of :mod:`chronoshard.scheduler.core.health`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from chronoshard.scheduler.api.tls import ServerCertificates
from chronoshard.scheduler.config import GrpcConfig, SchedulerConfig
from chronoshard.scheduler.core import health

log = logging.getLogger(__name__)

CLOCK_HEALTH_SERVICE = health.CLOCK
"""gRPC health service name: SERVING while this node's clock is within its bound,
NOT_SERVING while it is skewed and hands its shards off. The overall status ("") and the
API stay SERVING: submits take their time from the cluster clock (docs/operations.md)."""

LIVENESS_HEALTH_SERVICE = health.LIVENESS
"""gRPC health service name for liveness probes: SERVING for as long as the process
answers (a restart cures none of the conditions the other names report)."""


class HealthServicer(health_aio.HealthServicer):  # type: ignore[misc]
    """grpc's asyncio health servicer, with the ``List`` RPC its proto has and it lacks
    (grpcio-health-checking 1.85 answers it UNKNOWN with a NotImplementedError traceback)."""

    async def List(
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(
            statuses={
                service: health_pb2.HealthCheckResponse(status=status)
                for service, status in self._server_status.items()
            }
        )


class HealthPublisher:
    """Publishes each service's status to the health servicer, logging each change.

    One publication at a time, its statuses read inside the lock: two callers (the
    node's health loop, a clock-skew callback) cannot interleave an older reading's
    statuses with a newer one's.
    """

    def __init__(self, servicer: HealthServicer, node_id: str) -> None:
        self._servicer = servicer
        self._node_id = node_id
        self._serving: dict[str, bool] = {}
        self._lock = asyncio.Lock()

    @property
    def serving(self) -> Mapping[str, bool]:
        """The last published status of every service name (for the metrics endpoint)."""
        return self._serving

    async def publish(self, read: Callable[[], Mapping[str, bool]]) -> None:
        """Publish the statuses ``read`` returns now (every name, the first time)."""
        async with self._lock:
            for name, now_serving in read().items():
                before = self._serving.get(name)
                if before == now_serving:
                    continue
                if before is not None:
                    log.info(
                        "health changed",
                        extra={
                            "node_id": self._node_id,
                            "service": name or "(overall)",
                            "status": "SERVING" if now_serving else "NOT_SERVING",
                        },
                    )
                self._serving[name] = now_serving
                await self._servicer.set(
                    name,
                    health_pb2.HealthCheckResponse.SERVING
                    if now_serving
                    else health_pb2.HealthCheckResponse.NOT_SERVING,
                )


def server_options(config: SchedulerConfig) -> list[tuple[str, Any]]:
    """The gRPC server settings of docs/architecture.md#d12."""
    grpc_config = config.grpc
    return [
        ("grpc.keepalive_time_ms", int(grpc_config.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(grpc_config.keepalive_timeout_s * 1000)),
        ("grpc.http2.ping_timeout_ms", int(grpc_config.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        (
            "grpc.http2.min_recv_ping_interval_without_data_ms",
            int(grpc_config.min_client_ping_interval_s * 1000),
        ),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            int(grpc_config.min_client_ping_interval_s * 1000),
        ),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.max_receive_message_length", grpc_config.max_message_bytes),
        ("grpc.max_send_message_length", grpc_config.max_message_bytes),
    ]


def add_service(
    server: grpc.aio.Server, add_to_server: Callable[[Any, Any], None], servicer: Any
) -> None:
    """Serve ``servicer`` on ``server`` through the generic handler that ``add_to_server``
    (a generated ``add_*Servicer_to_server``) builds, without its registered methods.

    grpc.aio's server keeps one call request pending per registered method and, for every
    call it accepts, waits on all of them again: an ``asyncio.wait`` over ~40 futures,
    each given a done callback and relieved of it, on every RPC of every service. The
    generic handler finds the same servicer methods by name, with one request pending.
    (Measured in bench/README.md, "Submits, per call".)"""
    add_to_server(servicer, _GenericHandlersOnly(server))


class _GenericHandlersOnly:
    """``server`` as a generated ``add_*Servicer_to_server`` sees it, keeping only the
    generic handler it adds."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        pass


def bind(server: grpc.aio.Server, grpc_config: GrpcConfig) -> int:
    """Listen on ``grpc.listen``, with TLS when a certificate and key are configured (and
    client certificates required when a client CA is), the files re-read when they change
    (:mod:`.tls`); the port bound.

    Raises:
        ConfigError: a TLS file is missing, unreadable or not a matching certificate and key.
    """
    if grpc_config.tls_cert and grpc_config.tls_key:
        credentials = ServerCertificates(grpc_config).credentials()
        return int(server.add_secure_port(grpc_config.listen, credentials))
    return int(server.add_insecure_port(grpc_config.listen))
