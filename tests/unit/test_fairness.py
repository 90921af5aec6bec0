"""The fairness selector: right worker, right order, shares by weight, limits held.

Example tests pin each documented rule; property tests check long-run shares in
deterministic simulations and the rate limit over fake time; a stateful test runs random
push/remove/pop/start/finish/advance sequences against a plain model of what may and
may not happen, and drains everything at the end (nothing lost, nothing twice).
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chronoshard.scheduler.core.fairness import (
    CLASSES,
    UNLIMITED,
    FairnessPolicy,
    Priority,
    ReadyQueues,
    ReadyTask,
    TenantLimits,
    WorkerOffer,
)
from chronoshard.scheduler.errors import InvalidArgument

CRITICAL, STANDARD, BULK = Priority.CRITICAL, Priority.STANDARD, Priority.BULK
TENANTS = [uuid.UUID(int=0xA000 + i) for i in range(16)]
A, B, C = TENANTS[:3]
WORKER = WorkerOffer(frozenset({"q"}), frozenset({"t"}), "w1")


class Ids:
    """Fresh task ids, predictable in failure output."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> uuid.UUID:
        self.n += 1
        return uuid.UUID(int=self.n)


def make(
    ids: Ids,
    tenant: uuid.UUID = A,
    priority: Priority = STANDARD,
    *,
    queue: str = "q",
    type_: str = "t",
    due: float = 0.0,
) -> ReadyTask:
    return ReadyTask(ids(), tenant, priority, queue, type_, due, item=("payload", tenant))


def limits_of(table: dict[uuid.UUID, TenantLimits]) -> Callable[[uuid.UUID], TenantLimits]:
    return lambda tenant: table.get(tenant, UNLIMITED)


def drain(ready: ReadyQueues, worker: WorkerOffer = WORKER, now: float = 0.0) -> list[ReadyTask]:
    out = []
    while (task := ready.pop_for(worker, now)) is not None:
        out.append(task)
    return out


# ---------------------------------------------------------------------- order and routing


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5), st.sampled_from("ab")), max_size=40)
)
def test_fifo_by_due_time_within_a_tenant_across_the_workers_lanes(
    specs: list[tuple[int, int, str]],
) -> None:
    ids, ready = Ids(), ReadyQueues()
    pushed = []
    for index, (tenant_index, due, type_) in enumerate(specs):
        task = make(ids, TENANTS[tenant_index], type_=type_, due=float(due))
        pushed.append((task, index))
        ready.push(task, 0.0)
    both = WorkerOffer(frozenset({"q"}), frozenset({"a", "b"}))
    popped = drain(ready, both)
    assert len(popped) == len(specs)
    for tenant in TENANTS[:2]:
        mine = [(t.due_at_wall, i, t.id) for t, i in pushed if t.tenant_id == tenant]
        assert [t.id for t in popped if t.tenant_id == tenant] == [e[2] for e in sorted(mine)]


def test_a_worker_gets_only_its_pairs_and_no_head_of_line_blocking() -> None:
    ids, ready = Ids(), ReadyQueues()
    early_other = make(ids, type_="other", due=1.0)
    mine = make(ids, type_="t", due=50.0)
    other_queue = make(ids, queue="elsewhere", type_="t", due=0.0)
    for task in (early_other, mine, other_queue):
        ready.push(task, 0.0)
    assert ready.pop_for(WORKER, 0.0) is mine  # the earlier "other" task does not block it
    assert ready.pop_for(WORKER, 0.0) is None
    assert ready.waiting_for(frozenset({"q"}), frozenset({"t"})) == 0
    assert ready.waiting_for(frozenset({"q", "elsewhere"}), frozenset({"t", "other"})) == 2
    assert ready.waiting_for(frozenset({"q"}), frozenset({"other", "t", "x", "y", "z"})) == 1
    assert ready.pop_for(WorkerOffer(frozenset(), frozenset({"t"})), 0.0) is None
    assert len(ready) == 2


