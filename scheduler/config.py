"""The scheduler node's configuration: one frozen object, validated at start.

Built by :func:`chronoshard.settings.load` from defaults, a TOML file
(``--config`` / ``CHRONOSHARD_CONFIG``) and ``CHRONOSHARD_*`` variables; sections map to
TOML tables and to ``__`` in env names (``[etcd] lease_ttl_s`` is
``CHRONOSHARD_ETCD__LEASE_TTL_S``). Units are in the names. The defaults are the
failure-detection defaults of docs/architecture.md#d12: explicit gRPC keepalives, deadlines on every
call, a pool that checks its connections.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass, field

from chronoshard.scheduler.core.fairness import (
    DEFAULT_CLASS_IN_FLIGHT_CAPS,
    DEFAULT_CLASS_WEIGHTS,
    DEFAULT_CRITICAL_RESERVE_FRACTION,
    FairnessPolicy,
)
from chronoshard.scheduler.core.identities import IdentityError, IdentityMap
from chronoshard.scheduler.core.jitter import DEFAULT_WINDOW_S as DEFAULT_JITTER_WINDOW_S
from chronoshard.scheduler.core.models import (
    DEFAULT_PAYLOAD_LIMIT_BYTES,
    MAX_RETRIES_LIMIT,
    Priority,
)
from chronoshard.scheduler.core.regions import DEFAULT_REGION, RegionPolicy
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.settings import ConfigError, require
from chronoshard.wire import DEFAULT_LEASE_MARGIN_S

DEFAULT_SHARD_COUNT = 64
DEFAULT_NODE_LEASE_TTL_S = 10.0
DEFAULT_LOOKAHEAD_S = 3600.0
DEFAULT_TASK_LEASE_S = 30.0
DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
DEFAULT_LEAD_DISPATCH_S = 0.1
DEFAULT_DISPATCH_GATHER_S = 0.02
DEFAULT_RECONCILE_INTERVAL_S = 5.0
DEFAULT_RETENTION_DAYS = 30
DEFAULT_MAINTENANCE_INTERVAL_S = 3600.0
DEFAULT_MAX_CLOCK_OFFSET_S = 1.0
DEFAULT_CLOCK_SAMPLE_INTERVAL_S = 1.0


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class EtcdConfig:
    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    # Keys live under /{cluster}/: several clusters can share one etcd.
    cluster: str = "chronoshard"
    lease_ttl_s: float = DEFAULT_NODE_LEASE_TTL_S
    # A node stops dispatching once last keep-alive + TTL - margin has passed
    # (docs/architecture.md#d5).
    self_fence_margin_s: float = 2.0
    call_timeout_s: float = 3.0
    username: str | None = None
    password: str | None = None
    # TLS to etcd (docs/operations.md#tls): the CA that signed etcd's certificate (PEM
    # file; set, the connection is TLS), and a client certificate and key for etcd's
    # --client-cert-auth.
    ca_cert: str | None = None
    cert_key: str | None = None
    cert_cert: str | None = None

    def validate(self) -> None:
        require(len(self.endpoints) > 0, "etcd.endpoints", "at least one endpoint is needed")
        require(
            (self.cert_cert is None) == (self.cert_key is None),
            "etcd.cert_cert",
            "cert_cert and cert_key go together",
        )
        require(
            self.cert_cert is None or self.ca_cert is not None,
            "etcd.ca_cert",
            "a client certificate needs TLS: set etcd.ca_cert (the CA of etcd's certificate)",
        )
        require(self.lease_ttl_s >= 2, "etcd.lease_ttl_s", "must be at least 2 seconds")
        require(
            0 <= self.self_fence_margin_s < self.lease_ttl_s,
            "etcd.self_fence_margin_s",
            "must be between 0 and etcd.lease_ttl_s",
        )
        require(self.call_timeout_s > 0, "etcd.call_timeout_s", "must be positive")
        require(
            "/" not in self.cluster and self.cluster != "",
            "etcd.cluster",
            "a non-empty name without '/'",
        )


@dataclass(frozen=True)
class DatabaseConfig:
    dsn: str = "postgresql://postgres@127.0.0.1:5432/chronoshard"
    pool_min_size: int = 2
    pool_max_size: int = 16
    # Longest any one statement may run before PostgreSQL cancels it.
    statement_timeout_s: float = 30.0
    # A session idle inside a transaction this long is ended by PostgreSQL: bounds how
    # long a frozen node's row locks can delay a shard takeover.
    idle_in_transaction_timeout_s: float = 5.0
    # Longest a statement waits for a pooled connection, then fails as unavailable: while
    # PostgreSQL is down, a submit answers UNAVAILABLE within this (below the client's
    # 10 s deadline), and a restart shorter than this fails no request at all.
    acquire_timeout_s: float = 5.0
    # How long a starting node waits for its first connections (PostgreSQL starting too)
    # before it gives up, saying why the last attempt failed (a wrong sslmode, say).
    open_timeout_s: float = 30.0

    def validate(self) -> None:
        require(self.pool_min_size >= 1, "database.pool_min_size", "must be at least 1")
        require(self.open_timeout_s > 0, "database.open_timeout_s", "must be positive")
        require(self.acquire_timeout_s > 0, "database.acquire_timeout_s", "must be positive")
        require(
            self.pool_max_size >= self.pool_min_size,
            "database.pool_max_size",
            "must be at least database.pool_min_size",
        )
        require(self.statement_timeout_s > 0, "database.statement_timeout_s", "must be positive")
        require(
            self.idle_in_transaction_timeout_s > 0,
            "database.idle_in_transaction_timeout_s",
            "must be positive",
        )


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
"""Listen hosts that mean "every interface": nobody can dial them."""


@dataclass(frozen=True)
class GrpcConfig:
    listen: str = "127.0.0.1:7070"
    # What other nodes and workers dial; defaults to `listen`.
    advertise: str | None = None
    max_message_bytes: int = 4 * 1024 * 1024
    # Server pings an idle client this often and drops it if the ack is late
    # (docs/architecture.md#d12).
    keepalive_time_s: float = 10.0
    keepalive_timeout_s: float = 5.0
    # The fastest client ping rate the server tolerates before sending GOAWAY.
    min_client_ping_interval_s: float = 1.0
    # Bounded per-worker send queue (this, or 4 per slot of the worker if more): a stalled
    # worker never blocks others.
    worker_send_queue: int = 4096
    stream_write_timeout_s: float = 5.0
    # TLS (docs/operations.md#tls): the node's certificate chain and key (PEM files), and
    # the CA bundle client certificates must chain to (set: every client needs one). The
    # node re-reads all three when they change, without a restart (certificate rotation).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # Client certificates that stand for a tenant, "SELECTOR => TENANT" each, SELECTOR
    # CN=<subject common name>, URI=<URI SAN> or DNS=<DNS SAN>: such a call needs no API
    # key (one sent anyway must be the same tenant's). Needs tls_client_ca.
    tls_client_identities: tuple[str, ...] = ()

    def validate(self) -> None:
        require(":" in self.listen, "grpc.listen", "expected host:port")
        host = self.listen.rsplit(":", 1)[0]
        require(
            self.advertise is not None or host not in WILDCARD_HOSTS,
            "grpc.advertise",
            f"must be set when grpc.listen is a wildcard address ({self.listen}): it is "
            "what other nodes and workers dial, e.g. the pod IP and port",
        )
        require(
            self.advertise is None
            or (":" in self.advertise and self.advertise.rsplit(":", 1)[0] not in WILDCARD_HOSTS),
            "grpc.advertise",
            "expected host:port with a host others can dial (not a wildcard address)",
        )
        require(self.max_message_bytes >= 64 * 1024, "grpc.max_message_bytes", "at least 64 KiB")
        require(self.keepalive_time_s > 0, "grpc.keepalive_time_s", "must be positive")
        require(self.keepalive_timeout_s > 0, "grpc.keepalive_timeout_s", "must be positive")
        require(self.worker_send_queue >= 1, "grpc.worker_send_queue", "must be at least 1")
        require(
            (self.tls_cert is None) == (self.tls_key is None),
            "grpc.tls_cert",
            "tls_cert and tls_key go together",
        )
        require(
            self.tls_client_ca is None or self.tls_cert is not None,
            "grpc.tls_client_ca",
            "client certificates need TLS: set grpc.tls_cert and grpc.tls_key too",
        )
        require(
            not self.tls_client_identities or self.tls_client_ca is not None,
            "grpc.tls_client_identities",
            "needs grpc.tls_client_ca: only verified client certificates can name a tenant",
        )
        try:
            IdentityMap.parse(self.tls_client_identities)
        except IdentityError as exc:
            raise ConfigError("grpc.tls_client_identities", str(exc)) from None


@dataclass(frozen=True)
class SchedulingConfig:
    # Fixed when the cluster is created (stored in etcd); a node with another value refuses
    # to start rather than hash tasks to different shards.
    shard_count: int = DEFAULT_SHARD_COUNT
    lookahead_s: float = DEFAULT_LOOKAHEAD_S
    preload_interval_s: float = 1.0
    preload_batch: int = 5000
    # Memory cap: the preloader stops pulling once this many tasks wait in the wheel.
    max_preloaded: int = 1_000_000
    wheel_tick_s: float = 0.01
    wheel_slots: int = 512
    lead_dispatch_s: float = DEFAULT_LEAD_DISPATCH_S
    # Timers fire a window at a time (core/rounds.py, Gathering): a task is dispatched
    # between lead_dispatch_s and lead_dispatch_s + dispatch_gather_s before it is due.
    dispatch_gather_s: float = DEFAULT_DISPATCH_GATHER_S
    dispatch_batch_max: int = 1000
    jitter_window_s: float = DEFAULT_JITTER_WINDOW_S

    def validate(self) -> None:
        require(1 <= self.shard_count <= 32767, "scheduling.shard_count", "between 1 and 32767")
        require(self.lookahead_s >= 1, "scheduling.lookahead_s", "must be at least 1 second")
        require(self.preload_interval_s > 0, "scheduling.preload_interval_s", "must be positive")
        require(self.preload_batch >= 1, "scheduling.preload_batch", "must be at least 1")
        require(self.max_preloaded >= 1, "scheduling.max_preloaded", "must be at least 1")
        require(self.wheel_tick_s > 0, "scheduling.wheel_tick_s", "must be positive")
        require(
            self.wheel_slots >= 2 and self.wheel_slots & (self.wheel_slots - 1) == 0,
            "scheduling.wheel_slots",
            "must be a power of two",
        )
        require(0 <= self.lead_dispatch_s <= 5, "scheduling.lead_dispatch_s", "between 0 and 5")
        require(0 <= self.dispatch_gather_s <= 1, "scheduling.dispatch_gather_s", "between 0 and 1")
        require(self.dispatch_batch_max >= 1, "scheduling.dispatch_batch_max", "at least 1")
        require(self.jitter_window_s >= 0, "scheduling.jitter_window_s", "must not be negative")


@dataclass(frozen=True)
class HandoffConfig:
    """A planned shard move (a node joins or drains): see docs/architecture.md."""

    # The old owner keeps a shard (and dispatches it) until its successor says it is warm,
    # at most this long: then it lets go anyway, so a dead or slow successor cannot pin it.
    wait_s: float = 10.0
    # The successor reads the shard's rows due within this before it says it is warm.
    horizon_s: float = 10.0
    # Rows read per statement when warming up or reloading a claimed shard, nearest first.
    load_chunk: int = 2000

    def validate(self) -> None:
        require(self.wait_s >= 0, "handoff.wait_s", "must not be negative")
        require(self.horizon_s >= 0, "handoff.horizon_s", "must not be negative")
        require(self.load_chunk >= 1, "handoff.load_chunk", "must be at least 1")


@dataclass(frozen=True)
class WorkersConfig:
    task_lease_s: float = DEFAULT_TASK_LEASE_S
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    # A DISPATCHED task not acknowledged within this is checked by the reconciler.
    ack_timeout_s: float = 10.0
    # Worker self-fencing (sent to workers in Welcome): a worker stops an attempt once
    # this is left of its lease without a renewal; a node acts on an expired lease only
    # this long after it expired. It absorbs the assignment's transit and a late timer on
    # the worker; a lost worker's tasks wait this much longer.
    lease_margin_s: float = DEFAULT_LEASE_MARGIN_S
    # Each node records which workers have a session with it (worker_sessions), refreshed
    # every third of this; a record older than that belongs to a node that died. A node
    # warming up shards for a planned handoff waits for the workers of the live records.
    # It decides nothing about re-running tasks (leases and fencing do).
    session_timeout_s: float = 15.0
    # Acks, heartbeats and settlements are committed together at most this often.
    group_commit_interval_s: float = 0.002

    def validate(self) -> None:
        require(self.task_lease_s >= 1, "workers.task_lease_s", "must be at least 1 second")
        require(
            0 < self.heartbeat_interval_s < self.task_lease_s,
            "workers.heartbeat_interval_s",
            "must be positive and shorter than workers.task_lease_s",
        )
        # The reconciler takes a DISPATCHED row that nothing touched for ack_timeout_s as
        # never delivered; a worker that holds it refreshes the row with every heartbeat.
        require(
            self.ack_timeout_s > self.heartbeat_interval_s,
            "workers.ack_timeout_s",
            "must be longer than workers.heartbeat_interval_s",
        )
        # ... and a dispatch never delivered must be recognised as such before its lease
        # runs out: after that a non-idempotent one's outcome would count as unknown.
        require(
            self.ack_timeout_s < self.task_lease_s,
            "workers.ack_timeout_s",
            "must be shorter than workers.task_lease_s",
        )
        # A worker renews with every heartbeat and stops an attempt at lease - margin: a
        # healthy worker's next heartbeat must come before that.
        require(
            self.lease_margin_s > 0
            and self.heartbeat_interval_s + self.lease_margin_s < self.task_lease_s,
            "workers.lease_margin_s",
            "must be positive, with workers.heartbeat_interval_s + workers.lease_margin_s "
            "shorter than workers.task_lease_s",
        )
        require(self.session_timeout_s > 0, "workers.session_timeout_s", "must be positive")
        require(
            0 <= self.group_commit_interval_s <= 1,
            "workers.group_commit_interval_s",
            "between 0 and 1 second",
        )


@dataclass(frozen=True)
class ReconcileConfig:
    # How often the reconciler passes over the owned shards (docs/architecture.md#d8).
    interval_s: float = DEFAULT_RECONCILE_INTERVAL_S
    # At most this many in-flight rows are examined per pass; the rest wait for the next.
    batch_limit: int = 1000

    def validate(self) -> None:
        require(self.interval_s > 0, "reconcile.interval_s", "must be positive")
        require(self.batch_limit >= 1, "reconcile.batch_limit", "must be at least 1")


@dataclass(frozen=True)
class SchedulesConfig:
    # Occurrences are created this far ahead of their time (overlap ALLOW). It must exceed
    # the time a crashed owner's shard takes to move (etcd.lease_ttl_s and a claim), so
    # that a crash delays no occurrence; an update withdraws what was created ahead.
    lookahead_s: float = 60.0
    # SKIP and BUFFER_ONE decide each occurrence this long before it is due ("does the
    # previous one still run?" is asked then).
    overlap_lead_s: float = 2.0
    # How often the materialiser passes over the owned shards' schedules (and at once
    # when a schedule of an owned shard changes here).
    interval_s: float = 1.0
    # Schedules decided per statement batch.
    batch: int = 500
    # Occurrences one schedule may create in one pass (the rest in the next).
    max_create: int = 1000
    # While an occurrence waits under BUFFER_ONE, its predecessor is looked at this often.
    buffer_poll_s: float = 1.0

    def validate(self) -> None:
        require(self.lookahead_s >= 1, "schedules.lookahead_s", "must be at least 1 second")
        require(
            0 < self.overlap_lead_s <= self.lookahead_s,
            "schedules.overlap_lead_s",
            "must be positive and at most schedules.lookahead_s",
        )
        require(self.interval_s > 0, "schedules.interval_s", "must be positive")
        require(self.batch >= 1, "schedules.batch", "must be at least 1")
        require(self.max_create >= 1, "schedules.max_create", "must be at least 1")
        require(self.buffer_poll_s > 0, "schedules.buffer_poll_s", "must be positive")


@dataclass(frozen=True)
class WorkflowsConfig:
    # The most bytes of parents' results one assignment carries (their JSON text, summed
    # in the workflow's order): past it, the later parents come with omitted = true and
    # no result (the handler reads them with GetTask). A 1,000-wide fan-in of small
    # results fits; one of large results does not make a 1 GiB message.
    max_parent_results_bytes: int = 1_048_576

    def validate(self) -> None:
        require(
            0 <= self.max_parent_results_bytes <= 64 * 1_048_576,
            "workflows.max_parent_results_bytes",
            "must be between 0 and 64 MiB",
        )


@dataclass(frozen=True)
class MaintenanceConfig:
    # Partition maintenance: one node at a time (advisory lock), this often.
    interval_s: float = DEFAULT_MAINTENANCE_INTERVAL_S
    # Day partitions are created this many days ahead.
    partitions_ahead_days: int = 7
    # Finished day partitions older than this are detached and dropped.
    retention_days: int = DEFAULT_RETENTION_DAYS
    # The longest maintenance waits for the `tasks` table lock before giving up the round:
    # while it waits, dispatch queues behind it.
    lock_timeout_s: float = 0.5
    # After a failed round (lock not granted, database away), try again this soon.
    retry_interval_s: float = 60.0
    # How often a node looks for a new day partition that took rows but has no planner
    # statistics yet, and analyzes it (see docs/operations.md, partitions).
    stats_interval_s: float = 5.0

    def validate(self) -> None:
        require(self.interval_s > 0, "maintenance.interval_s", "must be positive")
        require(self.stats_interval_s > 0, "maintenance.stats_interval_s", "must be positive")
        require(
            self.partitions_ahead_days >= 1,
            "maintenance.partitions_ahead_days",
            "must be at least 1",
        )
        require(self.retention_days >= 1, "maintenance.retention_days", "must be at least 1")
        require(self.lock_timeout_s > 0, "maintenance.lock_timeout_s", "must be positive")
        require(self.retry_interval_s > 0, "maintenance.retry_interval_s", "must be positive")


@dataclass(frozen=True)
class ClockConfig:
    # A node whose wall clock is further than this from PostgreSQL's stops dispatching and
    # hands its shards to its peers until it is back (docs/failure-model.md, clock steps).
    max_offset_s: float = DEFAULT_MAX_CLOCK_OFFSET_S
    # How often the node reads PostgreSQL's clock; a step of the local clock is seen at
    # the next reading.
    sample_interval_s: float = DEFAULT_CLOCK_SAMPLE_INTERVAL_S
    # Readings per sample, back to back; the one with the shortest round trip is kept.
    readings_per_sample: int = 3

    def validate(self) -> None:
        require(
            0.01 <= self.max_offset_s <= 3600,
            "clock.max_offset_s",
            "between 0.01 and 3600 seconds",
        )
        require(
            0.05 <= self.sample_interval_s <= 60,
            "clock.sample_interval_s",
            "between 0.05 and 60 seconds",
        )
        require(
            1 <= self.readings_per_sample <= 10, "clock.readings_per_sample", "between 1 and 10"
        )


@dataclass(frozen=True)
class LimitsConfig:
    payload_limit_bytes: int = DEFAULT_PAYLOAD_LIMIT_BYTES
    max_batch_tasks: int = 10_000
    default_max_retries: int = 3
    max_retries_limit: int = 100
    default_timeout_s: float = 3600.0
    max_list_page_size: int = 1000

    def validate(self) -> None:
        require(self.payload_limit_bytes >= 1024, "limits.payload_limit_bytes", "at least 1 KiB")
        require(self.max_batch_tasks >= 1, "limits.max_batch_tasks", "must be at least 1")
        require(
            0 <= self.default_max_retries <= MAX_RETRIES_LIMIT,
            "limits.default_max_retries",
            f"must be in 0..{MAX_RETRIES_LIMIT}",
        )
        require(
            0 <= self.max_retries_limit <= MAX_RETRIES_LIMIT,
            "limits.max_retries_limit",
            f"must be in 0..{MAX_RETRIES_LIMIT}",
        )
        require(
            math.isfinite(self.default_timeout_s) and self.default_timeout_s > 0,
            "limits.default_timeout_s",
            "must be a positive, finite number of seconds",
        )


@dataclass(frozen=True)
class HealthConfig:
    """The node's gRPC health (docs/operations.md#health-and-probes)."""

    # How often the node re-checks its conditions (database, etcd lease, clock).
    interval_s: float = 1.0
    # A database probe (SELECT 1) slower than this counts as the database being down; it
    # runs only when no other call succeeded within the last interval.
    database_timeout_s: float = 2.0

    def validate(self) -> None:
        require(
            math.isfinite(self.interval_s) and self.interval_s > 0,
            "health.interval_s",
            "must be a positive number of seconds",
        )
        require(
            math.isfinite(self.database_timeout_s) and self.database_timeout_s > 0,
            "health.database_timeout_s",
            "must be a positive number of seconds",
        )


