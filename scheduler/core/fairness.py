"""Ready queues and the fairness selector: which expired task goes to which free worker slot.

Tasks whose timer expired wait here in *lanes*, one per (queue, type, priority class);
inside a lane each tenant has its own heap ordered by ``(due_at_wall, push order)``, so
a worker is only ever shown work it can run and a backlog of one type never blocks
another (no head-of-line blocking). :meth:`ReadyQueues.pop_for` looks only at the lanes
of the worker's (queue, type) pairs and decides in three layers:

1. **Class.** With ``strict_critical`` (the default) a critical task the worker can run
   goes first whenever one waits whose tenant is not held by its own limits. Otherwise
   the classes that have such a task share dispatches by start-time fair queuing (stride
   scheduling with a virtual time): each class has a pass value that grows by
   ``1 / class_weight`` per dispatch, the smallest pass wins, ties go to the higher class.
   A class never banks credit for time in which it could not be served: its start tag is
   ``max(pass, virtual time)``, the virtual time being the largest start tag dispatched.
   With ``strict_critical=False`` critical competes in this queuing with its own weight.
2. **Tenant.** Within the class, tenants share the same way by ``TenantLimits.weight``
   (each tenant has a pass per class; ties go to the tenant seen first). A tenant at its
   ``max_concurrent`` (tasks counted from :meth:`~ReadyQueues.task_started` until
   :meth:`~ReadyQueues.task_finished`, across all classes) or without a token in its rate
   bucket (``rate_limit_rps`` per second, burst ``max(1, rps)``, full when first seen)
   is skipped, never dropped: it is *parked* out of the lane until the blocking condition
   can have changed (a ``task_finished`` of that tenant, the time its next token is due,
   or :meth:`~ReadyQueues.limits_changed`), so blocked tenants cost nothing per pop.
   A tenant can also be *held* until a given time (:meth:`~ReadyQueues.hold`: the
   cluster-wide quota check refused its tasks, docs/operations.md#tenants-and-quotas).
3. **Task.** The chosen tenant's earliest task by ``due_at_wall`` among the worker's
   lanes of that class (FIFO within a tenant).

Capacity caps need the total number of worker slots, which the dispatcher sets with
:meth:`~ReadyQueues.set_capacity` (0, the initial value, means unknown: no caps). They
count tasks in flight (``task_started`` .. ``task_finished``) and apply *only while a
higher class waits* for this worker, i.e. while the worker's lanes hold a task of a higher
class, whether or not that task's tenant is currently held by its limits:

* while a critical task waits, standard plus bulk in flight may not exceed
  ``floor((1 - critical_reserve_fraction) * capacity)`` - the reserve is kept for critical
  work (a credit the selector leaves unused stays with the dispatcher, ready for it);
* while a task of a higher class waits, a class with a cap in ``class_in_flight_caps``
  may not exceed ``floor(cap * capacity)`` in flight.

While no higher class waits, a class may use every slot: reserved capacity is lent out,
so an idle cluster is fully usable. A worker that cannot run the waiting higher-class
task is not held back for it, since its slot could not serve that task anyway.

**Cluster-wide concurrency.** On a node of a cluster the tenant's in-flight count is an
estimate of the whole cluster's: :meth:`~ReadyQueues.observe_in_flight` sets it to what
the last dispatch round read from PostgreSQL, and this node's own starts and settlements
move it in between. Settlements through other nodes are not seen here, so with
``concurrency_probe_s`` set a tenant held by its concurrency lets one task through every
``concurrency_probe_s`` (a *probe*): the database's check decides on it and corrects the
estimate. Without it (the default) a tenant at its limit waits for a ``task_finished``.
A task whose worker's stream closed still runs, so :meth:`~ReadyQueues.task_left` frees
its class slot on this node but not its tenant's.

Costs: push, remove and the bookkeeping calls are O(log n); a pop is O(log n) per lane of
the worker (amortised over parking and lazy deletion), plus the lanes' parked tenants once
each. Nothing reads a clock: ``now`` is monotonic seconds from the caller. Popping does
not reserve concurrency; a dispatcher that pops a batch before committing intents should
call ``task_started`` right after each pop (and ``task_finished`` if the intent fails) to
keep per-tenant and per-class limits exact.
"""

from __future__ import annotations