def test_remove_wins_and_reports_whether_the_task_was_waiting() -> None:
    ids, ready = Ids(), ReadyQueues()
    first, second = make(ids), make(ids)
    ready.push(first, 0.0)
    ready.push(second, 0.0)
    assert ready.remove(first.id) is True
    assert ready.remove(first.id) is False
    assert first.id not in ready
    assert ready.pop_for(WORKER, 0.0) is second
    assert ready.remove(second.id) is False  # already handed out
    assert ready.remove(uuid.uuid4()) is False
    assert len(ready) == 0
    stats = ready.get_stats()
    assert (stats["pushed"], stats["removed"], stats["selected"]) == (2, 1, 1)


def test_remove_where_forgets_exactly_the_tasks_it_accepts() -> None:
    ids, ready = Ids(), ReadyQueues()
    tasks = [make(ids, TENANTS[i % 3]) for i in range(9)]
    for task in tasks:
        ready.push(task, 0.0)
    assert ready.remove_where(lambda task: task.tenant_id == B) == 3
    assert ready.remove_where(lambda task: task.tenant_id == B) == 0
    assert {task.id for task in tasks if task.id in ready} == {
        task.id for task in tasks if task.tenant_id != B
    }
    left = [ready.pop_for(WORKER, 0.0) for _ in range(7)]
    assert left[-1] is None
    assert {task.tenant_id for task in left if task is not None} == {A, C}
    assert ready.get_stats()["removed"] == 3


def test_a_repush_replaces_the_waiting_task() -> None:
    ids, ready = Ids(), ReadyQueues()
    old = make(ids, A, BULK, due=5.0)
    ready.push(old, 0.0)
    new = ReadyTask(old.id, A, CRITICAL, "q", "t", 1.0, item="retry")
    ready.push(new, 0.0)
    assert len(ready) == 1
    assert ready.get_stats()["waiting_bulk"] == 0
    assert ready.pop_for(WORKER, 0.0) is new
    assert ready.pop_for(WORKER, 0.0) is None
    assert ready.get_stats()["replaced"] == 1


def test_a_repush_with_a_later_due_time_moves_the_task_back_in_its_tenants_fifo() -> None:
    ids, ready = Ids(), ReadyQueues()
    first, second = make(ids, due=1.0), make(ids, due=2.0)
    ready.push(first, 0.0)
    ready.push(second, 0.0)
    moved = ReadyTask(first.id, A, STANDARD, "q", "t", 3.0)
    ready.push(moved, 0.0)
    assert drain(ready) == [second, moved]


def test_many_removals_leave_no_garbage_behind_a_live_task() -> None:
    ids, ready = Ids(), ReadyQueues()
    keep = make(ids, due=1e9)
    ready.push(keep, 0.0)
    for due in range(500):
        task = make(ids, due=float(due))
        ready.push(task, 0.0)
        ready.remove(task.id)
        assert ready.get_stats()["garbage"] <= 33  # swept once dead > max(live, 32)
    assert ready.pop_for(WORKER, 0.0) is keep
    assert len(ready) == 0
    assert ready.get_stats()["garbage"] == 0


def test_priority_text_from_a_row_is_normalised_and_junk_rejected() -> None:
    task = ReadyTask(uuid.uuid4(), A, "bulk", "q", "t", 0.0)  # type: ignore[arg-type]
    assert task.priority is BULK
    with pytest.raises(InvalidArgument) as info:
        ReadyTask(uuid.uuid4(), A, "urgent", "q", "t", 0.0)  # type: ignore[arg-type]
    assert info.value.field == "priority"


# ---------------------------------------------------------------------- classes


def test_an_eligible_critical_task_goes_first_even_behind_older_work() -> None:
    ids, ready = Ids(), ReadyQueues()
    for _ in range(3):
        ready.push(make(ids, A, BULK, due=0.0), 0.0)
        ready.push(make(ids, B, STANDARD, due=0.0), 0.0)
    urgent = make(ids, C, CRITICAL, due=100.0)
    ready.push(urgent, 1.0)
    assert ready.pop_for(WORKER, 1.0) is urgent


def test_a_critical_task_this_worker_cannot_run_does_not_hold_it() -> None:
    ids, ready = Ids(), ReadyQueues(capacity=10)
    ready.push(make(ids, C, CRITICAL, type_="gpu"), 0.0)
    for _ in range(12):
        ready.push(make(ids, A, STANDARD), 0.0)
    for _ in range(10):  # the reserve only binds a worker that could serve critical work
        task = ready.pop_for(WORKER, 0.0)
        assert task is not None and task.priority is STANDARD
        ready.task_started(task)


