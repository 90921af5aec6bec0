"""A scheduler node: the pieces wired together, supervised, and shut down in order.

Start-up order: store pool → etcd (lease, cluster shard count) → gateway, dispatcher,
preloader, shard manager → gRPC server (TaskService, WorkerService, AdminService,
health, reflection) → node registered in etcd (only now can peers assign it shards and
workers find it) → metrics endpoint → the supervised loops.

The loops (shard manager, dispatcher, preloader, reconciler, worker liveness, partition
maintenance, tenant refresher) are named tasks; the node waits on them with
FIRST_EXCEPTION, so a crashed loop stops the node loudly rather than leaving it half
alive. Shutdown (SIGTERM) runs in this order (STYLE #4):

1. health NOT_SERVING (load balancers stop sending);
2. workers told to reconnect elsewhere (``Drain``);
3. every shard released — nothing more is dispatched, PRELOADED rows go back to
   SCHEDULED, etcd keys deleted — so peers claim them within a second;
4. loops stopped; queued acks/settlements flushed;
5. gRPC server stopped with a grace period for in-flight calls;
6. etcd lease revoked; database pool closed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from chronoshard.clock import Clock, SystemClock
from chronoshard.scheduler.access import AccessInterceptor
from chronoshard.scheduler.admin import AdminServicer
from chronoshard.scheduler.api import TaskServiceServicer
from chronoshard.scheduler.auth import Authenticator
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.coordination import CoordinationError, EtcdCoordinator, NodeInfo
from chronoshard.scheduler.dispatch_store import DispatchStore, TimerTask
from chronoshard.scheduler.dispatcher import Dispatcher
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.expectations_api import WatchdogServiceServicer
from chronoshard.scheduler.fairness import UNLIMITED, TenantLimits
from chronoshard.scheduler.gateway import Gateway
from chronoshard.scheduler.liveness import WorkerLiveness
from chronoshard.scheduler.maintenance import PartitionMaintenance
from chronoshard.scheduler.metrics import NodeCollector, SchedulerMetrics
from chronoshard.scheduler.models import Task, TaskRef
from chronoshard.scheduler.notifier import ShardSignals, encode_due, encode_ready
from chronoshard.scheduler.preloader import Preloader
from chronoshard.scheduler.reconcile_store import ReconcileStore
from chronoshard.scheduler.reconciler import Reconciler
from chronoshard.scheduler.shards import ShardManager
from chronoshard.scheduler.store import SessionLimits, Store
from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    watchdog_service_pb2,
    watchdog_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)

log = logging.getLogger(__name__)

TASK_STOP_TIMEOUT_S = 5.0
SERVER_GRACE_S = 5.0
TENANT_REFRESH_S = 10.0
BACKLOG_REPORT_S = 1.0


def server_options(config: SchedulerConfig) -> list[tuple[str, Any]]:
    """gRPC server settings of DESIGN §12: explicit keepalives and a ping policy that
    allows the clients' rate, so a stopped peer is detected in seconds, not minutes."""
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


@dataclass(frozen=True)
class NodeAddresses:
    grpc: str
    metrics: str