import heapq
import itertools
import math
import uuid
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from chronoshard.scheduler.core.models import Priority
from chronoshard.scheduler.core.quotas import HeldBy
from chronoshard.scheduler.errors import InvalidArgument

__all__ = [
    "CLASSES",
    "DEFAULT_CLASS_IN_FLIGHT_CAPS",
    "DEFAULT_CLASS_WEIGHTS",
    "DEFAULT_CRITICAL_RESERVE_FRACTION",
    "UNLIMITED",
    "FairnessPolicy",
    "Priority",
    "ReadyQueues",
    "ReadyTask",
    "TenantLimits",
    "WorkerOffer",
]

CLASSES: tuple[Priority, ...] = (Priority.CRITICAL, Priority.STANDARD, Priority.BULK)
"""Priority classes, highest first; a class's index here is its rank."""
_RANK: dict[Priority, int] = {priority: rank for rank, priority in enumerate(CLASSES)}
_CRITICAL = 0

DEFAULT_CLASS_WEIGHTS: Mapping[Priority, float] = {
    Priority.CRITICAL: 8.0,
    Priority.STANDARD: 4.0,
    Priority.BULK: 1.0,
}
DEFAULT_CLASS_IN_FLIGHT_CAPS: Mapping[Priority, float] = {
    Priority.STANDARD: 0.9,
    Priority.BULK: 0.5,
}
DEFAULT_CRITICAL_RESERVE_FRACTION = 0.1

# Slot limits are floor(fraction * capacity); the epsilon keeps 0.9 * 10 = 9.000...02 or
# 8.999...98 from costing a slot.
_SLOT_EPS = 1e-9
# A bucket this close to a whole token counts as holding one, so that float error in the
# refill never parks a tenant for a few nanoseconds over and over.
_TOKEN_EPS = 1e-9
# A tenant heap is rebuilt once its removed entries outnumber the live ones and this floor:
# O(1) amortised per removal, and garbage stays bounded by the live tasks.
_SWEEP_FLOOR = 32


def _priority(value: str) -> Priority:
    try:
        return Priority(value)
    except ValueError as exc:
        raise InvalidArgument("priority", f"must be one of {', '.join(CLASSES)}") from exc


@dataclass(slots=True)
class ReadyTask:
    """A task whose timer expired, as the selector sees it.

    ``due_at_wall`` (UNIX seconds) orders a tenant's tasks; ``item`` is the dispatcher's
    own payload, carried untouched so this module depends on nothing else.
    """

    id: uuid.UUID
    tenant_id: uuid.UUID
    priority: Priority
    queue: str
    type: str
    due_at_wall: float
    item: object = None

    def __post_init__(self) -> None:
        # Rows hand over the column's text: normalise once so every lookup is by enum.
        self.priority = _priority(self.priority)


