"""Cluster coordination through etcd: the node lease, membership and shard claims.

This is the one module that talks to etcd (docs/architecture.md#d5, #d12), so the client library can
be replaced here alone. Keys live under ``/{cluster}/``:

* ``config/shard_count`` — fixed when the first node creates the cluster;
* ``config/epoch_base`` — fixed by the first node that finds this etcd without one: the
  highest epoch PostgreSQL had recorded then (:meth:`EtcdCoordinator.ensure_epoch_base`);
* ``nodes/{node_id}`` — a JSON description of a live node, attached to its lease;
* ``shards/{shard}`` — the owning node id, attached to the owner's lease. The key's
  ``create_revision`` plus the epoch base is the shard's **epoch**: claims are
  ``create_revision == 0 → put`` transactions, so each successful claim gets a revision
  no earlier claim had. The base is why a *fresh* etcd (a disaster recovery, a lost etcd
  cluster rebuilt) still fences: its revisions restart at 1, but its epochs start above
  every epoch the (replicated) database holds, so the shard owners' rows move forward
  instead of refusing every claim as going backwards;
* ``handoff/{shard}`` — the node id of the shard's incoming owner once it is warm
  (:mod:`chronoshard.scheduler.core.handoff`), attached to that node's lease; deleted by the claim
  that follows.

The node lease is kept alive by our own loop rather than the library's helper so we
know the time of the last *successful* renewal: the node fences itself once
``last renewal + TTL − margin`` has passed (:meth:`EtcdCoordinator.lease_deadline`). A
keep-alive answer with TTL ≤ 0 means the lease is gone and every key attached to it with
it; :meth:`EtcdCoordinator.lease_lost` is then set and the node must re-register and
re-claim under a new lease (new epochs). Every call has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from etcd3aio import Etcd3Client, EtcdError, prefix_range_end
from etcd3aio.kv import KVService

from chronoshard.clock import Clock
from chronoshard.scheduler.config import EtcdConfig
from chronoshard.scheduler.errors import SchedulerError

log = logging.getLogger(__name__)

T = TypeVar("T")


class CoordinationError(SchedulerError):
    """Raised when etcd cannot be reached or refused a call; the node retries."""

    reason = "COORDINATION_UNAVAILABLE"
    retryable = True
    grpc_code_name = "UNAVAILABLE"


class ShardCountMismatch(SchedulerError):
    """Raised at start when the cluster's stored shard count differs from the config."""

    reason = "SHARD_COUNT_MISMATCH"
    grpc_code_name = "FAILED_PRECONDITION"

    def __init__(self, stored: int, configured: int) -> None:
        super().__init__(
            f"the cluster was created with {stored} shards but this node is configured "
            f"with {configured}; shard count is fixed at creation"
        )
        self.stored = stored
        self.configured = configured


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    metrics_address: str
    started_at: str
    # A draining node stays registered (it still serves the API) but owns no shards.
    draining: bool = False
    # So does a node whose clock is out of bound (cluster/clock.py), until it is back.
    clock_skewed: bool = False

    @property
    def takes_shards(self) -> bool:
        """Whether rendezvous assigns this node shards."""
        return not (self.draining or self.clock_skewed)

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> NodeInfo:
        data = json.loads(raw)
        return cls(
            node_id=str(data["node_id"]),
            address=str(data["address"]),
            metrics_address=str(data.get("metrics_address", "")),
            started_at=str(data.get("started_at", "")),
            draining=bool(data.get("draining", False)),
            clock_skewed=bool(data.get("clock_skewed", False)),
        )


@dataclass(frozen=True)
class ShardClaim:
    shard: int
    node_id: str
    epoch: int


class EtcdTimings(Protocol):
    """Where the coordinator reports its etcd calls' latencies (the node's metrics)."""

    def called(self, name: str, seconds: float, *, failed: bool) -> None: ...