def _backlogged_shares(
    ready: ReadyQueues,
    seeds: list[ReadyTask],
    pops: int,
    key: Callable[[ReadyTask], object],
    worker: WorkerOffer = WORKER,
) -> Counter[object]:
    """Pop `pops` times, replacing each popped task so every seed's backlog never ends."""
    ids = Ids()
    ids.n = 10**9
    for seed in seeds:
        ready.push(seed, 0.0)
    counts: Counter[object] = Counter()
    for _ in range(pops):
        task = ready.pop_for(worker, 0.0)
        assert task is not None
        counts[key(task)] += 1
        ready.push(ReadyTask(ids(), task.tenant_id, task.priority, task.queue, task.type, 0.0), 0.0)
    return counts


def _within_10_percent(counts: Counter[object], weights: dict[object, float]) -> None:
    total, weight_sum = sum(counts.values()), sum(weights.values())
    for name, weight in weights.items():
        expected = total * weight / weight_sum
        assert abs(counts[name] - expected) <= 0.1 * expected, (name, counts, weights)


@settings(max_examples=40, deadline=None)
@given(
    weights=st.tuples(st.integers(1, 10), st.integers(1, 10), st.integers(1, 10)),
    tenants_per_class=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
)
def test_backlogged_classes_share_dispatches_by_class_weight(
    weights: tuple[int, int, int], tenants_per_class: tuple[int, int, int]
) -> None:
    policy = FairnessPolicy(
        class_weights=dict(zip(CLASSES, map(float, weights), strict=True)),
        strict_critical=False,
    )
    ids = Ids()
    seeds = [
        make(ids, TENANTS[i], priority)
        for priority, count in zip(CLASSES, tenants_per_class, strict=True)
        for i in range(count)
    ]
    counts = _backlogged_shares(
        ReadyQueues(policy=policy), seeds, 40 * sum(weights), lambda t: t.priority
    )
    _within_10_percent(counts, dict(zip(CLASSES, map(float, weights), strict=True)))


def test_default_policy_shares_standard_and_bulk_four_to_one() -> None:
    ids = Ids()
    seeds = [make(ids, A, STANDARD), make(ids, B, BULK), make(ids, C, BULK)]
    counts = _backlogged_shares(ReadyQueues(), seeds, 500, lambda t: t.priority)
    assert counts == {STANDARD: 400, BULK: 100}


@settings(max_examples=40, deadline=None)
@given(
    types=st.lists(st.sampled_from(["a", "b", "c"]), min_size=2, max_size=8),
    priority=st.sampled_from(CLASSES),
)
def test_equal_weight_tenants_share_a_class_equally_across_lanes(
    types: list[str], priority: Priority
) -> None:
    ids = Ids()
    seeds = [make(ids, TENANTS[i], priority, type_=t) for i, t in enumerate(types)]
    worker = WorkerOffer(frozenset({"q"}), frozenset({"a", "b", "c"}))
    counts = _backlogged_shares(
        ReadyQueues(), seeds, 40 * len(types), lambda t: t.tenant_id, worker
    )
    _within_10_percent(counts, {TENANTS[i]: 1.0 for i in range(len(types))})


def test_tenant_weights_set_their_share_within_a_class() -> None:
    table = {A: TenantLimits(None, None, 1.0), B: TenantLimits(None, None, 2.0)}
    table[C] = TenantLimits(None, None, 3.0)
    ids = Ids()
    ready = ReadyQueues(tenant_limits=limits_of(table))
    counts = _backlogged_shares(
        ready, [make(ids, t) for t in (A, B, C)], 600, lambda t: t.tenant_id
    )
    assert counts == {A: 100, B: 200, C: 300}


def test_a_tenant_returning_from_idle_banks_no_credit() -> None:
    ids, ready = Ids(), ReadyQueues()
    for _ in range(200):
        ready.push(make(ids, A), 0.0)
    assert {t.tenant_id for t in (ready.pop_for(WORKER, 0.0) for _ in range(100)) if t} == {A}
    for _ in range(50):
        ready.push(make(ids, B), 1.0)
    next_twenty = Counter(t.tenant_id for t in (ready.pop_for(WORKER, 1.0) for _ in range(20)) if t)
    assert next_twenty == {A: 10, B: 10}


