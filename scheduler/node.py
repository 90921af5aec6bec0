"""A scheduler node: the pieces wired together, supervised, and shut down in order.

Start-up order: store pool → cluster clock (a first reading of PostgreSQL's clock: every
"now" from here on is the cluster's) → etcd (lease, cluster shard count) → tenant limits
→ worker sessions, the gRPC server bound (not yet serving) and the metrics endpoint →
shard manager, dispatcher, settlements and the WorkerService gateway, preloader, the
change router (cluster/routing.py) → reconciler, liveness, maintenance → gRPC server
started (TaskService, WorkerService, AdminService, health, reflection) → node registered
in etcd (only now can peers assign it shards and workers find it) → the supervised loops.

The loops (cluster clock, shard manager, dispatcher, preloader, reconciler, worker
session records, partition maintenance, tenant refresher, backlog reports) are named
tasks; the node waits on them with FIRST_EXCEPTION, so a crashed loop stops the node
loudly rather than leaving it half alive. Shutdown (SIGTERM) runs in this order (STYLE #4):

1. health NOT_SERVING (load balancers stop sending);
2. every shard handed over: the node re-registers as draining, its successors warm up
   and it lets each shard go once its successor is ready, dispatching it until then (at
   most ``handoff.wait_s``; whatever is left is then released);
3. workers told to go elsewhere and not to reconnect (``Drain{shutting_down}``);
4. loops stopped; the group commits take no more requests and flush what they hold,
   each request answered (its ``Receipt`` queued). What arrives from then on is refused
   at once with the retryable ``NODE_STOPPING`` (on a stream as the ``Receipt``'s
   error, on a unary call as ``UNAVAILABLE``): the worker resends it elsewhere, and
   nothing waits for a flush that will never come;
5. worker streams ended by the node, each once what was queued for it is sent: left
   open (they never end on their own) they held the server's whole grace;
6. gRPC server stopped with a grace period (``SERVER_GRACE_S``) for in-flight unary
   calls; then the submits' group commit, which served them, flushes and stops;
7. etcd lease revoked; database pool closed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Collection, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chronoshard import __version__
from chronoshard.clock import Clock, SystemClock
from chronoshard.http_endpoint import HttpServer
from chronoshard.scheduler import garbage
from chronoshard.scheduler.api.access import AccessInterceptor
from chronoshard.scheduler.api.admin import AdminServicer
from chronoshard.scheduler.api.auth import Authenticator, CertificateTenants
from chronoshard.scheduler.api.boundary import RequestDecoding
from chronoshard.scheduler.api.expectations import WatchdogServiceServicer
from chronoshard.scheduler.api.quotas import SubmitQuotas
from chronoshard.scheduler.api.schedule_requests import occurrence_builder
from chronoshard.scheduler.api.schedules import ScheduleServiceServicer, pacing_of
from chronoshard.scheduler.api.server import (
    HealthPublisher,
    HealthServicer,
    add_service,
    bind,
    server_options,
)
from chronoshard.scheduler.api.task_requests import SubmitLimits
from chronoshard.scheduler.api.tasks import TaskServiceServicer
from chronoshard.scheduler.api.workers import Gateway
from chronoshard.scheduler.api.workflows import WorkflowServiceServicer
from chronoshard.scheduler.cluster.clock import ClusterClock
from chronoshard.scheduler.cluster.coordination import CoordinationError, EtcdCoordinator, NodeInfo
from chronoshard.scheduler.cluster.liveness import REFRESHES_PER_TIMEOUT, WorkerLiveness
from chronoshard.scheduler.cluster.maintenance import PartitionMaintenance
from chronoshard.scheduler.cluster.materialiser import Materialiser
from chronoshard.scheduler.cluster.reconciler import Reconciler
from chronoshard.scheduler.cluster.routing import ChangeRouter
from chronoshard.scheduler.cluster.shards import ShardManager
from chronoshard.scheduler.cluster.signals import ShardSignals
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core import health
from chronoshard.scheduler.core.identities import IdentityMap
from chronoshard.scheduler.core.models import Task
from chronoshard.scheduler.core.quotas import HeldBy
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.core.schedules import Schedule
from chronoshard.scheduler.core.worker_sessions import DescribedSessions, SessionOwners
from chronoshard.scheduler.dispatch.dispatcher import Dispatcher
from chronoshard.scheduler.dispatch.preloader import Preloader
from chronoshard.scheduler.dispatch.sessions import SessionRegistry
from chronoshard.scheduler.dispatch.settlements import Settlements
from chronoshard.scheduler.dispatch.tenant_limits import TenantLimitsCache
from chronoshard.scheduler.metrics import (
    LabelledCounter,
    LabelledGauge,
    NodeCollector,
    SchedulerMetrics,
    StatsFamily,
    TenantLabels,
    ready_depth,
    tenant_totals,
)
from chronoshard.scheduler.store.database import SessionLimits, Store
from chronoshard.scheduler.store.quotas import DispatchQuotaStore
from chronoshard.scheduler.store.repairs import RepairStore
from chronoshard.scheduler.store.runs import RunStore
from chronoshard.scheduler.store.schedules import ScheduleStore
from chronoshard.scheduler.store.sessions import WorkerSessionStore
from chronoshard.scheduler.store.submits import SubmitStore
from chronoshard.scheduler.store.tenants import TenantStore
from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    schedule_service_pb2,
    schedule_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    watchdog_service_pb2,
    watchdog_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)

log = logging.getLogger(__name__)

TASK_STOP_TIMEOUT_S = 5.0
SERVER_GRACE_S = 5.0


@dataclass(frozen=True)
class NodeAddresses:
    grpc: str
    metrics: str


class _WorkerPresence:
    """The shard manager's view of workers: this node's sessions, the cluster's rows."""

    def __init__(
        self, sessions: SessionRegistry, store: WorkerSessionStore, *, within_s: float
    ) -> None:
        self._sessions = sessions
        self._store = store
        self._within_s = within_s

    def connected(self) -> set[str]:
        return self._sessions.worker_ids()

    async def seen_on(self, node_ids: Collection[str]) -> set[str]:
        return await self._store.workers_seen(node_ids, self._within_s)