class EtcdCoordinator:
    """One node's session with etcd: its lease, its registration and its shard claims."""

    def __init__(
        self,
        config: EtcdConfig,
        node_id: str,
        clock: Clock,
        timings: EtcdTimings | None = None,
    ) -> None:
        self._config = config
        self._timings = timings
        self._node_id = node_id
        self._clock = clock
        self._client: Etcd3Client | None = None
        self._lease_id = 0
        # Added to a claim's create_revision to make its epoch (ensure_epoch_base).
        self._epoch_base = 0
        self._ttl_s = max(2, math.ceil(config.lease_ttl_s))
        self._last_renewal = -math.inf
        self._keepalive_task: asyncio.Task[None] | None = None
        self.lease_lost = asyncio.Event()
        # Set once the lease may have lapsed; only lift_fence() clears it, after the shard
        # manager gave back every shard it held, so nothing resumes under an old epoch.
        self._fenced = False
        # Called when a renewal lands while fenced (the shard manager wakes up on it).
        self.on_renewed_while_fenced: Callable[[], None] | None = None
        self._prefix = f"/{config.cluster}/"

    # ---- connection and lease -----------------------------------------------------------

    async def connect(self) -> None:
        config = self._config
        self._client = Etcd3Client(
            list(config.endpoints),
            rpc_max_attempts=2,
            watch_reconnect_backoff_seconds=WATCH_RECONNECT_MIN_S,
            watch_max_reconnect_backoff_seconds=reconnect_cap_s(self._ttl_s),
            ca_cert=_read(config.ca_cert) if config.ca_cert else None,
            cert_key=_read(config.cert_key) if config.cert_key else None,
            cert_chain=_read(config.cert_cert) if config.cert_cert else None,
        )
        # etcd3aio builds its channel from its manager's options and has no parameter for
        # the reconnect backoff; gRPC's default grows to 120 s, so after an etcd restart a
        # node could wait out its whole lease before it even tries to reconnect.
        self._client._manager.grpc_options.extend(channel_reconnect_options(self._ttl_s))
        await self._client.connect()
        if self._config.username:
            auth = self._client.auth
            assert auth is not None
            response = await self._call(
                "authenticate",
                lambda: auth.authenticate(self._config.username or "", self._config.password or ""),
            )
            self._client.set_token(response.token)

    async def start_lease(self) -> int:
        """Grant a fresh lease and keep it alive; returns the lease id."""
        lease = self._lease_service()
        granted_at = self._clock.monotonic()
        response = await self._call(
            "grant_lease", lambda: lease.grant(self._ttl_s, timeout=self._timeout())
        )
        self._lease_id = int(response.ID)
        self._last_renewal = granted_at
        self.lease_lost = asyncio.Event()
        self._fenced = False
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        self._keepalive_task = asyncio.create_task(
            self._keepalive_loop(self._lease_id), name="etcd-lease-keepalive"
        )
        log.info("etcd lease granted", extra={"lease_id": self._lease_id, "ttl_s": self._ttl_s})
        return self._lease_id

    @property
    def lease_id(self) -> int:
        return self._lease_id

    @property
    def ttl_s(self) -> int:
        return self._ttl_s

    def lease_deadline(self) -> float:
        """Monotonic time after which this node must stop dispatching (self-fencing)."""
        return self._last_renewal + self._ttl_s - self._config.self_fence_margin_s

    def lease_valid(self, now: float) -> bool:
        """Whether the node may dispatch: the lease is surely alive and no fence is up."""
        return not self._fenced and self.lease_alive(now)

    def lease_alive(self, now: float) -> bool:
        """Whether the lease is surely alive in etcd (renewed within TTL − margin)."""
        return not self.lease_lost.is_set() and now < self.lease_deadline()

    @property
    def fenced(self) -> bool:
        """The node fenced itself and has not yet given back and re-claimed its shards."""
        return self._fenced

    def lift_fence(self) -> None:
        """Called once every shard held before the fence was released: claims made from
        now on get new epochs, so no write prepared before the fence can land."""
        if self._fenced:
            self._fenced = False
            log.info("self-fence lifted; re-claiming shards", extra={"lease_id": self._lease_id})

    async def _keepalive_loop(self, lease_id: int) -> None:
        lease = self._lease_service()
        interval_s = self._ttl_s / 3
        while True:
            await asyncio.sleep(interval_s)
            sent_at = self._clock.monotonic()
            started = time.monotonic()
            try:
                ttl = await asyncio.wait_for(
                    self._keepalive_once(lease, lease_id), timeout=self._timeout()
                )
            except (TimeoutError, EtcdError, grpc.aio.AioRpcError) as exc:
                self._timed("keepalive", started, failed=True)
                log.warning(
                    "etcd keep-alive failed",
                    extra={"lease_id": lease_id, "error": describe_error(exc)},
                )
                if not self.lease_alive(self._clock.monotonic()):
                    self._fence(lease_id)
                # Retry soon: a renewal that lands before the deadline keeps every shard.
                interval_s = min(1.0, self._ttl_s / 6)
                continue
            self._timed("keepalive", started, failed=False)
            if ttl <= 0:
                log.error("etcd lease expired", extra={"lease_id": lease_id})
                self.lease_lost.set()
                return
            if sent_at >= self.lease_deadline():
                # The deadline passed unnoticed (the process was paused): fenced all the same.
                self._fence(lease_id)
            # Renewed at send time, not receive time: the server may have counted from then.
            self._last_renewal = sent_at
            interval_s = self._ttl_s / 3
            if self._fenced:
                log.info(
                    "etcd lease renewed while fenced; shards go back and are re-claimed",
                    extra={"lease_id": lease_id},
                )
                if self.on_renewed_while_fenced is not None:
                    self.on_renewed_while_fenced()

    def _fence(self, lease_id: int) -> None:
        if not self._fenced:
            self._fenced = True
            log.warning(
                "self-fenced: etcd lease not renewed in time; dispatch paused",
                extra={"lease_id": lease_id},
            )

    @staticmethod
    async def _keepalive_once(lease: Any, lease_id: int) -> int:
        stream = lease.keep_alive(lease_id)
        try:
            async for response in stream:
                return int(response.TTL)
            return 0
        finally:
            stream.cancel()

    # ---- cluster metadata and membership --------------------------------------------------

    async def ensure_shard_count(self, configured: int) -> int:
        """Store the shard count if this node creates the cluster; else check it matches."""
        stored = await self._fixed_once("ensure_shard_count", "config/shard_count", configured)
        if stored != configured:
            raise ShardCountMismatch(stored, configured)
        return stored

    async def ensure_epoch_base(self, highest_recorded: int) -> int:
        """Fix this etcd's epoch base at ``highest_recorded`` (the database's highest shard
        epoch) unless another node fixed it first; the base every later epoch adds to.

        Read before any claim, so every epoch of this etcd is above what the database held
        when the etcd was new, revisions restarting or not."""
        self._epoch_base = await self._fixed_once(
            "ensure_epoch_base", "config/epoch_base", highest_recorded
        )
        return self._epoch_base

    async def _fixed_once(self, name: str, path: str, value: int) -> int:
        """Put ``value`` at ``path`` if nothing is there; the value stored there either way."""
        kv = self._kv()
        key = self._key(path)
        response = await self._call(
            name,
            lambda: kv.txn(
                compare=[KVService.txn_compare_create_revision(key, 0)],
                success=[KVService.txn_op_put(key, str(value))],
                failure=[KVService.txn_op_get(key)],
                timeout=self._timeout(),
            ),
        )
        if response.succeeded:
            return value
        return int(response.responses[0].response_range.kvs[0].value)

    async def register_node(self, info: NodeInfo) -> None:
        kv = self._kv()
        key = self._key(f"nodes/{self._node_id}")
        await self._call(
            "register_node",
            lambda: kv.put(key, info.to_json(), lease=self._lease_id, timeout=self._timeout()),
        )

    async def live_nodes(self) -> tuple[dict[str, NodeInfo], int]:
        """Every registered node and the etcd revision of the read."""
        kv = self._kv()
        prefix = self._key("nodes/")
        response = await self._call(
            "live_nodes", lambda: kv.get(prefix, prefix_range_end(prefix), timeout=self._timeout())
        )
        nodes: dict[str, NodeInfo] = {}
        for item in response.kvs:
            try:
                info = NodeInfo.from_json(item.value)
            except (ValueError, KeyError) as exc:
                log.warning(
                    "ignoring malformed node key", extra={"key": item.key, "error": str(exc)}
                )
                continue
            nodes[info.node_id] = info
        return nodes, int(response.header.revision)

    def watch_nodes(self) -> AsyncIterator[dict[str, NodeInfo]]:
        """Yield the full membership now and after every change."""
        return self._follow("nodes/", self.live_nodes)

    async def _follow(
        self, suffix: str, read: Callable[[], Awaitable[tuple[T, int]]]
    ) -> AsyncIterator[T]:
        """Yield ``read()`` (a value and the etcd revision it was read at) now and after
        every change under ``suffix``.

        A compacted watch (``compact_revision > 0``) means events were lost: re-read the
        prefix rather than trusting the stream (docs/architecture.md#d12).
        """
        watch = self._client.watch if self._client is not None else None
        if watch is None:
            raise CoordinationError("etcd client is not connected")
        prefix = self._key(suffix)
        while True:
            value, revision = await read()
            yield value
            async for response in watch.watch(
                prefix, prefix_range_end(prefix), start_revision=revision + 1
            ):
                if response.compact_revision > 0:
                    log.warning("etcd watch compacted; re-reading", extra={"prefix": suffix})
                    break
                if response.events:
                    value, _ = await read()
                    yield value

    # ---- shard claims ---------------------------------------------------------------------

    async def claim_shard(self, shard: int) -> ShardClaim | None:
        """Claim ``shard`` for this node under its lease; None if another node holds it.

        If this node already holds it under its current lease (a retried claim whose
        answer was lost), the existing claim is returned with its original epoch.
        """
        kv = self._kv()
        key = self._key(f"shards/{shard}")
        # The claim also deletes the shard's ready mark: it has served its purpose.
        response = await self._call(
            "claim_shard",
            lambda: kv.txn(
                compare=[KVService.txn_compare_create_revision(key, 0)],
                success=[
                    KVService.txn_op_put(key, self._node_id, lease=self._lease_id),
                    KVService.txn_op_delete(self._key(f"handoff/{shard}")),
                ],
                failure=[KVService.txn_op_get(key)],
                timeout=self._timeout(),
            ),
        )
        if response.succeeded:
            return ShardClaim(shard, self._node_id, self._epoch(response.header.revision))
        existing = response.responses[0].response_range.kvs
        if (
            existing
            and existing[0].value.decode() == self._node_id
            and int(existing[0].lease) == self._lease_id
        ):
            return ShardClaim(shard, self._node_id, self._epoch(existing[0].create_revision))
        return None

    def _epoch(self, create_revision: int) -> int:
        return self._epoch_base + int(create_revision)

    async def release_shard(self, shard: int, epoch: int) -> bool:
        """Delete the claim if it is still the one made at ``epoch``."""
        kv = self._kv()
        key = self._key(f"shards/{shard}")
        response = await self._call(
            "release_shard",
            lambda: kv.txn(
                compare=[KVService.txn_compare_create_revision(key, epoch - self._epoch_base)],
                success=[KVService.txn_op_delete(key)],
                timeout=self._timeout(),
            ),
        )
        return bool(response.succeeded)

    async def shard_claims(self) -> dict[int, ShardClaim]:
        claims, _ = await self._shard_claims_at()
        return claims

    async def _shard_claims_at(self) -> tuple[dict[int, ShardClaim], int]:
        claims: dict[int, ShardClaim] = {}
        items, revision = await self._range("shards/")
        for item in items:
            shard = _shard_of_key(item.key)
            claims[shard] = ShardClaim(
                shard, item.value.decode(), self._epoch(item.create_revision)
            )
        return claims, revision

    def watch_claims(self) -> AsyncIterator[dict[int, ShardClaim]]:
        """Every shard claim now and after every change (an incoming owner claims the
        moment the old one deletes its claim)."""
        return self._follow("shards/", self._shard_claims_at)

    # ---- planned handoff ------------------------------------------------------------------

    async def mark_handoff_ready(self, shard: int) -> None:
        """Say this node is warm for ``shard`` (under our lease: gone if we die)."""
        kv = self._kv()
        key = self._key(f"handoff/{shard}")
        await self._call(
            "mark_handoff_ready",
            lambda: kv.put(key, self._node_id, lease=self._lease_id, timeout=self._timeout()),
        )

    async def clear_handoff_mark(self, shard: int) -> None:
        """Take back our ready mark for ``shard`` (the shard is no longer coming here)."""
        kv = self._kv()
        key = self._key(f"handoff/{shard}")
        await self._call(
            "clear_handoff_mark",
            lambda: kv.txn(
                compare=[KVService.txn_compare_value(key, self._node_id)],
                success=[KVService.txn_op_delete(key)],
                timeout=self._timeout(),
            ),
        )

    async def _handoff_marks_at(self) -> tuple[dict[int, str], int]:
        items, revision = await self._range("handoff/")
        return {_shard_of_key(i.key): i.value.decode() for i in items}, revision

    def watch_handoff_marks(self) -> AsyncIterator[dict[int, str]]:
        """Shard -> the node that is warm for it, now and after every change."""
        return self._follow("handoff/", self._handoff_marks_at)

    async def _range(self, suffix: str) -> tuple[list[Any], int]:
        kv = self._kv()
        prefix = self._key(suffix)
        response = await self._call(
            "range", lambda: kv.get(prefix, prefix_range_end(prefix), timeout=self._timeout())
        )
        return list(response.kvs), int(response.header.revision)

    # ---- shutdown -------------------------------------------------------------------------

    async def close(self, *, revoke: bool = True) -> None:
        """Stop renewing; with ``revoke`` delete the lease (and every key on it) at once."""
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive_task
            self._keepalive_task = None
        if revoke and self._client is not None and self._lease_id:
            lease = self._lease_service()
            with contextlib.suppress(CoordinationError):
                await self._call(
                    "revoke_lease", lambda: lease.revoke(self._lease_id, timeout=self._timeout())
                )
        if self._client is not None:
            await self._client.close()
            self._client = None

    # ---- plumbing -------------------------------------------------------------------------

    def _key(self, suffix: str) -> str:
        return self._prefix + suffix

    def _timeout(self) -> float:
        return self._config.call_timeout_s

    def _kv(self) -> Any:
        if self._client is None or self._client.kv is None:
            raise CoordinationError("etcd client is not connected")
        return self._client.kv

    def _lease_service(self) -> Any:
        if self._client is None or self._client.lease is None:
            raise CoordinationError("etcd client is not connected")
        return self._client.lease

    async def _call(self, name: str, make: Callable[[], Awaitable[T]]) -> T:
        """Run one etcd call, timed under ``name``, mapping every driver failure to
        CoordinationError."""
        started = time.monotonic()
        try:
            result = await make()
        except (EtcdError, grpc.aio.AioRpcError, TimeoutError) as exc:
            self._timed(name, started, failed=True)
            raise CoordinationError(f"etcd call failed: {describe_error(exc)}") from exc
        self._timed(name, started, failed=False)
        return result

    def _timed(self, name: str, started: float, *, failed: bool) -> None:
        if self._timings is not None:
            self._timings.called(name, time.monotonic() - started, failed=failed)


WATCH_RECONNECT_MIN_S = 0.25


def reconnect_cap_s(ttl_s: float) -> float:
    """The longest wait between reconnect attempts to etcd: a fraction of the lease TTL,
    so a node reconnects several times before a lease that etcd kept through a restart
    runs out."""
    return max(0.2, min(2.0, ttl_s / 5))


def channel_reconnect_options(ttl_s: float) -> list[tuple[str, int]]:
    """gRPC channel options that bound the etcd channel's reconnect backoff."""
    cap_ms = int(reconnect_cap_s(ttl_s) * 1000)
    return [
        ("grpc.initial_reconnect_backoff_ms", min(100, cap_ms)),
        ("grpc.min_reconnect_backoff_ms", min(100, cap_ms)),
        ("grpc.max_reconnect_backoff_ms", cap_ms),
    ]


def describe_error(exc: BaseException) -> str:
    """One line for a log field: gRPC errors print several lines on their own."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return " ".join(str(exc).split()) or type(exc).__name__


def _shard_of_key(key: bytes) -> int:
    return int(key.decode().rsplit("/", 1)[1])


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()