class TenantLimitsCache:
    """Per-tenant fairness limits, refreshed from the tenants table every few seconds."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._limits: dict[uuid.UUID, TenantLimits] = {}

    def __call__(self, tenant_id: uuid.UUID) -> TenantLimits:
        return self._limits.get(tenant_id, UNLIMITED)

    async def refresh(self) -> None:
        list_tenants: Callable[[], Awaitable[Sequence[Any]]] | None = getattr(
            self._store, "list_tenants", None
        )
        if list_tenants is None:
            return
        tenants = await list_tenants()
        self._limits = {
            t.id: TenantLimits(
                max_concurrent=t.max_concurrent_workers, rate_limit_rps=t.rate_limit_rps
            )
            for t in tenants
        }


class SchedulerNode:
    def __init__(self, config: SchedulerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.metrics = SchedulerMetrics(config.node_id)
        self._tasks: list[asyncio.Task[None]] = []
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._server: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        self._metrics_server: Any = None
        self._draining = False
        self.addresses: NodeAddresses | None = None
        self.stopped = asyncio.Event()

    # ---- start ------------------------------------------------------------------------------

    async def start(self) -> NodeAddresses:
        config = self.config
        self.store = await Store.open(
            config.database.dsn,
            config.database.pool_min_size,
            config.database.pool_max_size,
            payload_limit_bytes=config.limits.payload_limit_bytes,
            acquire_timeout_s=config.database.acquire_timeout_s,
            session_limits=SessionLimits(
                statement_timeout_s=config.database.statement_timeout_s,
                idle_in_transaction_s=config.database.idle_in_transaction_timeout_s,
            ),
        )
        self.runs = DispatchStore(self.store)
        self.coordinator = EtcdCoordinator(config.etcd, config.node_id, self.clock)
        await self.coordinator.connect()
        await self.coordinator.start_lease()
        shard_count = await self.coordinator.ensure_shard_count(config.scheduling.shard_count)

        self.tenant_limits = TenantLimitsCache(self.store)
        await self.tenant_limits.refresh()
        self.gateway = Gateway(config, self.runs, self.clock)
        # WorkerService and AdminService calls need an API key (access.py); TaskService
        # and WatchdogService check theirs in the servicer, scoped to the key's tenant.
        self._server = grpc.aio.server(
            options=server_options(config),
            interceptors=[AccessInterceptor(Authenticator(self.store))],
        )
        port = self._bind(self._server)
        host = config.grpc.listen.rsplit(":", 1)[0]
        grpc_address = config.grpc.advertise or f"{host}:{port}"
        metrics_address = self._start_metrics()
        self.info = NodeInfo(
            node_id=config.node_id,
            address=grpc_address,
            metrics_address=metrics_address,
            started_at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        )
        self.shards = ShardManager(
            self.info, shard_count, self.clock, self.coordinator, self.store, self.runs
        )
        self.dispatcher = Dispatcher(
            config,
            self.clock,
            self.runs,
            self.gateway,
            self.shards,
            self.tenant_limits,
            on_dispatched=self._on_dispatched,
            on_remote_ready=self._remote_ready,
        )
        self.preloader = Preloader(config, self.clock, self.runs, self.dispatcher, self.shards)
        self.dispatcher.on_preloaded_unknown = self.preloader.resync
        self.signals = ShardSignals(
            config.database.dsn, self.store, on_due=self._signal_due, on_ready=self._signal_ready
        )
        self.shards.on_remote_due = self._remote_due
        self.shards.attach(self.dispatcher, self.preloader)
        self.reconciler = Reconciler(
            config,
            self.clock,
            ReconcileStore(self.store),
            self.shards,
            self.gateway,
            self.dispatcher,
            shard_count,
        )
        self.liveness = WorkerLiveness(
            config.node_id,
            config.workers.session_timeout_s,
            self.gateway,
            ReconcileStore(self.store),
        )
        self.gateway.on_sessions_changed = self.liveness.sessions_changed
        self.maintenance = PartitionMaintenance(config.maintenance, self.store)
        self._add_services(self._server, shard_count)
        self.metrics.register(NodeCollector(config.node_id, self._counters, self._gauges))

        self.gateway.start()
        await self._server.start()
        await self.coordinator.register_node(self.info)
        self._supervise("shards", self.shards.run())
        self._supervise("dispatcher", self.dispatcher.run())
        self._supervise("preloader", self.preloader.run())
        self._supervise("reconciler", self.reconciler.run())
        self._supervise("liveness", self.liveness.run())
        self._supervise("maintenance", self.maintenance.run())
        self._supervise("tenant-refresh", self._refresh_tenants())
        self._supervise("backlog-report", self._report_backlog())
        self._supervise("signals", self.signals.listen())
        self.addresses = NodeAddresses(grpc_address, metrics_address)
        log.info(
            "scheduler node started",
            extra={"node_id": config.node_id, "grpc": grpc_address, "metrics": metrics_address},
        )
        return self.addresses

    def _bind(self, server: grpc.aio.Server) -> int:
        grpc_config = self.config.grpc
        if grpc_config.tls_cert and grpc_config.tls_key:
            with open(grpc_config.tls_key, "rb") as key, open(grpc_config.tls_cert, "rb") as cert:
                pair = [(key.read(), cert.read())]
            client_ca = None
            if grpc_config.tls_client_ca:
                with open(grpc_config.tls_client_ca, "rb") as ca:
                    client_ca = ca.read()
            credentials = grpc.ssl_server_credentials(
                pair, root_certificates=client_ca, require_client_auth=client_ca is not None
            )
            return int(server.add_secure_port(grpc_config.listen, credentials))
        return int(server.add_insecure_port(grpc_config.listen))

    def _start_metrics(self) -> str:
        host, _, port = self.config.metrics_listen.rpartition(":")
        httpd, _thread = start_http_server(int(port), addr=host, registry=self.metrics.registry)
        self._metrics_server = httpd
        return f"{host}:{httpd.server_port}"

    def _add_services(self, server: grpc.aio.Server, shard_count: int) -> None:
        worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(self.gateway, server)
        admin = AdminServicer(
            self.config.node_id,
            shard_count,
            self.coordinator,
            self.shards,
            drain=self.drain,
            is_draining=lambda: self._draining,
        )
        admin_service_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
        names = [
            admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
            worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
        ]
        api = TaskServiceServicer(
            config=self.config,
            store=self.store,
            authenticator=Authenticator(self.store),
            clock=self.clock,
            listener=self,
        )
        task_service_pb2_grpc.add_TaskServiceServicer_to_server(api, server)
        names.append(task_service_pb2.DESCRIPTOR.services_by_name["TaskService"].full_name)
        watch = WatchdogServiceServicer(store=self.store, authenticator=Authenticator(self.store))
        watchdog_service_pb2_grpc.add_WatchdogServiceServicer_to_server(watch, server)
        names.append(watchdog_service_pb2.DESCRIPTOR.services_by_name["WatchdogService"].full_name)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], server)

    # ---- what the API tells the node -------------------------------------------------------

    def tasks_submitted(self, tasks: Sequence[Task]) -> None:
        """New tasks: wake our preloader, or tell the owners of other shards, if one is
        due within the lookahead."""
        horizon = self.clock.now() + timedelta(seconds=self.config.scheduling.lookahead_s)
        remote: set[int] = set()
        for task in tasks:
            if task.due_at >= horizon:
                continue
            if self.shards.owns(task.shard):
                self.preloader.wake()
            else:
                remote.add(task.shard)
        if remote:
            self._background(self.signals.send(encode_due(remote)))

    # ---- cross-node signals ------------------------------------------------------------------

    def _remote_due(self, shard: int, due_at: datetime) -> None:
        horizon = self.clock.now() + timedelta(seconds=self.config.scheduling.lookahead_s)
        if due_at < horizon:
            self._background(self.signals.send(encode_due([shard])))

    def _remote_ready(self, timers: Sequence[TimerTask]) -> None:
        self._background(self.signals.send(encode_ready((t.shard, t.ref) for t in timers)))

    def _signal_due(self, shards: set[int]) -> None:
        if any(self.shards.owns(s) for s in shards):
            self.preloader.wake()

    def _signal_ready(self, tasks: list[tuple[int, TaskRef]]) -> None:
        epochs = self.shards.epochs()
        mine = [ref for shard, ref in tasks if shard in epochs]
        if mine:
            self._background(self._reload(dict(epochs), mine))

    async def _reload(self, epochs: dict[int, int], refs: list[TaskRef]) -> None:
        try:
            self.dispatcher.schedule(await self.runs.load_preloaded_refs(epochs, refs))
        except StoreUnavailable as exc:
            log.warning("cannot reload released tasks", extra={"error": str(exc)})

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def cancel_requested(self, task: Task, reason: str) -> None:
        self.dispatcher.forget(task.id)
        self.gateway.send_cancel(task.id, reason)

    # ---- loops ------------------------------------------------------------------------------

    def _supervise(self, name: str, coro: Awaitable[None]) -> None:
        async def run() -> None:
            await coro

        self._tasks.append(asyncio.create_task(run(), name=name))

    async def _refresh_tenants(self) -> None:
        while True:
            await asyncio.sleep(TENANT_REFRESH_S)
            try:
                await self.tenant_limits.refresh()
            except Exception as exc:  # a failed refresh keeps the previous limits
                log.warning("tenant refresh failed", extra={"error": str(exc)})

    async def _report_backlog(self) -> None:
        """Tell each worker how much waits for it here, to guide its credits (§7)."""
        while True:
            await asyncio.sleep(BACKLOG_REPORT_S)
            for session in list(self.gateway.sessions()):
                self.gateway.send_backlog(session, self.dispatcher.backlog_for(session))

    def _on_dispatched(self, timer: TimerTask, lateness_s: float) -> None:
        self.metrics.observe_dispatch(lateness_s)

    async def wait(self) -> None:
        """Until a supervised loop fails (raises its error) or :meth:`stop` is called."""
        stop = asyncio.create_task(self.stopped.wait(), name="stop-signal")
        done, _ = await asyncio.wait([*self._tasks, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        for task in done:
            if task is not stop and not task.cancelled() and task.exception() is not None:
                log.error("supervised loop failed", extra={"loop": task.get_name()})
                raise task.exception()  # type: ignore[misc]

    # ---- drain and stop ----------------------------------------------------------------------

    async def drain(self) -> None:
        """Give up every shard and send workers elsewhere, but keep serving the API.

        The node re-registers as draining, so every node's target map leaves it out and
        its peers claim the shards it releases.
        """
        if self._draining:
            return
        self._draining = True
        self.info = replace(self.info, draining=True)
        try:
            await self.coordinator.register_node(self.info)
        except CoordinationError as exc:
            # Still release: the shards come back to the others once our lease expires.
            log.warning("cannot mark the node draining in etcd", extra={"error": str(exc)})
        self.gateway.drain_all("scheduler node draining")
        await self.shards.release_all()

    async def stop(self) -> None:
        log.info("scheduler node stopping", extra={"node_id": self.config.node_id})
        await self._health.enter_graceful_shutdown()
        await self.drain()
        loops = [*self._tasks, *self._side_tasks]
        for task in loops:
            task.cancel()
        await self._wait_stopped(loops)
        await self.gateway.stop()
        if self._server is not None:
            await self._server.stop(SERVER_GRACE_S)
        await self.coordinator.close(revoke=True)
        await self.store.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self.stopped.set()
        log.info("scheduler node stopped", extra={"node_id": self.config.node_id})

    @staticmethod
    async def _wait_stopped(tasks: list[asyncio.Task[None]]) -> None:
        """Wait for cancelled loops to end, but not forever: a shutdown must finish even
        if a loop is stuck in a driver call that ignores cancellation."""
        if not tasks:
            return
        done, stuck = await asyncio.wait(tasks, timeout=TASK_STOP_TIMEOUT_S)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning(
                    "loop ended with an error while stopping",
                    extra={"task": task.get_name(), "error": repr(task.exception())},
                )
        for task in stuck:
            log.error(
                "loop did not stop in time; abandoned",
                extra={"task": task.get_name(), "stack": repr(task.get_stack(limit=5))},
            )

    # ---- metrics ------------------------------------------------------------------------------

    def _counters(self) -> dict[str, dict[str, int]]:
        return {
            "dispatcher": dict(self.dispatcher.stats),
            "gateway": dict(self.gateway.stats),
            "preloader": dict(self.preloader.stats),
            "shards": dict(self.shards.stats),
            "reconciler": dict(self.reconciler.stats),
            "liveness": dict(self.liveness.stats),
            "maintenance": dict(self.maintenance.stats),
        }

    def _gauges(self) -> dict[str, float]:
        return {
            "wheel_timers": self.dispatcher.wheel_size(),
            "ready_tasks": self.dispatcher.ready_size(),
            "shards_owned": len(self.shards.epochs()),
            "worker_sessions": len(list(self.gateway.sessions())),
            "self_fenced": 0 if self.shards.dispatch_allowed() else 1,
            # Non-idempotent tasks whose lease expired while their worker may be alive.
            "stalled_tasks": self.reconciler.stalled,
        }