def test_a_class_returning_from_idle_banks_no_credit() -> None:
    ids, ready = Ids(), ReadyQueues()
    for _ in range(200):
        ready.push(make(ids, A, BULK), 0.0)
    for _ in range(100):
        ready.pop_for(WORKER, 0.0)
    for _ in range(100):
        ready.push(make(ids, B, STANDARD), 1.0)
    next_fifty = Counter(t.priority for t in (ready.pop_for(WORKER, 1.0) for _ in range(50)) if t)
    # Without the virtual-time clamp standard would take all 50 (its pass starts at 0).
    assert abs(next_fifty[STANDARD] - 40) <= 1 and next_fifty.total() == 50


def test_returning_classes_start_level_at_the_virtual_time_and_tie_to_the_higher() -> None:
    equal = {CRITICAL: 1.0, STANDARD: 1.0, BULK: 1.0}
    ids = Ids()
    ready = ReadyQueues(policy=FairnessPolicy(class_weights=equal, strict_critical=False))
    lower = [make(ids, A, p) for p in (STANDARD, BULK, STANDARD, BULK)]
    for task in lower:
        ready.push(task, 0.0)
    assert [ready.pop_for(WORKER, 0.0) for _ in range(3)] == lower[:3]  # bulk now behind
    assert ready.remove(lower[3].id)
    for _ in range(10):
        ready.push(make(ids, B, CRITICAL), 0.0)
    assert len(drain(ready)) == 10  # moves the virtual time far past both
    back = [make(ids, A, BULK), make(ids, A, STANDARD)]
    for task in back:
        ready.push(task, 0.0)
    assert ready.pop_for(WORKER, 0.0) is back[1]  # bulk's older, lower pass counts for nothing


def test_returning_tenants_start_level_at_the_virtual_time_and_tie_to_the_first_seen() -> None:
    ids, ready = Ids(), ReadyQueues()
    early = [make(ids, t) for t in (A, B, A, B)]
    for task in early:
        ready.push(task, 0.0)
    assert [ready.pop_for(WORKER, 0.0) for _ in range(3)] == early[:3]  # B now behind A
    assert ready.remove(early[3].id)
    for _ in range(10):
        ready.push(make(ids, C), 0.0)
    assert len(drain(ready)) == 10
    back = [make(ids, B), make(ids, A)]
    for task in back:
        ready.push(task, 0.0)
    assert ready.pop_for(WORKER, 0.0) is back[1]  # A was seen first


# ---------------------------------------------------------------------- capacity caps


def test_reserved_capacity_is_lent_while_no_critical_task_waits() -> None:
    ids, ready = Ids(), ReadyQueues(capacity=10)
    for _ in range(10):
        ready.push(make(ids, A, BULK), 0.0)
    for _ in range(10):
        task = ready.pop_for(WORKER, 0.0)
        assert task is not None  # bulk's 50% cap and the reserve only bind while others wait
        ready.task_started(task)
    assert ready.get_stats()["in_flight_bulk"] == 10


def test_reserve_holds_lower_classes_while_a_held_critical_task_waits() -> None:
    held = {C: TenantLimits(max_concurrent=0, rate_limit_rps=None)}
    ids, ready = Ids(), ReadyQueues(tenant_limits=limits_of(held), capacity=10)
    critical = make(ids, C, CRITICAL)
    ready.push(critical, 0.0)
    for _ in range(20):
        ready.push(make(ids, A, STANDARD), 0.0)
    started = []
    while (task := ready.pop_for(WORKER, 0.0)) is not None:
        ready.task_started(task)
        started.append(task)
    assert len(started) == 9  # floor(0.9 * 10): one slot kept for critical work
    assert ready.get_stats()["held_by_reserve"] >= 1
    ready.task_finished(A, STANDARD)
    refill = ready.pop_for(WORKER, 0.0)  # back under the limit
    assert refill is not None
    ready.task_started(refill)
    assert ready.pop_for(WORKER, 0.0) is None
    held[C] = UNLIMITED
    ready.limits_changed(C)
    ready.task_finished(A, "standard")
    assert ready.pop_for(WORKER, 0.0) is critical
    # No critical work waits any more: the reserve is lent out again.
    assert ready.pop_for(WORKER, 0.0) is not None
    assert ready.pop_for(WORKER, 0.0) is not None