@dataclass(frozen=True)
class FairnessConfig:
    """How the priority classes share a node's worker slots (the fair selector's policy;
    docs/operations.md#priority-classes-and-fair-queuing has the rules and an example)."""

    # Shares of dispatches between classes that all have work waiting (stride scheduling);
    # with strict_critical, critical goes first whenever it waits and its weight is unused.
    critical_weight: float = DEFAULT_CLASS_WEIGHTS[Priority.CRITICAL]
    standard_weight: float = DEFAULT_CLASS_WEIGHTS[Priority.STANDARD]
    bulk_weight: float = DEFAULT_CLASS_WEIGHTS[Priority.BULK]
    strict_critical: bool = True
    # While a critical task waits, standard plus bulk in flight stay within (1 - this) of
    # the node's worker slots: the rest is kept for critical work. Lent out when none waits.
    critical_reserve_fraction: float = DEFAULT_CRITICAL_RESERVE_FRACTION
    # While a task of a higher class waits, this class may hold at most this share of the
    # slots in flight (1.0: no cap). Running tasks are never preempted.
    standard_cap_fraction: float = DEFAULT_CLASS_IN_FLIGHT_CAPS[Priority.STANDARD]
    bulk_cap_fraction: float = DEFAULT_CLASS_IN_FLIGHT_CAPS[Priority.BULK]

    def policy(self) -> FairnessPolicy:
        """The selector's policy. Raises ConfigError naming the key of a bad value."""
        for name in ("critical_weight", "standard_weight", "bulk_weight"):
            value = getattr(self, name)
            require(
                math.isfinite(value) and value > 0,
                f"fairness.{name}",
                "must be a positive, finite number",
            )
        for name in ("standard_cap_fraction", "bulk_cap_fraction"):
            value = getattr(self, name)
            require(0.0 <= value <= 1.0, f"fairness.{name}", "must be in [0, 1]")
        require(
            0.0 <= self.critical_reserve_fraction < 1.0,
            "fairness.critical_reserve_fraction",
            "must be in [0, 1)",
        )
        return FairnessPolicy(
            class_weights={
                Priority.CRITICAL: self.critical_weight,
                Priority.STANDARD: self.standard_weight,
                Priority.BULK: self.bulk_weight,
            },
            class_in_flight_caps={
                Priority.STANDARD: self.standard_cap_fraction,
                Priority.BULK: self.bulk_cap_fraction,
            },
            critical_reserve_fraction=self.critical_reserve_fraction,
            strict_critical=self.strict_critical,
        )

    def validate(self) -> None:
        self.policy()