class _ScheduleChanges:
    """The ScheduleService's listener: a changed schedule wakes the materialiser (if this
    node owns its shard); tasks a trigger or backfill created are routed like submits."""

    def __init__(self, materialiser: Materialiser, router: ChangeRouter) -> None:
        self._materialiser = materialiser
        self._router = router

    def schedule_changed(self, schedule: Schedule) -> None:
        self._materialiser.schedule_changed(schedule)

    def tasks_submitted(self, tasks: Sequence[Task]) -> None:
        self._router.tasks_submitted(tasks)


class SchedulerNode:
    def __init__(self, config: SchedulerConfig, clock: Clock | None = None) -> None:
        self.config = config
        # The host's clocks: only the cluster clock reads its wall clock (for the offset).
        self.host_clock = clock or SystemClock()
        self.metrics = SchedulerMetrics(config.node_id, __version__)
        self._tasks: list[asyncio.Task[None]] = []
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._server: grpc.aio.Server | None = None
        self._task_service: TaskServiceServicer | None = None
        self._health = HealthServicer()
        self._health_publisher = HealthPublisher(self._health, config.node_id)
        # Whether PostgreSQL answered at the last health check (docs/operations.md).
        self._database_up = True
        self._metrics_server: HttpServer | None = None
        self._draining = False
        # Drain and undrain run one at a time (an undrain waits for the shards to be
        # released before it lets the node claim again).
        self._drain_lock = asyncio.Lock()
        self.addresses: NodeAddresses | None = None
        self.stopped = asyncio.Event()

    # ---- start ------------------------------------------------------------------------------

    async def start(self) -> NodeAddresses:
        config = self.config
        shard_count = await self._connect()
        self.sessions = SessionRegistry(
            config.node_id,
            self.clock,
            send_queue=config.grpc.worker_send_queue,
            max_parent_results_bytes=config.workflows.max_parent_results_bytes,
        )
        # WorkerService and AdminService calls need an API key (api/access.py); TaskService
        # and WatchdogService check theirs in the servicer, scoped to the key's tenant.
        self._server = grpc.aio.server(
            options=server_options(config),
            # Decoding first: garbage is INVALID_ARGUMENT whatever the key (api/boundary.py).
            interceptors=[RequestDecoding(), AccessInterceptor(self.authenticator)],
        )
        port = bind(self._server, config.grpc)
        host = config.grpc.listen.rsplit(":", 1)[0]
        grpc_address = config.grpc.advertise or f"{host}:{port}"
        metrics_address = await self._start_metrics()
        self.info = NodeInfo(
            node_id=config.node_id,
            address=grpc_address,
            metrics_address=metrics_address,
            started_at=self.clock.now().isoformat().replace("+00:00", "Z"),
            # Out of bound already at start: peers must not count on this node's shards.
            clock_skewed=self.clock.skewed,
        )
        self._build_dispatch(shard_count)
        self._build_cluster_loops(shard_count)
        self._add_services(self._server, shard_count)
        self.metrics.register(
            NodeCollector(
                config.node_id,
                self._stats_families(),
                self._gauges,
                self._labelled_gauges,
                self._labelled_counters,
            )
        )

        self.settlements.start()
        await self._publish_health()
        await self._server.start()
        await self.coordinator.register_node(self.info)
        self._supervise_loops()
        self.addresses = NodeAddresses(grpc_address, metrics_address)
        log.info(
            "scheduler node started",
            extra={"node_id": config.node_id, "grpc": grpc_address, "metrics": metrics_address},
        )
        return self.addresses

    async def _connect(self) -> int:
        """Store pool, cluster clock (its first reading), etcd; the cluster's shard count."""
        config = self.config
        self.store = await Store.open(
            config.database.dsn,
            config.database.pool_min_size,
            config.database.pool_max_size,
            acquire_timeout_s=config.database.acquire_timeout_s,
            open_timeout_s=config.database.open_timeout_s,
            session_limits=SessionLimits(
                statement_timeout_s=config.database.statement_timeout_s,
                idle_in_transaction_s=config.database.idle_in_transaction_timeout_s,
            ),
            timings=self.metrics.database,
        )
        # The node's dispatch rounds check their tenants' quotas for the whole cluster.
        self.dispatch_quotas = DispatchQuotaStore(self.store, config.node_id)
        self.runs = RunStore(self.store, self.dispatch_quotas)
        store = self.store
        self.clock = ClusterClock(
            self.host_clock,
            config.clock,
            lambda count: store.read_clock(count, self.host_clock),
        )
        await self.clock.sample()
        self.clock.check()
        self.coordinator = EtcdCoordinator(
            config.etcd, config.node_id, self.clock, timings=self.metrics.etcd
        )
        await self.coordinator.connect()
        await self.coordinator.start_lease()
        shard_count = await self.coordinator.ensure_shard_count(config.scheduling.shard_count)
        await self.coordinator.ensure_epoch_base(await self.store.highest_shard_epoch())
        tenants = TenantStore(self.store)
        # One key cache for every service: a key checked by one is known to the others.
        identities = config.grpc.tls_client_identities
        self.authenticator = Authenticator(
            tenants,
            certificates=(
                CertificateTenants(IdentityMap.parse(identities), tenants) if identities else None
            ),
            regions=config.region.policy(),
        )
        self.tenant_limits = TenantLimitsCache(tenants.list_tenants)
        await self.tenant_limits.refresh()
        return shard_count

    def _build_dispatch(self, shard_count: int) -> None:
        """Shard manager, dispatcher, settlements, the worker gateway, preloader, and the
        router that tells them (or other nodes) about changed tasks."""
        config = self.config
        self.shards = ShardManager(
            self.info,
            shard_count,
            self.clock,
            self.coordinator,
            self.store,
            self.runs,
            handoff=config.handoff,
            max_preloaded=config.scheduling.max_preloaded,
            workers=_WorkerPresence(
                self.sessions,
                WorkerSessionStore(self.store),
                # Live sessions are re-recorded every session_timeout / REFRESHES_PER_TIMEOUT.
                within_s=2 * config.workers.session_timeout_s / REFRESHES_PER_TIMEOUT,
            ),
        )
        self.dispatcher = Dispatcher(
            config,
            self.clock,
            self.runs,
            self.sessions,
            self.shards,
            self.tenant_limits,
            on_dispatched=self._on_dispatched,
        )
        self.settlements = Settlements(config.workers, self.runs, self.clock, self.dispatcher)
        # Whose key opened each worker stream: its record and ListWorkerSessions say so.
        self.session_owners = SessionOwners()
        self.described_sessions = DescribedSessions(self.sessions, self.session_owners, self.clock)
        self.gateway = Gateway(
            config,
            self.sessions,
            self.settlements,
            authenticator=self.authenticator,
            owners=self.session_owners,
        )
        self.preloader = Preloader(config, self.clock, self.runs, self.dispatcher, self.shards)
        self.dispatcher.on_preloaded_unknown = self.preloader.resync
        self.signals = ShardSignals(config.database.dsn, self.store)
        self.signals.on_tenants_changed = self.tenant_limits.refresh_soon
        self.router = ChangeRouter(
            clock=self.clock,
            lookahead_s=config.scheduling.lookahead_s,
            shards=self.shards,
            preloader=self.preloader,
            dispatcher=self.dispatcher,
            sessions=self.sessions,
            runs=self.runs,
            signals=self.signals,
        )
        self.dispatcher.on_remote_ready = self.router.ready_elsewhere
        self.tenant_limits.on_changed = self.dispatcher.tenant_limits_changed
        self.shards.on_remote_due = self.router.due_elsewhere
        self.shards.publish_clock_skewed = self._publish_clock_skewed
        self.clock.on_skew_changed = self._clock_skew_changed
        if self.clock.skewed:
            self._clock_skew_changed(True)
        # A joining node must have worker sessions before it takes shards over: workers
        # otherwise find it only at their next periodic topology refresh.
        self.shards.on_membership_changed = self.sessions.announce_topology
        self.shards.attach(self.dispatcher, self.preloader)

    def _build_cluster_loops(self, shard_count: int) -> None:
        """Reconciler, worker liveness records and partition maintenance."""
        config = self.config
        self.reconciler = Reconciler(
            config,
            self.clock,
            RepairStore(self.store),
            self.shards,
            self.sessions,
            self.dispatcher,
            shard_count,
        )
        self.liveness = WorkerLiveness(
            config.node_id,
            config.workers.session_timeout_s,
            self.described_sessions,
            WorkerSessionStore(self.store),
        )
        self.sessions.on_sessions_changed = self._sessions_changed
        self.materialiser = Materialiser(
            config,
            self.clock,
            self.store,
            ScheduleStore(self.store, SubmitStore(self.store)),
            self.shards,
            pacing_of(config),
            occurrence_builder(SubmitLimits.from_config(config)),
            self.router.tasks_submitted,
        )

        def claimed() -> None:
            # A claimed shard's previous owner may have left intents it never delivered,
            # and its schedules are ours to go on with.
            self.reconciler.wake()
            self.materialiser.wake()

        self.shards.on_claimed = claimed
        self.maintenance = PartitionMaintenance(config.maintenance, self.store)

    def _supervise_loops(self) -> None:
        self._supervise("clock", self.clock.run())
        self._supervise("shards", self.shards.run())
        self._supervise("dispatcher", self.dispatcher.run())
        self._supervise("preloader", self.preloader.run())
        self._supervise("reconciler", self.reconciler.run())
        self._supervise("materialiser", self.materialiser.run())
        self._supervise("liveness", self.liveness.run())
        self._supervise("maintenance", self.maintenance.run())
        self._supervise("tenant-refresh", self.tenant_limits.run())
        self._supervise("backlog-report", self.dispatcher.report_backlogs())
        self._supervise("signals", self.signals.listen())
        self._supervise("health", self._watch_health())
        # Full collections on the node's schedule, not whenever a backlog grows the heap
        # (the scheduler's entry point took the automatic ones over, process-wide).
        self._supervise("garbage", garbage.collect_periodically())

    async def _start_metrics(self) -> str:
        # On the event loop (chronoshard.http_endpoint): a scrape reads the components'
        # counters on the thread that writes them and contends with nothing for the GIL.
        registry = self.metrics.registry
        self._metrics_server = HttpServer(
            self.config.metrics_listen,
            {"/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry))},
        )
        return await self._metrics_server.start()

    def _add_services(self, server: grpc.aio.Server, shard_count: int) -> None:
        add_service(
            server, worker_service_pb2_grpc.add_WorkerServiceServicer_to_server, self.gateway
        )
        admin = AdminServicer(
            self.config.node_id,
            shard_count,
            self.coordinator,
            self.shards,
            drain=self.drain,
            undrain=self.undrain,
            is_draining=lambda: self._draining,
            authenticator=self.authenticator,
            clock=self.clock,
            session_records=WorkerSessionStore(self.store),
            own_sessions=self.described_sessions,
            session_timeout_s=self.config.workers.session_timeout_s,
        )
        add_service(server, admin_service_pb2_grpc.add_AdminServiceServicer_to_server, admin)
        names = [
            admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
            worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
        ]
        self.submit_quotas = SubmitQuotas(
            self.config.node_id,
            self.clock,
            self.tenant_limits.submit_rate,
            lambda: self.shards.members.keys(),
        )
        self._throttle_labels = TenantLabels(self.config.metrics_tenant_series)
        api = self._task_service = TaskServiceServicer(
            config=self.config,
            store=self.store,
            authenticator=self.authenticator,
            clock=self.clock,
            listener=self.router,
            submit_quotas=self.submit_quotas,
        )
        add_service(server, task_service_pb2_grpc.add_TaskServiceServicer_to_server, api)
        names.append(task_service_pb2.DESCRIPTOR.services_by_name["TaskService"].full_name)
        schedules = ScheduleServiceServicer(
            config=self.config,
            store=self.store,
            authenticator=self.authenticator,
            clock=self.clock,
            listener=_ScheduleChanges(self.materialiser, self.router),
        )
        add_service(
            server, schedule_service_pb2_grpc.add_ScheduleServiceServicer_to_server, schedules
        )
        names.append(schedule_service_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name)
        workflows = WorkflowServiceServicer(
            config=self.config,
            store=self.store,
            authenticator=self.authenticator,
            clock=self.clock,
            listener=self.router,
        )
        add_service(
            server, workflow_service_pb2_grpc.add_WorkflowServiceServicer_to_server, workflows
        )
        names.append(workflow_service_pb2.DESCRIPTOR.services_by_name["WorkflowService"].full_name)
        watch = WatchdogServiceServicer(store=self.store, authenticator=self.authenticator)
        add_service(server, watchdog_service_pb2_grpc.add_WatchdogServiceServicer_to_server, watch)
        names.append(watchdog_service_pb2.DESCRIPTOR.services_by_name["WatchdogService"].full_name)
        add_service(server, health_pb2_grpc.add_HealthServicer_to_server, self._health)
        names.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], server)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # ---- loops ------------------------------------------------------------------------------

    def _supervise(self, name: str, coro: Awaitable[None]) -> None:
        async def run() -> None:
            await coro

        self._tasks.append(asyncio.create_task(run(), name=name))

    def _sessions_changed(self) -> None:
        self.liveness.sessions_changed()  # recorded at once: peers warming up wait on it
        self.dispatcher.sessions_changed()

    # ---- clock skew -------------------------------------------------------------------------

    def _clock_skew_changed(self, skewed: bool) -> None:
        """The cluster clock judged this node's clock out of bound, or back within it."""
        self.shards.set_clock_skewed(skewed)
        self._background(self._publish_health())

    # ---- health -------------------------------------------------------------------------------

    async def _publish_health(self) -> None:
        """Each gRPC health service's status from the node's conditions (core/health.py)."""
        await self._health_publisher.publish(
            lambda: health.serving(
                health.NodeConditions(
                    draining=self._draining,
                    database_up=self._database_up,
                    lease_valid=self.coordinator.lease_valid(self.clock.monotonic()),
                    clock_skewed=self.clock.skewed,
                )
            )
        )

    async def _watch_health(self) -> None:
        """Re-check the conditions every ``health.interval_s``: the database by its last
        successful call or a probe, the lease and the clock by what they know. A change
        shows within one interval (plus the probe's timeout for the database)."""
        config = self.config.health
        while True:
            await asyncio.sleep(config.interval_s)
            self._database_up = await self.store.reachable(
                config.database_timeout_s, within_s=config.interval_s
            )
            await self._publish_health()

    async def _publish_clock_skewed(self, skewed: bool) -> None:
        self.info = replace(self.info, clock_skewed=skewed)
        # The registration a lost lease is recovered with must carry the flag too.
        self.shards.set_node_info(self.info)
        await self.coordinator.register_node(self.info)

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

    async def drain(
        self, reason: str = "scheduler node draining", *, shutting_down: bool = False
    ) -> None:
        """Hand every shard over and send workers elsewhere, but keep answering API calls.

        Health turns NOT_SERVING (load balancers stop sending new calls), and the node
        re-registers as draining in etcd, so every node's target map leaves it out and
        every node's GetTopology shows it draining. Its successors warm up and take the
        shards over while it keeps dispatching them (bounded by ``handoff.wait_s``); only
        then are workers told to go elsewhere, so they keep their credits here until the
        last shard has moved.
        """
        async with self._drain_lock:
            if self._draining:
                if shutting_down:
                    self.sessions.drain_all(reason, shutting_down=True)
                return
            self._draining = True
            log.info("node draining", extra={"node_id": self.config.node_id, "reason": reason})
            await self._publish_health()
            if await self._register(draining=True):
                await self.shards.hand_off_all()
            else:
                # No target map leaves this node out: nobody warms up for its shards.
                await self.shards.release_all()
            self.sessions.drain_all(reason, shutting_down=shutting_down)

    async def undrain(self) -> None:
        """Undo :meth:`drain`: registered as available again (peers hand back its share
        of the shards and it claims them), SERVING, and its workers told to grant it
        credits again."""
        async with self._drain_lock:
            if not self._draining:
                return
            self._draining = False
            log.info("node undrained", extra={"node_id": self.config.node_id})
            self.shards.resume()
            await self._register(draining=False)
            self.sessions.resume()
            await self._publish_health()

    async def _register(self, *, draining: bool) -> bool:
        """Record the draining state in etcd; False if etcd refused."""
        self.info = replace(self.info, draining=draining)
        self.shards.set_node_info(self.info)
        try:
            await self.coordinator.register_node(self.info)
        except CoordinationError as exc:
            # Carry on: a drain still releases (the shards come back to the others once
            # our lease expires); an undrain is re-registered with the next lease.
            log.warning(
                "cannot record the node's draining state in etcd",
                extra={"draining": draining, "error": str(exc)},
            )
            return False
        return True

    async def stop(self) -> None:
        log.info("scheduler node stopping", extra={"node_id": self.config.node_id})
        await self._health.enter_graceful_shutdown()
        await self.drain("scheduler node shutting down", shutting_down=True)
        loops = [*self._tasks, *self._side_tasks, *self.router.in_flight()]
        for task in loops:
            task.cancel()
        await self._wait_stopped(loops)
        await self.gateway.stop()
        if self._server is not None:
            await self._server.stop(SERVER_GRACE_S)
        if self._task_service is not None:
            # After the grace: submits still in flight in it were answered.
            await self._task_service.stop()
        await self.coordinator.close(revoke=True)
        await self.store.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()
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

    def _stats_families(self) -> list[StatsFamily]:
        assert self._task_service is not None
        committers = [*self.settlements.committers, self._task_service.submits]
        return [
            StatsFamily("dispatcher", self.dispatcher),
            *(StatsFamily(name, part) for name, part in self.dispatcher.structures().items()),
            StatsFamily("preloader", self.preloader),
            # One family (chronoshard_gateway_*) for the worker edge.
            StatsFamily("gateway", self.sessions),
            StatsFamily("gateway", self.gateway),
            StatsFamily("gateway", self.settlements),
            *(StatsFamily("group_commit", c, {"committer": c.name}) for c in committers),
            StatsFamily("tenant_limits", self.tenant_limits),
            StatsFamily("submit_quotas", self.submit_quotas),
            StatsFamily("dispatch_quotas", self.dispatch_quotas),
            StatsFamily("shards", self.shards),
            StatsFamily("signals", self.signals),
            StatsFamily("clock", self.clock),
            StatsFamily("reconciler", self.reconciler),
            StatsFamily("materialiser", self.materialiser),
            StatsFamily("liveness", self.liveness),
            StatsFamily("maintenance", self.maintenance),
        ]

    def _gauges(self) -> dict[str, float]:
        return {
            "worker_sessions": len(self.sessions.live()),
            # Credits workers granted this node, unused: ready tasks with none here mean
            # every worker is busy (or, if they idle, credits are stuck elsewhere).
            "worker_credits": self.sessions.credits_held(),
            "self_fenced": 0 if self.coordinator.lease_valid(self.clock.monotonic()) else 1,
            "database_up": 1 if self._database_up else 0,
            # Local wall clock minus the cluster's (PostgreSQL's), and whether that is
            # beyond clock.max_offset_s (nothing dispatched, shards handed off).
            "clock_offset_seconds": self.clock.offset_s,
            "clock_offset_error_seconds": self.clock.error_s,
            # Non-idempotent tasks of the owned shards whose attempt's outcome is unknown,
            # held for a late settlement or an operator (chronoshard tasks resolve).
            "outcome_unknown_tasks": self.reconciler.outcome_unknown,
        }

    def _labelled_counters(self) -> list[LabelledCounter]:
        counts: dict[tuple[uuid.UUID, str], int] = {
            (tenant, str(held_by)): count
            for (tenant, held_by), count in self.dispatcher.throttles().items()
        }
        for tenant, count in self.submit_quotas.refused().items():
            counts[(tenant, str(HeldBy.SUBMIT_RATE))] = count
        return [
            LabelledCounter(
                "tenant_throttled",
                "Times a tenant was held back by its quotas, by reason: rate and "
                "concurrency (ready work held from dispatch on this node), submit_rate "
                "(submit calls refused here); the first tenants by id, later ones as 'other'",
                ("tenant", "reason"),
                tenant_totals(counts, self._throttle_labels),
            )
        ]

    def _labelled_gauges(self) -> list[LabelledGauge]:
        depths = ready_depth(self.dispatcher.ready_depths(), self.config.metrics_tenant_series)
        return [
            LabelledGauge(
                "ready_depth",
                "Ready tasks waiting for a worker slot, by queue, priority and tenant (the "
                "busiest tenants by id, the rest as 'other')",
                ("queue", "priority", "tenant"),
                {key: float(count) for key, count in depths.items()},
            ),
            LabelledGauge(
                "health_serving",
                "1 while the gRPC health service is SERVING ('' is the overall readiness)",
                ("service",),
                {
                    (name,): 1.0 if serving else 0.0
                    for name, serving in self._health_publisher.serving.items()
                },
            ),
        ]