def test_bulk_cap_binds_only_while_standard_work_waits() -> None:
    held = {B: TenantLimits(max_concurrent=0, rate_limit_rps=None)}
    ids, ready = Ids(), ReadyQueues(tenant_limits=limits_of(held), capacity=10)
    blocked_standard = make(ids, B, STANDARD)
    ready.push(blocked_standard, 0.0)
    for _ in range(10):
        ready.push(make(ids, A, BULK), 0.0)
    for _ in range(5):
        task = ready.pop_for(WORKER, 0.0)
        assert task is not None and task.priority is BULK
        ready.task_started(task)
    assert ready.pop_for(WORKER, 0.0) is None  # floor(0.5 * 10) bulk in flight
    assert ready.get_stats()["held_by_class_cap"] >= 1
    assert ready.remove(blocked_standard.id)
    assert ready.pop_for(WORKER, 0.0) is not None  # nothing higher waits: cap lifted


def test_zero_capacity_means_no_caps_and_capacity_is_validated() -> None:
    held = {C: TenantLimits(max_concurrent=0, rate_limit_rps=None)}
    ids, ready = Ids(), ReadyQueues(tenant_limits=limits_of(held))
    ready.push(make(ids, C, CRITICAL), 0.0)
    for _ in range(30):
        ready.push(make(ids, A, BULK), 0.0)
    for task in drain(ready):
        ready.task_started(task)
    assert ready.get_stats()["in_flight_bulk"] == 30
    with pytest.raises(InvalidArgument):
        ready.set_capacity(-1)


# ---------------------------------------------------------------------- tenant limits


def test_concurrency_cap_skips_a_tenant_until_a_task_finishes() -> None:
    table = {A: TenantLimits(max_concurrent=2, rate_limit_rps=None)}
    ids, ready = Ids(), ReadyQueues(tenant_limits=limits_of(table))
    for due in range(5):
        ready.push(make(ids, A, due=float(due)), 0.0)
    other = make(ids, B, due=99.0)
    ready.push(other, 0.0)
    got = [ready.pop_for(WORKER, 0.0) for _ in range(3)]
    assert [t.tenant_id for t in got if t] == [A, B, A]
    for task in got:
        assert task is not None
        ready.task_started(task)
    ready.task_finished(B, STANDARD)  # another tenant's finish frees nothing for A
    assert ready.pop_for(WORKER, 0.0) is None
    assert ready.get_stats()["throttled_by_concurrency"] >= 1
    ready.task_finished(A, STANDARD)
    task = ready.pop_for(WORKER, 0.0)
    assert task is not None and task.due_at_wall == 2.0  # skipped, not dropped: FIFO kept
    assert len(ready) == 2


def test_held_tenants_are_parked_instead_of_rescanned_on_every_pop() -> None:
    calls: Counter[uuid.UUID] = Counter()

    def lookup(tenant: uuid.UUID) -> TenantLimits:
        calls[tenant] += 1
        return TenantLimits(max_concurrent=1, rate_limit_rps=None)

    ids, ready = Ids(), ReadyQueues(tenant_limits=lookup)
    tenants = [uuid.UUID(int=0xB0000 + i) for i in range(300)]
    for tenant in tenants:
        ready.task_started(make(ids, tenant))  # one running task each: all at their cap
        ready.push(make(ids, tenant), 0.0)
    assert ready.pop_for(WORKER, 0.0) is None
    assert sum(calls.values()) == 300
    calls.clear()
    for _ in range(10):
        assert ready.pop_for(WORKER, 0.0) is None
    assert sum(calls.values()) == 0
    assert ready.get_stats()["parked_tenants"] == 300
    ready.task_finished(tenants[7], STANDARD)
    task = ready.pop_for(WORKER, 0.0)
    assert task is not None and task.tenant_id == tenants[7]
    assert sum(calls.values()) <= 3


