"""Shard ownership: which shards this node runs, claimed through etcd, fenced by epochs.

Every node watches the live membership (``/nodes/``) and computes the same target map
with rendezvous hashing (:mod:`.rendezvous`). A reconcile pass, on every membership
change and every second, releases the shards this node should no longer own and claims
the ones it should (DESIGN §5):

* **claim**: an etcd transaction ``create_revision == 0 → put(node_id, lease)``; the
  revision is the shard's epoch, written to ``shard_owners`` (only forward). The new
  owner reloads the shard's PRELOADED tasks into its wheel and wakes the preloader.
  A shard still held by its old owner (which has not released it yet, or whose lease has
  not expired yet) is simply retried on the next pass.
* **release**: the shard leaves :meth:`ShardManager.epochs` first (nothing more is
  dispatched for it), its wheel entries are dropped, its PRELOADED rows go back to
  SCHEDULED under the old epoch, and the etcd key is deleted under a compare on that
  epoch, so the next owner can claim it at once.

A write that finds another epoch in ``shard_owners`` reports the shard lost
(:meth:`ShardManager.epochs_lost`) and the node stops it without touching anything.
The node also fences itself: :meth:`ShardManager.dispatch_allowed` is false once the
etcd lease may have lapsed (last renewal + TTL − margin). It resumes only after
re-claiming its shards under new epochs: if the lease survived (a short etcd outage) it
gives every shard back and claims it again at once; if etcd says the lease is gone, every
shard is dropped and the node re-registers under a new lease first.

A node whose clock is out of bound (``cluster_clock.py``) goes the same way, except that
its peers take over: it stops dispatching at once, gives every shard back, publishes
itself as ``clock_skewed`` (every target map leaves it out, so its peers claim the
shards) and claims nothing until :meth:`ShardManager.set_clock_skewed` says it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING

from chronoshard.clock import Clock
from chronoshard.scheduler import rendezvous
from chronoshard.scheduler.coordination import CoordinationError, EtcdCoordinator, NodeInfo
from chronoshard.scheduler.dispatch_store import DispatchStore
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.store import Store

if TYPE_CHECKING:
    from chronoshard.scheduler.dispatcher import Dispatcher
    from chronoshard.scheduler.preloader import Preloader

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 1.0
CLAIM_CONCURRENCY = 16


class ShardManager:
    def __init__(
        self,
        node: NodeInfo,
        shard_count: int,
        clock: Clock,
        coordinator: EtcdCoordinator,
        store: Store,
        runs: DispatchStore,
    ) -> None:
        self._node = node
        self._shard_count = shard_count
        self._clock = clock
        self._coordinator = coordinator
        self._store = store
        self._runs = runs
        self._owned: dict[int, int] = {}
        # Claims (shard -> epoch) a fenced node still has to delete before it re-claims.
        self._to_give_back: dict[int, int] = {}
        self._members: dict[str, NodeInfo] = {}
        self._kick = asyncio.Event()
        self._dispatcher: Dispatcher | None = None
        self._preloader: Preloader | None = None
        self._stopping = False
        # Set by the node: tell a shard's owner elsewhere that a task became due.
        self.on_remote_due: Callable[[int, datetime], None] | None = None
        # Set by the node: register it in etcd with this clock_skewed flag.
        self.publish_clock_skewed: Callable[[bool], Awaitable[None]] | None = None
        self._clock_skewed = False
        self._published_skewed: bool | None = False
        coordinator.on_renewed_while_fenced = self._kick.set
        self.handoffs: list[tuple[str, int, int]] = []
        self.stats: dict[str, int] = {
            "claims": 0,
            "releases": 0,
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
            self.stats["epochs_lost"] += 1
            log.warning("shard epoch superseded; stopped", extra={"shard": shard, "epoch": epoch})
        if lost and self._dispatcher is not None:
            self._dispatcher.drop_shards(lost)
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
        watcher = asyncio.create_task(self._watch_members(), name="shards-watch-members")
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
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), RECONCILE_INTERVAL_S)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher

    async def _watch_members(self) -> None:
        while True:
            try:
                async for members in self._coordinator.watch_nodes():
                    self._members = dict(members)
                    self._kick.set()
            except (CoordinationError, Exception) as exc:  # the watch must never die
                log.warning("membership watch failed; restarting", extra={"error": str(exc)})
                await asyncio.sleep(RECONCILE_INTERVAL_S)

    async def reconcile(self) -> None:
        if self._stopping:
            return
        if not self._members:
            self._members, _ = await self._coordinator.live_nodes()
        target = rendezvous.shards_of(self.target_map(), self._node.node_id)
        for shard in sorted(set(self._owned) - target):
            await self._release(shard, reason="rebalance")
        missing = sorted(target - set(self._owned))
        if missing:
            limit = asyncio.Semaphore(CLAIM_CONCURRENCY)

            async def claim(shard: int) -> None:
                async with limit:
                    await self._claim(shard)

            await asyncio.gather(*(claim(s) for s in missing))

    async def _claim(self, shard: int) -> None:
        claim = await self._coordinator.claim_shard(shard)
        if claim is None:
            return  # still held by its previous owner: next pass
        if not await self._store.claim_shard_epoch(shard, claim.epoch, self._node.node_id):
            # A higher epoch is recorded: etcd revisions went backwards (a snapshot restored
            # without --bump-revision). Refuse the shard rather than write under it.
            log.error(
                "shard epoch would go backwards; not taking the shard",
                extra={"shard": shard, "epoch": claim.epoch},
            )
            await self._coordinator.release_shard(shard, claim.epoch)
            return
        timers = await self._runs.load_preloaded({shard: claim.epoch})
        self._owned[shard] = claim.epoch
        self.stats["claims"] += 1
        self.handoffs.append(("claimed", shard, claim.epoch))
        log.info(
            "shard claimed",
            extra={"shard": shard, "epoch": claim.epoch, "reloaded": len(timers)},
        )
        if self._dispatcher is not None:
            self._dispatcher.schedule(timers)
        if self._preloader is not None:
            self._preloader.wake()

    async def _release(self, shard: int, *, reason: str) -> None:
        epoch = self._owned.pop(shard, None)
        if epoch is None:
            return
        if self._dispatcher is not None:
            self._dispatcher.drop_shards([shard])
        try:
            await self._runs.unload_preloaded({shard: epoch})
        except StoreUnavailable as exc:
            # The next owner reloads PRELOADED rows anyway; only the wheel's hint is lost.
            log.warning("could not unload shard", extra={"shard": shard, "error": str(exc)})
        with contextlib.suppress(CoordinationError):
            await self._coordinator.release_shard(shard, epoch)
        self.stats["releases"] += 1
        self.handoffs.append(("released", shard, epoch))
        log.info("shard released", extra={"shard": shard, "epoch": epoch, "reason": reason})

    async def _give_back_all(self, *, reason: str) -> bool:
        """Release every shard (its wheel entries and preloads go with it); whether every
        claim held before is gone from etcd.

        After a self-fence (the lease outlived it) the fence is lifted only then, so that
        the claims that follow raise every epoch (a claim left behind would be handed
        back with its old epoch); until then this runs again on the next pass. A skewed
        clock gives the shards back the same way, for the peers to claim.
        """
        if self._owned and reason == "self-fenced":
            self.stats["fence_reclaims"] += 1
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
        self.stats["lease_losses"] += 1
        self._to_give_back.clear()
        lost = list(self._owned)
        self._owned.clear()
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

    async def release_all(self) -> None:
        """Drain or shutdown: give every shard back so peers take them at once, and claim
        none until :meth:`resume`."""
        self._stopping = True
        for shard in sorted(self._owned):
            await self._release(shard, reason="shutdown")