@dataclass(frozen=True, slots=True)
class WorkerOffer:
    """What a worker with a free slot can run: every pair of ``queues`` x ``types``.

    ``session_id`` is the caller's; the selector does not use it.
    """

    queues: frozenset[str]
    types: frozenset[str]
    session_id: Hashable = ""


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's limits; ``None`` means unlimited. ``max_concurrent=0`` holds all its work.

    Raises:
        InvalidArgument: a negative ``max_concurrent``, a non-positive or non-finite
            ``rate_limit_rps`` or ``weight``.
    """

    max_concurrent: int | None = None
    rate_limit_rps: float | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.max_concurrent is not None and (
            isinstance(self.max_concurrent, bool) or self.max_concurrent < 0
        ):
            raise InvalidArgument("max_concurrent", f"must be >= 0, got {self.max_concurrent!r}")
        if self.rate_limit_rps is not None and not (
            math.isfinite(self.rate_limit_rps) and self.rate_limit_rps > 0
        ):
            raise InvalidArgument(
                "rate_limit_rps", f"must be positive and finite, got {self.rate_limit_rps!r}"
            )
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise InvalidArgument("weight", f"must be positive and finite, got {self.weight!r}")


UNLIMITED = TenantLimits(None, None)


@dataclass(frozen=True, slots=True)
class FairnessPolicy:
    """How classes share workers; see the module docstring for the exact rules.

    Raises:
        InvalidArgument: a class weight missing, non-positive or non-finite; a cap for
            critical (nothing ranks above it) or outside [0, 1]; a reserve outside [0, 1).
    """

    class_weights: Mapping[Priority, float] = field(
        default_factory=lambda: dict(DEFAULT_CLASS_WEIGHTS)
    )
    class_in_flight_caps: Mapping[Priority, float] = field(
        default_factory=lambda: dict(DEFAULT_CLASS_IN_FLIGHT_CAPS)
    )
    critical_reserve_fraction: float = DEFAULT_CRITICAL_RESERVE_FRACTION
    strict_critical: bool = True

    def __post_init__(self) -> None:
        weights = {_priority(key): value for key, value in self.class_weights.items()}
        for priority in CLASSES:
            weight = weights.get(priority)
            if weight is None or not (math.isfinite(weight) and weight > 0):
                raise InvalidArgument(
                    "class_weights", f"{priority} needs a positive finite weight, got {weight!r}"
                )
        caps = {_priority(key): value for key, value in self.class_in_flight_caps.items()}
        for priority, cap in caps.items():
            if priority is Priority.CRITICAL:
                raise InvalidArgument("class_in_flight_caps", "critical has no higher class")
            if not 0.0 <= cap <= 1.0:
                raise InvalidArgument(
                    "class_in_flight_caps", f"{priority} must be in [0, 1], got {cap!r}"
                )
        if not 0.0 <= self.critical_reserve_fraction < 1.0:
            raise InvalidArgument(
                "critical_reserve_fraction",
                f"must be in [0, 1), got {self.critical_reserve_fraction!r}",
            )
        # Store the normalised copies: the caller's dicts may be mutated later.
        object.__setattr__(self, "class_weights", weights)
        object.__setattr__(self, "class_in_flight_caps", caps)


class _Entry:
    """A waiting task where it sits. Leaving (pop, remove, replace) clears ``live``; the
    heap slot is dropped when it surfaces or at the next sweep (lazy deletion)."""

    __slots__ = ("lane", "live", "task", "tenant")

    def __init__(self, task: ReadyTask, lane: _Lane, tenant: _Tenant) -> None:
        self.task = task
        self.lane = lane
        self.tenant = tenant
        self.live = True


# Heap items are (key, unique seq, object): the seq decides every tie, so the objects
# (compared by identity, hashed in C unlike UUIDs) are never compared.
_QueueItem = tuple[float, int, _Entry]
_OrderItem = tuple[float, int, "_Tenant"]


class _TenantQueue:
    """One tenant's tasks in one lane: a heap by (due_at_wall, push seq)."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[_QueueItem] = []
        self.live = 0


class _Lane:
    """The tasks of one (queue, type, class), by tenant.

    ``order`` is a heap of (pass, tiebreak, tenant) with one entry per tenant in
    ``listed``. A recorded pass may be stale (lower than the tenant's, which only grows),
    and a listed tenant may have no tasks left here: both are fixed when the entry
    reaches the top. Tenants held by their limits are taken out (parked)."""

    __slots__ = ("listed", "live", "order", "pair", "rank", "tenants")

    def __init__(self, pair: tuple[str, str], rank: int) -> None:
        self.pair = pair
        self.rank = rank
        self.tenants: dict[_Tenant, _TenantQueue] = {}
        self.order: list[_OrderItem] = []
        self.listed: set[_Tenant] = set()
        self.live = 0


class _Tenant:
    """Per-tenant selector state: fair-queuing passes, in-flight count, rate bucket, a
    hold, and the lanes it is parked out of."""

    __slots__ = (
        "held_by",
        "held_until",
        "id",
        "in_flight",
        "parked",
        "passes",
        "probe_at",
        "rate_wake",
        "refilled_at",
        "tiebreak",
        "tokens",
        "waiting",
    )

    def __init__(self, tenant_id: uuid.UUID, tiebreak: int) -> None:
        self.id = tenant_id
        self.tiebreak = tiebreak
        self.passes = [0.0] * len(CLASSES)
        self.in_flight = 0
        self.waiting = 0
        self.tokens = 0.0
        self.refilled_at: float | None = None  # None: bucket never used, so full
        self.parked: set[_Lane] = set()
        # When its parking lifts by time (a token due, a hold ending, a probe): the valid
        # entry in ReadyQueues._rate_wakes.
        self.rate_wake: float | None = None
        self.held_until = 0.0  # hold(): nothing of this tenant goes before then
        self.held_by = HeldBy.RATE
        self.probe_at = 0.0  # with concurrency probes: the next one may go then