def test_rate_limit_burst_then_one_per_interval_and_next_eligible_at() -> None:
    table = {A: TenantLimits(max_concurrent=None, rate_limit_rps=2.0)}
    ids, ready = Ids(), ReadyQueues(tenant_limits=limits_of(table))
    for _ in range(10):
        ready.push(make(ids, A), 0.0)
    assert ready.next_eligible_at(0.0) is None  # nothing is known to be held yet
    assert len(drain(ready, now=100.0)) == 2  # burst = max(1, rps)
    assert ready.next_eligible_at(100.0) == pytest.approx(100.5)
    assert ready.pop_for(WORKER, 100.4) is None
    assert ready.pop_for(WORKER, 100.5) is not None
    assert ready.get_stats()["throttled_by_rate"] == 1  # parked until 100.5: not re-checked
    assert drain(ready, now=100.5) == []  # one token, one task
    ready.push(make(ids, B), 100.6)  # unlimited tenants are not held by A's limit
    assert ready.pop_for(WORKER, 100.6) is not None


@settings(max_examples=60, deadline=None)
@given(
    rps=st.floats(0.2, 20.0),
    gaps=st.lists(st.floats(0.0, 1.5), min_size=1, max_size=60),
)
def test_rate_limit_holds_over_every_window_of_fake_time(rps: float, gaps: list[float]) -> None:
    table = {A: TenantLimits(max_concurrent=None, rate_limit_rps=rps)}
    ids, ready = Ids(), ReadyQueues(tenant_limits=limits_of(table))
    ready.push(make(ids, A), 0.0)
    times: list[float] = []

    def pop(now: float) -> bool:
        task = ready.pop_for(WORKER, now)
        if task is None:
            return False
        times.append(now)
        ready.push(make(ids, A), now)  # stay backlogged
        return True

    now = 0.0
    for gap in gaps:
        now += gap
        while pop(now):
            pass
        wake = ready.next_eligible_at(now)
        assert wake is not None and wake > now
        if wake - 1e-6 > now:
            assert not pop(wake - 1e-6)
        now = wake
        assert pop(now)  # exactly when promised
    # count(i..j) <= burst + rps * (t_j - t_i) for every window, checked in one pass.
    burst = max(1.0, rps)
    lowest = math.inf
    for j, at in enumerate(times):
        lowest = min(lowest, j - rps * at)
        assert (j - rps * at) - lowest <= burst - 1 + 1e-6


def test_limits_and_policy_are_validated() -> None:
    bad_limits: list[Callable[[], object]] = [
        lambda: TenantLimits(-1, None),
        lambda: TenantLimits(None, 0.0),
        lambda: TenantLimits(None, math.inf),
        lambda: TenantLimits(None, None, weight=0.0),
        lambda: FairnessPolicy(class_weights={CRITICAL: 1.0, STANDARD: 1.0}),
        lambda: FairnessPolicy(class_weights={CRITICAL: 1.0, STANDARD: 1.0, BULK: -1.0}),
        lambda: FairnessPolicy(class_in_flight_caps={CRITICAL: 0.5}),
        lambda: FairnessPolicy(class_in_flight_caps={BULK: 1.5}),
        lambda: FairnessPolicy(critical_reserve_fraction=1.0),
    ]
    for build in bad_limits:
        with pytest.raises(InvalidArgument):
            build()
    policy = FairnessPolicy(class_weights={"critical": 2, "standard": 1, "bulk": 1})  # type: ignore[dict-item]
    assert policy.class_weights[CRITICAL] == 2


def test_an_unmatched_finish_never_drives_counts_below_zero() -> None:
    ids, ready = Ids(), ReadyQueues()
    ready.task_finished(A, BULK)
    task = make(ids, A, BULK)
    ready.task_started(task)
    ready.task_finished(A, BULK)
    ready.task_finished(A, BULK)
    stats = ready.get_stats()
    assert (stats["in_flight_bulk"], stats["unmatched_finishes"], stats["finished"]) == (0, 2, 3)


# ---------------------------------------------------------------------- stateful model

