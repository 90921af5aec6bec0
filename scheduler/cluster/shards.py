"""Shard ownership: which shards this node runs, claimed through etcd, fenced by epochs.

Every node watches the live membership (``/nodes/``) and computes the same target map
with rendezvous hashing (:mod:`chronoshard.scheduler.core.rendezvous`). A reconcile pass, on every
membership change, claim change, ready mark and every second, moves ownership towards the target
(docs/architecture.md#d5):

* **claim**: an etcd transaction ``create_revision == 0 → put(node_id, lease)``; the
  revision is the shard's epoch, written to ``shard_owners`` (only forward). The new
  owner puts what it read while warming up on its wheel, reloads the shard's other
  PRELOADED tasks nearest due first in chunks (the memory cap ``max_preloaded`` sends
  the rest back to SCHEDULED) and wakes the preloader.
* **planned handoff** (a node joined or drains; :mod:`chronoshard.scheduler.core.handoff`): a target
  shard still held by a live node is *warmed up* — once every live worker has a session here, its
  rows due soon are read without changing them, then a ready mark is written in etcd. The holder
  keeps dispatching until it sees the mark (or ``handoff.wait_s`` passed), then lets go; the claims
  watch wakes the successor, which claims at once.
* **release**: the shard leaves :meth:`ShardManager.epochs` first (nothing more is
  dispatched for it), its wheel entries are dropped, and — unless the successor is warm
  — its PRELOADED rows go back to SCHEDULED under the old epoch; then the etcd key is
  deleted under a compare on that epoch, so the next owner can claim it at once.

A write that finds another epoch in ``shard_owners`` reports the shard lost
(:meth:`ShardManager.epochs_lost`) and the node stops it without touching anything.
The node also fences itself: :meth:`ShardManager.dispatch_allowed` is false once the
etcd lease may have lapsed (last renewal + TTL − margin). It resumes only after
re-claiming its shards under new epochs: if the lease survived (a short etcd outage) it
gives every shard back and claims it again at once; if etcd says the lease is gone, every
shard is dropped and the node re-registers under a new lease first.

A node whose clock is out of bound (``cluster/clock.py``) goes the same way, except that
its peers take over: it stops dispatching at once, gives every shard back, publishes
itself as ``clock_skewed`` (every target map leaves it out, so its peers claim the
shards) and claims nothing until :meth:`ShardManager.set_clock_skewed` says it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

from chronoshard.clock import Clock
from chronoshard.events import wait_event
from chronoshard.scheduler.cluster.coordination import CoordinationError, EtcdCoordinator, NodeInfo
from chronoshard.scheduler.config import HandoffConfig
from chronoshard.scheduler.core import rendezvous
from chronoshard.scheduler.core.handoff import (
    Cursor,
    IncomingHandoffs,
    OutgoingHandoffs,
    next_cursor,
    workers_ready,
)
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.runs import RunStore

if TYPE_CHECKING:
    from chronoshard.scheduler.dispatch.dispatcher import Dispatcher
    from chronoshard.scheduler.dispatch.preloader import Preloader

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 1.0
CLAIM_CONCURRENCY = 16
# While warming up, how often to look again whether every worker has reached this node.
WORKERS_POLL_S = 0.1
# A draining node waits for its successors this much longer than handoff.wait_s (the
# pass that lets the last shards go cold) before it releases whatever is left.
HANDOFF_SLACK_S = 2.0

T = TypeVar("T")


class WorkerPresence(Protocol):
    """Which workers reach this node and which the cluster sees (the node wires it)."""

    def connected(self) -> set[str]:
        """Workers with a live session on this node."""
        ...

    async def seen_on(self, node_ids: Collection[str]) -> set[str]:
        """Workers with a live session on any of ``node_ids``."""
        ...


class ShardManager:
    # "in_cluster", the cluster's shard count, beside "owned": an alert on the sum of
    # owned over the nodes falling short needs the count it should reach.
    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset({"owned", "in_cluster"})

    def __init__(
        self,
        node: NodeInfo,
        shard_count: int,
        clock: Clock,
        coordinator: EtcdCoordinator,
        store: Store,
        runs: RunStore,
        *,
        handoff: HandoffConfig,
        max_preloaded: int,
        workers: WorkerPresence,
    ) -> None:
        self._node = node
        self._shard_count = shard_count
        self._clock = clock
        self._coordinator = coordinator
        self._store = store
        self._runs = runs
        self._handoff = handoff
        self._max_preloaded = max_preloaded
        self._workers = workers
        self._owned: dict[int, int] = {}
        self._releasing: set[int] = set()
        # Claimed shards whose reload of PRELOADED rows failed half-way: resumed next pass.
        self._to_reload: dict[int, Cursor | None] = {}
        # Claims (shard -> epoch) a fenced node still has to delete before it re-claims.
        self._to_give_back: dict[int, int] = {}
        self._members: dict[str, NodeInfo] = {}
        self._outgoing = OutgoingHandoffs(handoff.wait_s)
        self._incoming: IncomingHandoffs[TimerTask] = IncomingHandoffs()
        self._marks: dict[int, str] = {}
        self._warmer: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._ownership_changed = asyncio.Event()
        self._dispatcher: Dispatcher | None = None
        self._preloader: Preloader | None = None
        self._stopping = False
        # Set by the node: tell a shard's owner elsewhere that a task became due.
        self.on_remote_due: Callable[[int, datetime], None] | None = None
        # Set by the node: register it in etcd with this clock_skewed flag.
        self.publish_clock_skewed: Callable[[bool], Awaitable[None]] | None = None
        self._clock_skewed = False
        self._published_skewed: bool | None = False
        # Set by the node: the membership changed after the first read (tell workers).
        self.on_membership_changed: Callable[[], None] | None = None
        # Set by the node: shards were claimed (the reconciler looks at them at once).
        self.on_claimed: Callable[[], None] | None = None
        coordinator.on_renewed_while_fenced = self._kick.set
        self.handoffs: list[tuple[str, int, int]] = []
        self._stats: dict[str, int] = {
            "claims": 0,
            "releases": 0,
            "warm_handoffs": 0,
            "cold_handoffs": 0,
            "epochs_lost": 0,
            "lease_losses": 0,
            "fence_reclaims": 0,
        }

    def attach(self, dispatcher: Dispatcher, preloader: Preloader) -> None:
        self._dispatcher = dispatcher
        self._preloader = preloader

    # ---- ShardView ----------------------------------------------------------------------

    def epochs(self) -> Mapping[int, int]:
        return MappingProxyType(self._owned)

    def dispatch_allowed(self) -> bool:
        return (
            not self._stopping
            and not self._clock_skewed
            and self._coordinator.lease_valid(self._clock.monotonic())
        )

    def set_clock_skewed(self, skewed: bool) -> None:
        """The node's clock left its bound (True) or is back (False). Dispatch stops at
        once; the loop gives the shards away and publishes the flag."""
        self._clock_skewed = skewed
        self._kick.set()

    def epochs_lost(self, shards: Iterable[int]) -> None:
        lost = [s for s in shards if s in self._owned]
        for shard in lost:
            epoch = self._owned.pop(shard)
            self._to_reload.pop(shard, None)
            self._stats["epochs_lost"] += 1
            log.warning("shard epoch superseded; stopped", extra={"shard": shard, "epoch": epoch})
        if lost and self._dispatcher is not None:
            self._dispatcher.drop_shards(lost)
        if lost:
            self._ownership_changed.set()
        self._kick.set()

    def retry_due(self, shard: int, due_at: datetime) -> None:
        if shard in self._owned:
            if self._preloader is not None:
                self._preloader.wake_if_due_soon(due_at)
        elif self.on_remote_due is not None:
            self.on_remote_due(shard, due_at)

    def owns(self, shard: int) -> bool:
        return shard in self._owned

    @property
    def members(self) -> Mapping[str, NodeInfo]:
        return MappingProxyType(self._members)

    def target_map(self) -> dict[int, str]:
        """Shard -> the node that should own it: rendezvous over live, non-draining nodes."""
        candidates = [n for n, info in self._members.items() if info.takes_shards]
        return rendezvous.assign(candidates, self._shard_count)

    # ---- loops --------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow membership and keep ownership equal to the target; never returns."""
        watchers = [
            asyncio.create_task(self._watch_members(), name="shards-watch-members"),
            asyncio.create_task(
                self._follow("claims", self._coordinator.watch_claims, self._claims_changed),
                name="shards-watch-claims",
            ),
            asyncio.create_task(
                self._follow("handoff marks", self._coordinator.watch_handoff_marks, self._marked),
                name="shards-watch-handoff",
            ),
        ]
        try:
            while True:
                self._kick.clear()
                if self._coordinator.lease_lost.is_set():
                    await self._recover_lease()
                elif self._coordinator.fenced and self._coordinator.lease_alive(
                    self._clock.monotonic()
                ):
                    if await self._give_back_all(reason="self-fenced"):
                        self._coordinator.lift_fence()
                elif self._clock_skewed:
                    await self._give_back_all(reason="clock skewed")
                try:
                    # Skewed: published after the shards are given back, so the peers'
                    # first claims find them free; back: before claiming, so the peers
                    # give this node its shards.
                    await self._publish_clock_skewed()
                    if not self._coordinator.fenced and not self._clock_skewed:
                        await self.reconcile()
                except (CoordinationError, StoreUnavailable) as exc:
                    log.warning("shard reconcile failed; retrying", extra={"error": str(exc)})
                await wait_event(self._kick, self._next_pass_in())
        finally:
            for task in [*watchers, self._warmer]:
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    def _next_pass_in(self) -> float:
        """Seconds to the next pass: the regular interval, or sooner when a handoff's
        wait runs out before it."""
        deadline = self._outgoing.next_deadline()
        regular = RECONCILE_INTERVAL_S
        if deadline is None:
            return regular
        return max(0.0, min(regular, deadline - self._clock.monotonic()))

    async def _watch_members(self) -> None:
        while True:
            try:
                async for members in self._coordinator.watch_nodes():
                    before = self._members
                    changed = bool(before) and _views(members) != _views(before)
                    self._members = dict(members)
                    self._kick.set()
                    if changed:
                        log.info(
                            "cluster membership changed",
                            extra={
                                "joined": sorted(members.keys() - before.keys()),
                                "left": sorted(before.keys() - members.keys()),
                                "draining": sorted(n for n, i in members.items() if i.draining),
                            },
                        )
                        if self.on_membership_changed is not None:
                            self.on_membership_changed()
            except (CoordinationError, Exception) as exc:  # the watch must never die
                log.warning("membership watch failed; restarting", extra={"error": str(exc)})
                await asyncio.sleep(RECONCILE_INTERVAL_S)

    async def _follow(
        self,
        what: str,
        watch: Callable[[], AsyncIterator[T]],
        changed: Callable[[T], None],
    ) -> None:
        while True:
            try:
                async for value in watch():
                    changed(value)
            except (CoordinationError, Exception) as exc:  # the watch must never die
                log.warning(
                    "etcd watch failed; restarting", extra={"watch": what, "error": str(exc)}
                )
                await asyncio.sleep(RECONCILE_INTERVAL_S)

    def _claims_changed(self, claims: Mapping[int, object]) -> None:
        # A shard we are waiting for was let go: claim it now, not at the next pass.
        if any(shard not in claims for shard in self._incoming.waiting()):
            self._kick.set()

    def _marked(self, marks: dict[int, str]) -> None:
        self._marks = marks
        if any(self._outgoing.successor(s) == node for s, node in marks.items()):
            self._kick.set()

    async def reconcile(self) -> None:
        if self._stopping:
            return
        if not self._members:
            self._members, _ = await self._coordinator.live_nodes()
        for shard, cursor in sorted(self._to_reload.items()):
            await self._reload(shard, self._owned[shard], cursor, skip=set())
        targets = self.target_map()
        mine = rendezvous.shards_of(targets, self._node.node_id)
        now = self._clock.monotonic()
        self._outgoing.update({s: targets.get(s) for s in self._owned if s not in mine}, now)
        if len(self._outgoing):
            let_go = self._outgoing.decide(self._marks, now)
            for shard in let_go.warm:
                self._stats["warm_handoffs"] += 1
                await self._release(shard, reason="handoff", unload=False)
            for shard in let_go.cold:
                self._stats["cold_handoffs"] += 1
                await self._release(shard, reason="rebalance")
        missing = sorted(mine - set(self._owned))
        held: list[int] = []
        if missing:
            limit = asyncio.Semaphore(CLAIM_CONCURRENCY)

            async def claim(shard: int) -> None:
                async with limit:
                    if not await self._claim(shard):
                        held.append(shard)

            try:
                await asyncio.gather(*(claim(s) for s in missing))
            finally:
                if len(held) < len(missing) and self.on_claimed is not None:
                    self.on_claimed()
        for shard in self._incoming.update(held):
            with contextlib.suppress(CoordinationError):
                await self._coordinator.clear_handoff_mark(shard)
        if len(self._incoming) and (self._warmer is None or self._warmer.done()):
            self._warmer = asyncio.create_task(self._warm_up(), name="shards-warm-up")

    async def _claim(self, shard: int) -> bool:
        """Claim ``shard``; False if another node holds it (warm up for it meanwhile)."""
        claim = await self._coordinator.claim_shard(shard)
        if claim is None:
            return False
        if not await self._store.claim_shard_epoch(shard, claim.epoch, self._node.node_id):
            # A higher epoch is recorded: etcd revisions went backwards (a snapshot restored
            # without --bump-revision). Refuse the shard rather than write under it.
            log.error(
                "shard epoch would go backwards; not taking the shard",
                extra={"shard": shard, "epoch": claim.epoch},
            )
            await self._coordinator.release_shard(shard, claim.epoch)
            return True
        warm = self._incoming.take(shard)
        self._owned[shard] = claim.epoch
        self._ownership_changed.set()
        self._stats["claims"] += 1
        self.handoffs.append(("claimed", shard, claim.epoch))
        # What the warm-up read goes on the wheel first: the shard dispatches at once.
        if self._dispatcher is not None:
            self._dispatcher.schedule(warm.values())
        if self._preloader is not None:
            self._preloader.wake()
        reloaded = await self._reload(shard, claim.epoch, None, skip=set(warm))
        log.info(
            "shard claimed",
            extra={"shard": shard, "epoch": claim.epoch, "warm": len(warm), "reloaded": reloaded},
        )
        return True

    async def _reload(
        self, shard: int, epoch: int, cursor: Cursor | None, *, skip: Collection[object]
    ) -> int:
        """The claimed shard's PRELOADED rows onto the wheel, nearest due first, a chunk at
        a time (those in ``skip`` are there already); how many. Past the memory cap the
        rest goes back to SCHEDULED for the preloader to take when there is room."""
        chunk = self._handoff.load_chunk
        count = 0
        self._to_reload.pop(shard, None)
        while self._owned.get(shard) == epoch:
            try:
                if self._dispatcher is not None and self._dispatcher.pending() >= (
                    self._max_preloaded
                ):
                    moved = await self._runs.unload_preloaded({shard: epoch}, after=cursor)
                    log.warning(
                        "memory cap reached while reloading a shard; the rest waits as SCHEDULED",
                        extra={"shard": shard, "epoch": epoch, "unloaded": moved},
                    )
                    return count
                rows = await self._runs.load_preloaded({shard: epoch}, after=cursor, limit=chunk)
            except StoreUnavailable as exc:
                self._to_reload[shard] = cursor
                log.warning(
                    "reloading a claimed shard failed; resuming next pass",
                    extra={"shard": shard, "epoch": epoch, "error": str(exc)},
                )
                return count
            fresh = [r for r in rows if r.id not in skip]
            if self._dispatcher is not None and self._owned.get(shard) == epoch:
                self._dispatcher.schedule(fresh)
            count += len(fresh)
            cursor = next_cursor(rows, chunk)
            if cursor is None:
                break
        return count

    async def _release(self, shard: int, *, reason: str, unload: bool = True) -> None:
        epoch = self._owned.pop(shard, None)
        if epoch is None:
            return
        self._to_reload.pop(shard, None)
        # Until the claim is deleted the shard is neither ours nor claimable: a drain
        # waits for that too (hand_off_all).
        self._releasing.add(shard)
        try:
            if self._dispatcher is not None:
                self._dispatcher.drop_shards([shard])
            if unload:
                try:
                    await self._runs.unload_preloaded({shard: epoch})
                except StoreUnavailable as exc:
                    # The next owner reloads PRELOADED rows anyway: only the hint is lost.
                    log.warning("could not unload shard", extra={"shard": shard, "error": str(exc)})
            with contextlib.suppress(CoordinationError):
                await self._coordinator.release_shard(shard, epoch)
        finally:
            self._releasing.discard(shard)
            self._ownership_changed.set()
        self._stats["releases"] += 1
        self.handoffs.append(("released", shard, epoch))
        log.info("shard released", extra={"shard": shard, "epoch": epoch, "reason": reason})

    # ---- warm-up (the incoming side of a planned handoff) ---------------------------------

    async def _warm_up(self) -> None:
        """Warm every shard coming here, then mark it ready; ends when none is left."""
        while self._incoming.to_load() or self._incoming.to_mark():
            try:
                if not await self._workers_here():
                    await asyncio.sleep(WORKERS_POLL_S)
                    continue
                await self._warm_once()
            except (CoordinationError, StoreUnavailable) as exc:
                log.warning("shard warm-up failed; retrying", extra={"error": str(exc)})
                await asyncio.sleep(RECONCILE_INTERVAL_S)

    async def _workers_here(self) -> bool:
        """Every worker that has a session on another live node has one here too."""
        others = [n for n in self._members if n != self._node.node_id]
        expected = await self._workers.seen_on(others)
        return workers_ready(expected, self._workers.connected())

    async def _warm_once(self) -> None:
        chunk = self._handoff.load_chunk
        horizon = self._clock.now() + timedelta(seconds=self._handoff.horizon_s)
        for shard in self._incoming.to_load():
            rows = await self._runs.read_warm(shard, horizon, self._incoming.cursor(shard), chunk)
            self._incoming.stage(shard, rows, chunk)
        for shard in self._incoming.to_mark():
            await self._coordinator.mark_handoff_ready(shard)
            self._incoming.marked(shard)
            if shard not in self._incoming:  # claimed or dropped while we wrote the mark
                await self._coordinator.clear_handoff_mark(shard)
                continue
            log.info(
                "shard warm; ready to take it over",
                extra={"shard": shard, "staged": self._incoming.staged_count(shard)},
            )

    # ---- fencing and lease loss -----------------------------------------------------------

    async def _give_back_all(self, *, reason: str) -> bool:
        """Release every shard (its wheel entries and preloads go with it); whether every
        claim held before is gone from etcd.

        After a self-fence (the lease outlived it) the fence is lifted only then, so that
        the claims that follow raise every epoch (a claim left behind would be handed
        back with its old epoch); until then this runs again on the next pass. A skewed
        clock gives the shards back the same way, for the peers to claim.
        """
        if self._owned and reason == "self-fenced":
            self._stats["fence_reclaims"] += 1
        for shard in sorted(self._owned):
            self._to_give_back[shard] = self._owned[shard]
            await self._release(shard, reason=reason)
        for shard, epoch in sorted(self._to_give_back.items()):
            try:
                # Idempotent: False means the claim at that epoch is gone already.
                await self._coordinator.release_shard(shard, epoch)
            except CoordinationError as exc:
                log.warning(
                    "cannot give a shard back yet", extra={"shard": shard, "error": str(exc)}
                )
                continue
            del self._to_give_back[shard]
        return not self._to_give_back

    async def _publish_clock_skewed(self) -> None:
        """Tell the peers (through the node's etcd registration) whether to leave this
        node out of their target maps; retried on the next pass if etcd refuses."""
        wanted = self._clock_skewed
        if self._published_skewed == wanted or self.publish_clock_skewed is None:
            return
        await self.publish_clock_skewed(wanted)
        self._published_skewed = wanted

    async def _recover_lease(self) -> None:
        """etcd dropped our lease: every claim went with it. Start over under a new one."""
        self._stats["lease_losses"] += 1
        self._to_give_back.clear()
        self._to_reload.clear()
        self._incoming.clear()  # our ready marks went with the lease
        lost = list(self._owned)
        self._owned.clear()
        self._ownership_changed.set()
        if lost and self._dispatcher is not None:
            self._dispatcher.drop_shards(lost)
        log.error("etcd lease lost; dropped all shards", extra={"shards": len(lost)})
        while True:
            try:
                await self._coordinator.start_lease()
                await self._coordinator.register_node(self._node)
                # The registration above is the one made at start: publish the flag again.
                self._published_skewed = None
                return
            except CoordinationError as exc:
                log.warning("cannot renew etcd lease yet", extra={"error": str(exc)})
                await asyncio.sleep(RECONCILE_INTERVAL_S)

    def set_node_info(self, info: NodeInfo) -> None:
        """The node's registration changed (drained, undrained): re-register with this
        one if the lease is ever lost."""
        self._node = info

    def resume(self) -> None:
        """Undrained: claim shards again from the next pass on."""
        self._stopping = False
        self._kick.set()

    # ---- drain and stop -------------------------------------------------------------------

    async def hand_off_all(self) -> None:
        """Draining (the node is registered as such, so no target map names it): wait
        until the successors have taken every shard over — each warm, or cold once
        ``handoff.wait_s`` ran out — then release whatever is left and claim nothing more.
        """
        deadline = self._clock.monotonic() + self._handoff.wait_s + HANDOFF_SLACK_S
        self._kick.set()
        while (self._owned or self._releasing) and (left := deadline - self._clock.monotonic()) > 0:
            self._ownership_changed.clear()
            await wait_event(self._ownership_changed, left)
        await self.release_all()

    async def release_all(self) -> None:
        """Drain or shutdown: give every shard back so peers take them at once, and claim
        none until :meth:`resume`."""
        self._stopping = True
        for shard in self._incoming.clear():
            with contextlib.suppress(CoordinationError):
                await self._coordinator.clear_handoff_mark(shard)
        for shard in sorted(self._owned):
            await self._release(shard, reason="shutdown")

    def get_stats(self) -> dict[str, int]:
        return {**self._stats, "owned": len(self._owned), "in_cluster": self._shard_count}


def _views(members: Mapping[str, NodeInfo]) -> set[tuple[str, str, bool]]:
    """What workers learn from the topology: who, where, draining or not."""
    return {(n.node_id, n.address, n.draining) for n in members.values()}