class ReadyQueues:
    """The ready queues of one scheduler node and the selector over them.

    Not thread-safe: the dispatcher loop owns it. ``tenant_limits`` is called on the hot
    path and should be a cache lookup.
    """

    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset(
        {
            "tasks",
            "capacity",
            "garbage",
            "parked_tenants",
            *(f"waiting_{p}" for p in CLASSES),
            *(f"in_flight_{p}" for p in CLASSES),
        }
    )

    def __init__(
        self,
        *,
        policy: FairnessPolicy | None = None,
        tenant_limits: Callable[[uuid.UUID], TenantLimits] = lambda _tenant: UNLIMITED,
        capacity: int = 0,
        concurrency_probe_s: float | None = None,
    ) -> None:
        if concurrency_probe_s is not None and not concurrency_probe_s > 0:
            raise InvalidArgument(
                "concurrency_probe_s", f"must be positive, got {concurrency_probe_s!r}"
            )
        self._policy = policy if policy is not None else FairnessPolicy()
        self._limits = tenant_limits
        self._probe_s = concurrency_probe_s
        self._class_stride = [1.0 / self._policy.class_weights[p] for p in CLASSES]
        self._waiting: dict[uuid.UUID, _Entry] = {}
        self._heap_items = 0  # in all tenant heaps; minus len(_waiting) is garbage
        self._pairs: dict[tuple[str, str], list[_Lane | None]] = {}
        self._tenants: dict[uuid.UUID, _Tenant] = {}
        self._seq = itertools.count()
        self._class_pass = [0.0] * len(CLASSES)
        self._class_vtime = 0.0
        self._tenant_vtime = [0.0] * len(CLASSES)
        self._class_waiting = [0] * len(CLASSES)
        self._class_in_flight = [0] * len(CLASSES)
        self._rate_wakes: list[tuple[float, int, _Tenant]] = []
        # Times each tenant was held back, by what (the node's throttling metric).
        self._throttles: dict[tuple[uuid.UUID, HeldBy], int] = {}
        self._counters = dict.fromkeys(
            (
                "pushed",
                "replaced",
                "removed",
                "selected",
                *(f"selected_{p}" for p in CLASSES),
                "empty_pops",
                "throttled_by_rate",
                "throttled_by_concurrency",
                "held_by_quota",
                "concurrency_probes",
                "held_by_reserve",
                "held_by_class_cap",
                "started",
                "finished",
                "unmatched_finishes",
            ),
            0,
        )
        self._capacity = 0
        self._lower_limit = 0
        self._cap_slots: list[int | None] = [None] * len(CLASSES)
        self.set_capacity(capacity)

    # ------------------------------------------------------------------ queue contents

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._waiting

    def push(self, task: ReadyTask, now: float) -> None:
        """Add a task whose timer expired; a task id already waiting is replaced.

        ``now`` releases tenants whose rate-limit wake time has come."""
        self._release_rate_parked(now)
        if task.id in self._waiting:
            self._forget(self._waiting.pop(task.id))
            self._counters["replaced"] += 1
        rank = _RANK[task.priority]
        pair = (task.queue, task.type)
        slots = self._pairs.get(pair)
        if slots is None:
            slots = self._pairs[pair] = [None] * len(CLASSES)
        lane = slots[rank]
        if lane is None:
            lane = slots[rank] = _Lane(pair, rank)
        tenant = self._tenant(task.tenant_id)
        queue = lane.tenants.get(tenant)
        if queue is None:
            queue = lane.tenants[tenant] = _TenantQueue()
        entry = _Entry(task, lane, tenant)
        heapq.heappush(queue.heap, (task.due_at_wall, next(self._seq), entry))
        self._heap_items += 1
        queue.live += 1
        lane.live += 1
        tenant.waiting += 1
        self._class_waiting[rank] += 1
        self._waiting[task.id] = entry
        self._counters["pushed"] += 1
        # Listed even if parked here: the pop that meets it re-parks it if still held,
        # which is cheaper to reason about than a tenant whose new work nobody lists.
        if tenant not in lane.listed:
            self._list(lane, tenant)

    def remove(self, task_id: uuid.UUID) -> bool:
        """Forget a waiting task (cancelled, shard handed off); False if it was not waiting."""
        entry = self._waiting.pop(task_id, None)
        if entry is None:
            return False
        self._forget(entry)
        self._counters["removed"] += 1
        return True

    def remove_where(self, doomed: Callable[[ReadyTask], bool]) -> int:
        """Forget every waiting task ``doomed`` accepts (its shard was handed off); how
        many. O(waiting tasks)."""
        task_ids = [task_id for task_id, entry in self._waiting.items() if doomed(entry.task)]
        for task_id in task_ids:
            self.remove(task_id)
        return len(task_ids)

    def waiting_for(self, queues: frozenset[str], types: frozenset[str]) -> int:
        """How many tasks wait that a worker serving ``queues`` x ``types`` could run."""
        return sum(lane.live for slots in self._slots_for(queues, types) for lane in slots if lane)

    # ------------------------------------------------------------------ selection

    def pop_for(self, worker: WorkerOffer, now: float) -> ReadyTask | None:
        """Choose the task for one free slot of ``worker`` and take it out; None if no
        waiting task may go to it now (none it can run, or all held by limits/caps)."""
        self._release_rate_parked(now)
        lanes: list[list[_Lane]] = [[] for _ in CLASSES]
        for slots in self._slots_for(worker.queues, worker.types):
            for rank, lane in enumerate(slots):
                if lane is not None:
                    lanes[rank].append(lane)
        present = [bool(class_lanes) for class_lanes in lanes]
        chosen: tuple[int, _Tenant] | None = None
        if self._policy.strict_critical and present[_CRITICAL]:
            tenant = self._best_tenant(lanes[_CRITICAL], _CRITICAL, now)
            if tenant is not None:
                chosen = (_CRITICAL, tenant)
        if chosen is None:
            # Classes in fair-queuing order; the first with an unheld tenant wins, so the
            # tenant search usually runs in one class only.
            ranks = sorted(
                (
                    rank
                    for rank in range(len(CLASSES))
                    if present[rank]
                    and not (rank == _CRITICAL and self._policy.strict_critical)
                    and self._class_allowed(rank, present)
                ),
                key=lambda rank: (max(self._class_pass[rank], self._class_vtime), rank),
            )
            for rank in ranks:
                tenant = self._best_tenant(lanes[rank], rank, now)
                if tenant is not None:
                    chosen = (rank, tenant)
                    break
        if chosen is None:
            self._counters["empty_pops"] += 1
            return None
        rank, tenant = chosen
        task = self._take_earliest(lanes[rank], tenant)
        self._charge(rank, tenant, now)
        return task

    def next_eligible_at(self, now: float) -> float | None:
        """The earliest time after ``now`` at which a waiting task held back by its
        tenant's rate limit, a :meth:`hold` or until its next concurrency probe may go;
        None if no waiting task is known to be so held.

        Concurrency limits (without probes) and class caps are lifted by events
        (``task_finished``, ``set_capacity``), not by time, so they never show here."""
        self._release_rate_parked(now)
        wakes = self._rate_wakes
        while wakes:
            at, _, tenant = wakes[0]
            if tenant.rate_wake == at and tenant.waiting:
                return at
            heapq.heappop(wakes)
            if tenant.rate_wake == at:
                tenant.rate_wake = None  # no waiting work left: nothing to wake
        return None

    # ------------------------------------------------------------------ bookkeeping

    def task_started(self, task: ReadyTask) -> None:
        """The dispatcher committed the intent: the task counts against its tenant's
        ``max_concurrent`` and its class's in-flight count until ``task_finished``."""
        self._tenant(task.tenant_id).in_flight += 1
        self._class_in_flight[_RANK[task.priority]] += 1
        self._counters["started"] += 1

    def task_left(self, priority: Priority | str) -> None:
        """A started task's worker stream closed with the task unsettled: it leaves this
        node's class counts (its slots left the capacity with the stream) but still
        counts for its tenant, since the worker may still be running it."""
        rank = _RANK[_priority(priority)]
        self._counters["finished"] += 1
        if self._class_in_flight[rank]:
            self._class_in_flight[rank] -= 1
        else:
            self._counters["unmatched_finishes"] += 1

    def observe_in_flight(self, tenant_id: uuid.UUID, in_flight: int, now: float) -> None:
        """The cluster-wide in-flight count of the tenant, read by a dispatch round's
        quota check: it replaces this node's estimate, and the next concurrency probe is
        due ``concurrency_probe_s`` from ``now``."""
        tenant = self._tenant(tenant_id)
        tenant.in_flight = in_flight
        if self._probe_s is not None:
            tenant.probe_at = now + self._probe_s
        if tenant.parked:
            limit = self._limits(tenant_id).max_concurrent
            if limit is None or in_flight < limit:
                self._unpark(tenant)

    def hold(self, tenant_id: uuid.UUID, until: float, held_by: HeldBy = HeldBy.RATE) -> None:
        """Nothing of the tenant goes before ``until`` (monotonic seconds): the
        cluster-wide check refused its tasks, and said when to ask again."""
        tenant = self._tenant(tenant_id)
        if until > tenant.held_until:
            tenant.held_until = until
            tenant.held_by = held_by

    def throttles(self) -> dict[tuple[uuid.UUID, HeldBy], int]:
        """Times each tenant was held back, by what; they only grow. O(tenants held so
        far): for a metrics scrape."""
        return dict(self._throttles)

    def task_finished(self, tenant_id: uuid.UUID, priority: Priority | str) -> None:
        """A started task completed, failed or was released: free its slot in the counts.

        A finish with nothing to match (a task started before this node took the shard)
        is counted in ``unmatched_finishes`` and never drives a count below zero."""
        rank = _RANK[_priority(priority)]
        tenant = self._tenants.get(tenant_id)
        self._counters["finished"] += 1
        if tenant is None or tenant.in_flight == 0 or self._class_in_flight[rank] == 0:
            self._counters["unmatched_finishes"] += 1
        if self._class_in_flight[rank]:
            self._class_in_flight[rank] -= 1
        if tenant is None or not tenant.in_flight:
            return
        tenant.in_flight -= 1
        if tenant.parked:
            limit = self._limits(tenant_id).max_concurrent
            if limit is None or tenant.in_flight < limit:
                self._unpark(tenant)

    def limits_changed(self, tenant_id: uuid.UUID) -> None:
        """The tenant's limits may have been raised: look at its parked tasks again."""
        tenant = self._tenants.get(tenant_id)
        if tenant is not None:
            self._unpark(tenant)

    def set_capacity(self, total_slots: int) -> None:
        """Total worker slots the caps are fractions of; 0 disables every cap."""
        if isinstance(total_slots, bool) or total_slots < 0:
            raise InvalidArgument("total_slots", f"must be >= 0, got {total_slots!r}")
        self._capacity = total_slots
        reserve = self._policy.critical_reserve_fraction
        self._lower_limit = math.floor((1.0 - reserve) * total_slots + _SLOT_EPS)
        caps = self._policy.class_in_flight_caps
        self._cap_slots = [
            math.floor(caps[p] * total_slots + _SLOT_EPS) if p in caps else None for p in CLASSES
        ]

    def get_stats(self) -> dict[str, int]:
        """Totals that only grow, and the levels named in ``STATS_GAUGES`` (tasks
        waiting, per class waiting and in flight, capacity, parked tenants, garbage:
        removed entries not yet dropped). O(tenants): for a metrics scrape, not the hot
        path."""
        out = dict(self._counters)
        out["tasks"] = len(self._waiting)
        for rank, priority in enumerate(CLASSES):
            out[f"waiting_{priority}"] = self._class_waiting[rank]
            out[f"in_flight_{priority}"] = self._class_in_flight[rank]
        out["capacity"] = self._capacity
        out["garbage"] = self._heap_items - len(self._waiting)
        out["parked_tenants"] = sum(1 for tenant in self._tenants.values() if tenant.parked)
        return out

    def depths(self) -> dict[tuple[str, Priority, uuid.UUID], int]:
        """Tasks waiting per (queue, class, tenant), over all types; O(lanes × tenants),
        for a metrics scrape."""
        out: dict[tuple[str, Priority, uuid.UUID], int] = {}
        for (queue, _type), slots in self._pairs.items():
            for rank, lane in enumerate(slots):
                if lane is None or lane.live == 0:
                    continue
                priority = CLASSES[rank]
                for tenant, tenant_queue in lane.tenants.items():
                    if tenant_queue.live:
                        key = (queue, priority, tenant.id)
                        out[key] = out.get(key, 0) + tenant_queue.live
        return out

    # ------------------------------------------------------------------ internals

    def _tenant(self, tenant_id: uuid.UUID) -> _Tenant:
        # Kept for the node's lifetime (bounded by the tenant registry): dropping a
        # tenant's bucket while it refills would hand it a fresh burst.
        tenant = self._tenants.get(tenant_id)
        if tenant is None:
            tenant = self._tenants[tenant_id] = _Tenant(tenant_id, len(self._tenants))
        return tenant

    def _slots_for(
        self, queues: frozenset[str], types: frozenset[str]
    ) -> Iterator[list[_Lane | None]]:
        # Walk whichever is smaller: the worker's pairs or the pairs that hold tasks.
        if len(queues) * len(types) <= len(self._pairs):
            for queue in queues:
                for type_ in types:
                    slots = self._pairs.get((queue, type_))
                    if slots is not None:
                        yield slots
        else:
            for (queue, type_), slots in self._pairs.items():
                if queue in queues and type_ in types:
                    yield slots

    def _list(self, lane: _Lane, tenant: _Tenant) -> None:
        # A tenant coming back (new work, unparked) starts at the class's virtual time at
        # the earliest: waiting or being held earns no credit over those who were served.
        rank = lane.rank
        tenant.passes[rank] = max(tenant.passes[rank], self._tenant_vtime[rank])
        heapq.heappush(lane.order, (tenant.passes[rank], tenant.tiebreak, tenant))
        lane.listed.add(tenant)

    def _unpark(self, tenant: _Tenant) -> None:
        for lane in tenant.parked:
            # A lane that emptied since has no queue for the tenant; one that got new
            # work for it meanwhile listed it already.
            if tenant in lane.tenants and tenant not in lane.listed:
                self._list(lane, tenant)
        tenant.parked.clear()
        tenant.rate_wake = None

    def _release_rate_parked(self, now: float) -> None:
        wakes = self._rate_wakes
        while wakes and wakes[0][0] <= now:
            at, _, tenant = heapq.heappop(wakes)
            if tenant.rate_wake == at:
                self._unpark(tenant)

    def _class_allowed(self, rank: int, present: list[bool]) -> bool:
        if self._capacity == 0 or rank == _CRITICAL:
            return True
        lower_in_flight = sum(self._class_in_flight[_CRITICAL + 1 :])
        if present[_CRITICAL] and lower_in_flight >= self._lower_limit:
            self._counters["held_by_reserve"] += 1
            return False
        cap = self._cap_slots[rank]
        if cap is not None and any(present[:rank]) and self._class_in_flight[rank] >= cap:
            self._counters["held_by_class_cap"] += 1
            return False
        return True

    def _best_tenant(self, lanes: list[_Lane], rank: int, now: float) -> _Tenant | None:
        vtime = self._tenant_vtime[rank]
        best: _Tenant | None = None
        best_key: tuple[float, int] | None = None
        for lane in lanes:
            tenant = self._lane_top(lane, now)
            if tenant is None:
                continue
            key = (max(tenant.passes[rank], vtime), tenant.tiebreak)
            if best_key is None or key < best_key:
                best, best_key = tenant, key
        return best

    def _lane_top(self, lane: _Lane, now: float) -> _Tenant | None:
        """The lane's unheld tenant with the smallest pass, fixing entries on the way."""
        order = lane.order
        while order:
            recorded, tiebreak, tenant = order[0]
            if tenant not in lane.tenants:
                heapq.heappop(order)
                lane.listed.discard(tenant)
                continue
            current = tenant.passes[lane.rank]
            if recorded != current:
                # The pass only grows, so the true key is larger: re-sort and look again.
                heapq.heapreplace(order, (current, tiebreak, tenant))
                continue
            if self._held(tenant, now):
                heapq.heappop(order)
                lane.listed.discard(tenant)
                tenant.parked.add(lane)
                continue
            return tenant
        return None

    def _held(self, tenant: _Tenant, now: float) -> bool:
        """Whether the tenant's limits forbid a dispatch now; arms the wake for what
        lifts by time (a rate token, a hold's end, the next concurrency probe)."""
        if tenant.held_until > now:
            self._counters["held_by_quota"] += 1
            self._throttled(tenant, tenant.held_by)
            self._wake_at(tenant, tenant.held_until)
            return True
        limits = self._limits(tenant.id)
        if limits.max_concurrent is not None and tenant.in_flight >= limits.max_concurrent:
            if self._probe_s is None or now < tenant.probe_at:
                self._counters["throttled_by_concurrency"] += 1
                self._throttled(tenant, HeldBy.CONCURRENCY)
                if self._probe_s is not None:
                    self._wake_at(tenant, tenant.probe_at)
                return True
            # One task goes for the cluster-wide check to judge; the next not before
            # another probe interval, whatever that check answers.
            tenant.probe_at = now + self._probe_s
            self._counters["concurrency_probes"] += 1
        rps = limits.rate_limit_rps
        if rps is None:
            return False
        self._refill(tenant, rps, now)
        if tenant.tokens >= 1.0 - _TOKEN_EPS:
            return False
        self._counters["throttled_by_rate"] += 1
        self._throttled(tenant, HeldBy.RATE)
        self._wake_at(tenant, now + (1.0 - tenant.tokens) / rps)
        return True

    def _throttled(self, tenant: _Tenant, held_by: HeldBy) -> None:
        key = (tenant.id, held_by)
        self._throttles[key] = self._throttles.get(key, 0) + 1

    def _wake_at(self, tenant: _Tenant, wake: float) -> None:
        if tenant.rate_wake != wake:
            tenant.rate_wake = wake
            heapq.heappush(self._rate_wakes, (wake, next(self._seq), tenant))

    @staticmethod
    def _refill(tenant: _Tenant, rps: float, now: float) -> None:
        burst = max(1.0, rps)
        if tenant.refilled_at is None:
            tenant.tokens = burst
            tenant.refilled_at = now
        elif now > tenant.refilled_at:
            tenant.tokens = min(burst, tenant.tokens + (now - tenant.refilled_at) * rps)
            tenant.refilled_at = now
        # else: a `now` from the past adds nothing (and never moves refilled_at back).

    def _take_earliest(self, lanes: list[_Lane], tenant: _Tenant) -> ReadyTask:
        best: tuple[_QueueItem, _TenantQueue] | None = None
        for lane in lanes:
            queue = lane.tenants.get(tenant)
            if queue is None:
                continue
            head = self._head(queue)
            if best is None or head[:2] < best[0][:2]:
                best = (head, queue)
        assert best is not None, "a chosen tenant has a task in the worker's lanes"
        head, queue = best
        heapq.heappop(queue.heap)  # _head left the live head on top
        self._heap_items -= 1
        entry = head[2]
        del self._waiting[entry.task.id]
        self._forget(entry)
        return entry.task

    def _head(self, queue: _TenantQueue) -> _QueueItem:
        heap = queue.heap
        while not heap[0][2].live:
            heapq.heappop(heap)
            self._heap_items -= 1
        return heap[0]

    def _forget(self, entry: _Entry) -> None:
        """Account for an entry that left ``_waiting`` (popped, removed or replaced)."""
        entry.live = False
        lane, tenant = entry.lane, entry.tenant
        queue = lane.tenants[tenant]
        queue.live -= 1
        if queue.live == 0:
            del lane.tenants[tenant]  # its order entry goes when it surfaces
            self._heap_items -= len(queue.heap)
        elif len(queue.heap) - queue.live > max(queue.live, _SWEEP_FLOOR):
            self._heap_items -= len(queue.heap) - queue.live
            queue.heap = [item for item in queue.heap if item[2].live]
            heapq.heapify(queue.heap)
        lane.live -= 1
        if lane.live == 0:
            slots = self._pairs[lane.pair]
            slots[lane.rank] = None
            if not any(slots):
                del self._pairs[lane.pair]
        tenant.waiting -= 1
        self._class_waiting[lane.rank] -= 1

    def _charge(self, rank: int, tenant: _Tenant, now: float) -> None:
        """Advance the fair-queuing clocks and the tenant's bucket for one dispatch."""
        limits = self._limits(tenant.id)
        start = max(tenant.passes[rank], self._tenant_vtime[rank])
        self._tenant_vtime[rank] = start
        tenant.passes[rank] = start + 1.0 / limits.weight
        # Strict critical sits outside the class queuing: its dispatches must not move
        # the virtual time the other classes are measured against.
        if not (rank == _CRITICAL and self._policy.strict_critical):
            class_start = max(self._class_pass[rank], self._class_vtime)
            self._class_vtime = class_start
            self._class_pass[rank] = class_start + self._class_stride[rank]
        if limits.rate_limit_rps is not None:
            self._refill(tenant, limits.rate_limit_rps, now)
            tenant.tokens -= 1.0
        self._counters["selected"] += 1
        self._counters[f"selected_{CLASSES[rank]}"] += 1