QUEUES = ("q1", "q2")
TYPES = ("a", "b")
OFFERS = (
    WorkerOffer(frozenset({"q1"}), frozenset({"a"})),
    WorkerOffer(frozenset({"q1", "q2"}), frozenset({"a", "b"})),
    WorkerOffer(frozenset({"q2"}), frozenset({"a", "b"})),
    WorkerOffer(frozenset({"q1"}), frozenset({"b"})),
)
MODEL_TENANTS = TENANTS[:4]
MODEL_LIMITS = {
    MODEL_TENANTS[0]: UNLIMITED,
    MODEL_TENANTS[1]: TenantLimits(max_concurrent=2, rate_limit_rps=None),
    MODEL_TENANTS[2]: TenantLimits(max_concurrent=None, rate_limit_rps=1.5),
    MODEL_TENANTS[3]: TenantLimits(max_concurrent=1, rate_limit_rps=0.5, weight=3.0),
}
CAPS = {STANDARD: 0.9, BULK: 0.5}


def serves(offer: WorkerOffer, task: ReadyTask) -> bool:
    return task.queue in offer.queues and task.type in offer.types


class SelectorAgainstModel(RuleBasedStateMachine):
    """The model knows what is waiting and in flight, and the rules of the docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = ReadyQueues(tenant_limits=limits_of(MODEL_LIMITS))
        self.ids = Ids()
        self.waiting: dict[uuid.UUID, ReadyTask] = {}
        self.pushed_at: dict[uuid.UUID, int] = {}  # push order, the FIFO tie-break
        self.push_seq = itertools.count()
        self.in_flight: dict[uuid.UUID, ReadyTask] = {}
        self.dispatched_at: dict[uuid.UUID, list[float]] = {t: [] for t in MODEL_TENANTS}
        self.now = 0.0
        self.capacity = 0

    # --- what the model may conclude --------------------------------------------------

    def tenant_maybe_held(self, tenant: uuid.UUID) -> bool:
        limits = MODEL_LIMITS[tenant]
        if limits.rate_limit_rps is not None:
            return True  # the bucket is checked by its own rule below, not modelled here
        running = sum(1 for t in self.in_flight.values() if t.tenant_id == tenant)
        return limits.max_concurrent is not None and running >= limits.max_concurrent

    def class_held(self, offer: WorkerOffer, rank: int) -> bool:
        if self.capacity == 0 or rank == 0:
            return False
        waits = [
            any(serves(offer, t) and t.priority is p for t in self.waiting.values())
            for p in CLASSES
        ]
        flying = Counter(t.priority for t in self.in_flight.values())
        if waits[0] and flying[STANDARD] + flying[BULK] >= math.floor(0.9 * self.capacity + 1e-9):
            return True
        cap = math.floor(CAPS[CLASSES[rank]] * self.capacity + 1e-9)
        return any(waits[:rank]) and flying[CLASSES[rank]] >= cap

    # --- rules ------------------------------------------------------------------------

    @rule(
        tenant=st.sampled_from(MODEL_TENANTS),
        priority=st.sampled_from(CLASSES),
        queue=st.sampled_from(QUEUES),
        type_=st.sampled_from(TYPES),
        due=st.integers(0, 20),
    )
    def push(self, tenant: uuid.UUID, priority: Priority, queue: str, type_: str, due: int) -> None:
        task = ReadyTask(self.ids(), tenant, priority, queue, type_, float(due))
        self.ready.push(task, self.now)
        self.waiting[task.id] = task
        self.pushed_at[task.id] = next(self.push_seq)

    @precondition(lambda self: self.waiting)
    @rule(
        pick=st.integers(0, 10**6), priority=st.sampled_from(CLASSES), type_=st.sampled_from(TYPES)
    )
    def repush(self, pick: int, priority: Priority, type_: str) -> None:
        old = self.waiting[sorted(self.waiting)[pick % len(self.waiting)]]
        new = ReadyTask(old.id, old.tenant_id, priority, old.queue, type_, old.due_at_wall + 1)
        self.ready.push(new, self.now)
        self.waiting[new.id] = new
        self.pushed_at[new.id] = next(self.push_seq)

    @rule(pick=st.integers(0, 10**6))
    def remove(self, pick: int) -> None:
        task_id = uuid.UUID(int=pick % (self.ids.n + 2))  # sometimes unknown or gone
        assert self.ready.remove(task_id) is (self.waiting.pop(task_id, None) is not None)

    @rule(offer=st.sampled_from(OFFERS), start=st.booleans())
    def pop(self, offer: WorkerOffer, start: bool) -> None:
        task = self.ready.pop_for(offer, self.now)
        if task is None:
            for waiting in self.waiting.values():
                if serves(offer, waiting):
                    assert self.tenant_maybe_held(waiting.tenant_id) or self.class_held(
                        offer, CLASSES.index(waiting.priority)
                    ), f"{waiting} could have gone"
            return
        assert self.waiting.get(task.id) is task, "lost, duplicated or stale version"
        assert serves(offer, task)
        del self.waiting[task.id]
        rank = CLASSES.index(task.priority)
        assert not self.class_held(offer, rank)
        mine = (task.due_at_wall, self.pushed_at[task.id])
        for other in self.waiting.values():
            if (other.tenant_id, other.priority) == (task.tenant_id, task.priority) and serves(
                offer, other
            ):
                assert (other.due_at_wall, self.pushed_at[other.id]) > mine, "FIFO broken"
        if task.priority is not CRITICAL:
            for other in self.waiting.values():
                if other.priority is CRITICAL and serves(offer, other):
                    assert self.tenant_maybe_held(other.tenant_id), f"{other} was bypassed"
        limits = MODEL_LIMITS[task.tenant_id]
        if limits.max_concurrent is not None:
            running = sum(1 for t in self.in_flight.values() if t.tenant_id == task.tenant_id)
            assert running < limits.max_concurrent
        if limits.rate_limit_rps is not None:
            times = self.dispatched_at[task.tenant_id]
            times.append(self.now)
            rps, burst = limits.rate_limit_rps, max(1.0, limits.rate_limit_rps)
            for i in range(len(times)):
                assert len(times) - i <= burst + rps * (self.now - times[i]) + 1e-6
        if start:
            self.ready.task_started(task)
            self.in_flight[task.id] = task

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(0, 10**6))
    def finish(self, pick: int) -> None:
        task = self.in_flight.pop(sorted(self.in_flight)[pick % len(self.in_flight)])
        self.ready.task_finished(task.tenant_id, task.priority)

    @rule(dt=st.floats(0.0, 3.0))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(capacity=st.integers(0, 8))
    def set_capacity(self, capacity: int) -> None:
        self.ready.set_capacity(capacity)
        self.capacity = capacity

    # --- invariants and the final drain -----------------------------------------------

    @invariant()
    def counts_match(self) -> None:
        assert len(self.ready) == len(self.waiting)
        stats = self.ready.get_stats()
        assert stats["garbage"] >= 0
        for priority in CLASSES:
            assert stats[f"waiting_{priority}"] == sum(
                1 for t in self.waiting.values() if t.priority is priority
            )
            assert stats[f"in_flight_{priority}"] == sum(
                1 for t in self.in_flight.values() if t.priority is priority
            )
        for offer in OFFERS:
            assert self.ready.waiting_for(offer.queues, offer.types) == sum(
                1 for t in self.waiting.values() if serves(offer, t)
            )
        # The metrics' ready depth: what waits, by queue, class and tenant, exactly.
        assert self.ready.depths() == Counter(
            (t.queue, t.priority, t.tenant_id) for t in self.waiting.values()
        )

    def teardown(self) -> None:
        for running in self.in_flight.values():
            self.ready.task_finished(running.tenant_id, running.priority)
        everything = WorkerOffer(frozenset(QUEUES), frozenset(TYPES))
        now = self.now
        for _ in range(10 * len(self.waiting) + 10):
            task = self.ready.pop_for(everything, now)
            if task is None:
                if not self.waiting:
                    break
                wake = self.ready.next_eligible_at(now)
                assert wake is not None and wake > now, "work waits with nothing to wait for"
                now = wake
                continue
            assert self.waiting.pop(task.id) is task
            self.ready.task_started(task)
            self.ready.task_finished(task.tenant_id, task.priority)
        assert not self.waiting and len(self.ready) == 0
        assert self.ready.get_stats()["garbage"] == 0


SelectorAgainstModel.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None
)
TestSelectorAgainstModel = SelectorAgainstModel.TestCase