@dataclass(frozen=True)
class RegionConfig:
    """Where the cluster runs, and whose tenants it serves (docs/operations.md#regions)."""

    # The cluster's region: a tenant homed elsewhere is refused with FAILED_PRECONDITION
    # (reason WRONG_REGION) naming its home region.
    name: str = DEFAULT_REGION
    # Home regions this cluster serves as well: the regions it took over in a disaster
    # recovery (docs/operations.md#disaster-recovery).
    adopted: tuple[str, ...] = ()

    def policy(self) -> RegionPolicy:
        """Raises ConfigError naming the key of a bad region name."""
        try:
            return RegionPolicy.of(self.name, self.adopted)
        except InvalidArgument as exc:
            raise ConfigError(exc.field, exc.message) from None

    def validate(self) -> None:
        self.policy()


@dataclass(frozen=True)
class SchedulerConfig:
    node_id: str = field(default_factory=default_node_id)
    metrics_listen: str = "127.0.0.1:9464"
    # Ready depth is exported per tenant for the busiest this many; the rest as "other".
    metrics_tenant_series: int = 10
    log_level: str = "INFO"
    # "json" (one object per line) or "text".
    log_format: str = "json"
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    handoff: HandoffConfig = field(default_factory=HandoffConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)
    schedules: SchedulesConfig = field(default_factory=SchedulesConfig)
    workflows: WorkflowsConfig = field(default_factory=WorkflowsConfig)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    clock: ClockConfig = field(default_factory=ClockConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    fairness: FairnessConfig = field(default_factory=FairnessConfig)
    region: RegionConfig = field(default_factory=RegionConfig)

    def validate(self) -> None:
        require(
            0 <= self.metrics_tenant_series <= 1000,
            "metrics_tenant_series",
            "must be in 0..1000",
        )
        require(self.node_id != "" and "/" not in self.node_id, "node_id", "non-empty, no '/'")
        require(self.log_format in {"json", "text"}, "log_format", "either 'json' or 'text'")
        require(
            self.log_level.upper() in {"DEBUG", "INFO", "WARNING", "ERROR"},
            "log_level",
            "one of DEBUG, INFO, WARNING, ERROR",
        )
