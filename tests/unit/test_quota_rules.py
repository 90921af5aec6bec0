"""Tenant quotas, pure parts: a dispatch round's admission, token buckets over time, a
node's share of a quota, the ready queues' holds and probes, the throttling metric's
labels, and the signal that tells nodes a tenant changed.

Property tests state the bounds docs/operations.md#tenants-and-quotas promises: a round
never takes a tenant past its concurrency nor its bucket below zero; over any window of
``w`` seconds a bucket lets at most ``rate * w + burst`` through (plus one request's debt
for the submit bucket); the shares of a quota sum to it and never go negative; the same
membership always gives the same share; an allowance granted with a round, added to
what the round admitted and to the other nodes' allowances, never takes the tenant past
its concurrency nor its bucket below zero, and a node never spends more of it than it
was given, nor after it expired.
"""

from __future__ import annotations

import math
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.cluster.signals import CHANNEL, TENANTS_CHANGED, decode
from chronoshard.scheduler.core.fairness import ReadyQueues, ReadyTask, TenantLimits, WorkerOffer
from chronoshard.scheduler.core.models import Priority
from chronoshard.scheduler.core.quotas import (
    ALLOWANCE_MAX,
    ALLOWANCE_MIN,
    ALLOWANCE_SHARE,
    TOKEN_EPS,
    Allowances,
    HeldBy,
    SubmitRateLimiter,
    TokenBucket,
    admit,
    allowance,
    burst,
    node_share,
)
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.scheduler.metrics import OTHER_TENANTS, TenantLabels, tenant_totals
from chronoshard.scheduler.store import queries

A, B = uuid.UUID(int=0xA1), uuid.UUID(int=0xB2)
WORKER = WorkerOffer(frozenset({"q"}), frozenset({"t"}), "w1")

rates = st.floats(min_value=0.1, max_value=1_000.0, allow_nan=False)
counts = st.integers(min_value=0, max_value=50)
node_names = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=12, unique=True)


# --- admit: one round of one tenant --------------------------------------------------------


@given(
    wanted=counts,
    in_flight=counts,
    max_concurrent=st.integers(min_value=0, max_value=50),
    # What a bucket row can hold: full when new, else what a round left (never below 0).
    tokens=st.none() | st.floats(min_value=0.0, max_value=1_000.0),
    rate=rates,
    elapsed_s=st.floats(min_value=-10.0, max_value=100.0),
)
def test_a_round_never_exceeds_the_tenants_concurrency_nor_its_tokens(
    wanted: int,
    in_flight: int,
    max_concurrent: int,
    tokens: float | None,
    rate: float,
    elapsed_s: float,
) -> None:
    answer = admit(
        wanted,
        in_flight=in_flight,
        max_concurrent=max_concurrent,
        tokens=tokens,
        rate=rate,
        elapsed_s=elapsed_s,
    )
    assert 0 <= answer.admitted <= wanted
    # Never past the limit; a tenant already past it (a lowered limit) gets nothing.
    assert answer.in_flight == in_flight + answer.admitted
    assert answer.admitted == 0 or answer.in_flight <= max_concurrent
    # Never more than the bucket held in whole tokens: it never goes below zero.
    assert answer.tokens >= -TOKEN_EPS
    assert answer.tokens <= burst(rate)
    assert (answer.held_by is None) == (answer.admitted == wanted)
    if answer.held_by is HeldBy.RATE:
        # The wait is exactly when one whole token is back.
        assert answer.tokens + answer.wait_s * rate == pytest.approx(1.0)
    else:
        assert answer.wait_s == 0.0


@given(
    wanted=counts,
    in_flight=st.integers(min_value=0, max_value=5_000),
    reserved=st.integers(min_value=0, max_value=5_000),
    max_concurrent=st.integers(min_value=0, max_value=10_000),
    tokens=st.none() | st.floats(min_value=0.0, max_value=10_000.0),
    rate=st.floats(min_value=0.1, max_value=10_000.0),
    elapsed_s=st.floats(min_value=-10.0, max_value=100.0),
    nodes=st.integers(min_value=1, max_value=8),
)
def test_an_allowance_never_takes_the_tenant_past_its_concurrency_nor_its_tokens(
    wanted: int,
    in_flight: int,
    reserved: int,
    max_concurrent: int,
    tokens: float | None,
    rate: float,
    elapsed_s: float,
    nodes: int,
) -> None:
    answer = admit(
        wanted,
        in_flight=in_flight,
        max_concurrent=max_concurrent,
        tokens=tokens,
        rate=rate,
        elapsed_s=elapsed_s,
        reserved=reserved,
    )
    granted = allowance(answer, max_concurrent=max_concurrent, reserved=reserved, nodes=nodes)
    # The round's tasks, every other node's allowance used in full, and this one: still
    # within the limit (a tenant already past it gets neither).
    if answer.admitted or granted:
        assert answer.in_flight + reserved + granted <= max_concurrent
    # Its tokens come out of the bucket, which never goes below zero.
    assert answer.tokens - granted >= -TOKEN_EPS
    assert granted == 0 or ALLOWANCE_MIN <= granted <= ALLOWANCE_MAX
    assert granted == 0 or answer.held_by is None
    # At most its share of the headroom: the nodes together never take more than
    # ALLOWANCE_SHARE of it, the rest is left for checked rounds.
    headroom = max(0, max_concurrent - answer.in_flight - reserved)
    assert granted * nodes <= ALLOWANCE_SHARE * headroom


def test_no_allowance_close_to_a_limit() -> None:
    answer = admit(1, in_flight=0, max_concurrent=20, tokens=None, rate=1000.0, elapsed_s=0.0)
    # 19 left, half of it over one node: 9; over two: 4, under ALLOWANCE_MIN.
    assert allowance(answer, max_concurrent=20, reserved=0, nodes=1) == 9
    assert allowance(answer, max_concurrent=20, reserved=0, nodes=2) == 0
    slow = admit(1, in_flight=0, max_concurrent=1000, tokens=None, rate=20.0, elapsed_s=0.0)
    assert allowance(slow, max_concurrent=1000, reserved=0, nodes=1) == 9
    assert allowance(slow, max_concurrent=1000, reserved=0, nodes=3) == 0


spends = st.lists(
    st.tuples(
        st.sampled_from(["take", "give", "drop", "drop-old"]),
        st.integers(min_value=0, max_value=30),
        st.floats(min_value=0.0, max_value=0.5),
    ),
    max_size=60,
)


@given(spends)
def test_a_node_never_spends_more_of_an_allowance_than_it_was_given_nor_after_it_expired(
    steps: list[tuple[str, int, float]],
) -> None:
    book = Allowances()
    now = 0.0
    given_at: dict[uuid.UUID, tuple[int, float]] = {}  # grant -> (count, until)
    spent: dict[uuid.UUID, int] = {}
    current: uuid.UUID | None = None
    old: uuid.UUID | None = None
    for action, count, step in steps:
        now += step
        if action == "give":
            old, current = current, uuid.uuid4()
            given_at[current] = (count, now + 1.0)
            book.give(A, current, count, now + 1.0)
        elif action == "take":
            grant = book.take(A, count, now)
            if grant is not None:
                assert grant == current and now < given_at[grant][1]
                spent[grant] = spent.get(grant, 0) + count
        elif action == "drop":
            book.drop(A)
            current = None
        elif old is not None:
            held = book.holds(A)
            book.drop(A, old)  # a round refused under an old grant: the current one stays
            assert book.holds(A) == held
    for grant, total in spent.items():
        assert total <= given_at[grant][0]


@settings(max_examples=200)
@given(
    rate=rates,
    rounds=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=0.5), st.integers(min_value=1, max_value=40)),
        min_size=1,
        max_size=200,
    ),
    window_s=st.floats(min_value=0.1, max_value=20.0),
)
def test_the_database_bucket_lets_at_most_rate_times_window_plus_burst_through(
    rate: float, rounds: list[tuple[float, int]], window_s: float
) -> None:
    """Rounds from any nodes, in the order their locks gave them: whatever they ask for
    and whenever, any window of ``w`` seconds admits at most ``rate * w + burst``."""
    tokens: float | None = None
    at, last = 0.0, 0.0
    admitted: list[tuple[float, int]] = []
    for gap_s, wanted in rounds:
        at += gap_s
        answer = admit(
            wanted,
            in_flight=0,
            max_concurrent=10**6,
            tokens=tokens,
            rate=rate,
            elapsed_s=at - last,
        )
        if answer.admitted:
            tokens, last = answer.tokens, at
            admitted.append((at, answer.admitted))
        elif tokens is None:
            tokens, last = answer.tokens, at
    for start, _ in admitted:
        inside = sum(n for t, n in admitted if start <= t <= start + window_s)
        assert inside <= rate * window_s + burst(rate) + TOKEN_EPS * len(admitted)


def test_a_new_tenant_starts_with_a_full_bucket_and_is_told_when_to_come_back() -> None:
    first = admit(30, in_flight=0, max_concurrent=100, tokens=None, rate=20.0, elapsed_s=0.0)
    assert (first.admitted, first.held_by) == (20, HeldBy.RATE)
    assert first.wait_s == pytest.approx(1 / 20)
    later = admit(5, in_flight=20, max_concurrent=22, tokens=first.tokens, rate=20.0, elapsed_s=1)
    assert (later.admitted, later.held_by, later.in_flight) == (2, HeldBy.CONCURRENCY, 22)


# --- token buckets over time ------------------------------------------------------------------


takes = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=2.0), st.integers(min_value=1, max_value=2000)),
    min_size=1,
    max_size=150,
)
"""(gap since the previous request in seconds, tasks asked) for a bucket."""


@settings(max_examples=200)
@given(rate=rates, takes=takes)
def test_a_submit_bucket_holds_its_rate_with_at_most_one_requests_debt(
    rate: float, takes: list[tuple[float, int]]
) -> None:
    bucket = TokenBucket(rate, now=0.0)
    now, taken, biggest = 0.0, 0, 0
    for gap_s, n in takes:
        now += gap_s
        wait_s = bucket.take(n, now)
        if wait_s == 0.0:
            taken += n
            biggest = max(biggest, n)
        else:
            # The delay is honest: after it, the same request goes.
            assert wait_s > 0
            probe = TokenBucket(rate, now=0.0)
            probe.tokens, probe.updated_at = bucket.tokens, bucket.updated_at
            assert probe.take(n, now + wait_s + 1e-9) == 0.0
    debt = max(0.0, biggest - burst(rate))
    assert taken <= burst(rate) + rate * now + debt + 1e-6


@settings(max_examples=200)
@given(rate=rates, takes=takes)
def test_asking_what_a_take_would_answer_takes_nothing(
    rate: float, takes: list[tuple[float, int]]
) -> None:
    asked, only_taken = TokenBucket(rate, now=0.0), TokenBucket(rate, now=0.0)
    now = 0.0
    for gap_s, n in takes:
        now += gap_s
        would_wait = asked.wait_for(n, now)
        assert would_wait == asked.wait_for(n, now)  # asking twice: the same answer
        assert asked.take(n, now) == would_wait == only_taken.take(n, now)
        assert asked.tokens == only_taken.tokens


def test_a_limiter_asked_first_answers_as_its_check_then_does() -> None:
    limiter = SubmitRateLimiter()
    assert limiter.would_wait(A, 10, 10.0, now=0.0) == 0.0
    assert limiter.would_wait(A, 10, 10.0, now=0.0) == 0.0  # nothing was taken
    assert limiter.check(A, 10, 10.0, now=0.0) == 0.0
    assert limiter.would_wait(A, 5, 10.0, now=0.0) == pytest.approx(0.5)
    assert limiter.check(A, 5, 10.0, now=0.0) == pytest.approx(0.5)
    assert limiter.would_wait(B, 10**6, None, now=0.0) == 0.0  # no limit
    assert len(limiter) == 1


def test_a_batch_bigger_than_the_burst_goes_when_the_bucket_is_full_and_leaves_a_debt() -> None:
    limiter = SubmitRateLimiter()
    assert limiter.check(A, 1000, 10.0, now=0.0) == 0.0  # full: 10 tokens, a debt of 990
    assert limiter.check(A, 1, 10.0, now=0.0) == pytest.approx(99.1)
    assert limiter.check(A, 1, 10.0, now=99.1 + 1e-6) == 0.0
    assert limiter.check(B, 5, None, now=0.0) == 0.0  # no limit: never refused
    assert len(limiter) == 1


def test_a_changed_submit_rate_applies_from_then_on() -> None:
    limiter = SubmitRateLimiter()
    assert limiter.check(A, 2, 2.0, now=0.0) == 0.0
    assert limiter.check(A, 1, 2.0, now=0.0) > 0
    # Raised: the burst grows with it, but what was not earned yet is not given.
    assert limiter.check(A, 1, 100.0, now=0.0) > 0
    assert limiter.check(A, 1, 100.0, now=0.01) == 0.0


def test_quiet_tenants_buckets_are_dropped_once_there_are_too_many() -> None:
    limiter = SubmitRateLimiter(max_tenants=3)
    for i in range(3):
        limiter.check(uuid.UUID(int=i), 1, 10.0, now=0.0)
    limiter.check(uuid.UUID(int=99), 1, 10.0, now=100.0)  # the others refilled: dropped
    assert len(limiter) == 1


# --- a node's share ------------------------------------------------------------------------

# Subnormal quotas (below ~2.2e-308 per second) are left out: dividing one loses more than
# the relative tolerance below to rounding, and no rate an operator sets lives there.
quotas = st.floats(min_value=0.0, max_value=1e6, allow_subnormal=False)


@given(quota=quotas, nodes=node_names)
def test_the_shares_of_a_quota_sum_to_it_and_are_stable(quota: float, nodes: list[str]) -> None:
    shares = [node_share(quota, nodes, node) for node in nodes]
    assert all(share >= 0 for share in shares)
    assert math.fsum(shares) <= quota * (1 + 1e-12)
    assert math.fsum(shares) == pytest.approx(quota)
    # The same membership (in any order) gives every node the same share again.
    assert [node_share(quota, list(reversed(nodes)), node) for node in nodes] == shares


@given(quota=quotas, nodes=node_names)
def test_a_joining_node_never_takes_more_than_its_share_of_the_new_membership(
    quota: float, nodes: list[str]
) -> None:
    joiner = "joiner-" + "x" * 7  # not among the generated names (at most 6 characters)
    before = [node_share(quota, nodes, node) for node in nodes]
    mine = node_share(quota, nodes, joiner)  # its own registration not seen yet
    assert mine == node_share(quota, [*nodes, joiner], joiner)
    # Until the others see it: over the quota by its share, never more.
    assert math.fsum([*before, mine]) <= quota + mine + 1e-6 * quota


def test_a_share_refuses_a_negative_quota() -> None:
    with pytest.raises(ValueError):
        node_share(-1.0, ["a"], "a")


# --- the ready queues: holds, probes, streams that close ------------------------------------


def _ready(queues: ReadyQueues, tenant: uuid.UUID, n: int) -> None:
    for i in range(n):
        task_id = uuid.UUID(int=(tenant.int << 16) + len(queues) + i + 1)
        queues.push(ReadyTask(task_id, tenant, Priority.STANDARD, "q", "t", float(i)), now=0.0)


def _limits(max_concurrent: int | None = None, rps: float | None = None) -> TenantLimits:
    return TenantLimits(max_concurrent=max_concurrent, rate_limit_rps=rps)


def test_a_hold_keeps_the_tenant_back_until_its_time_and_wakes_the_loop_then() -> None:
    queues = ReadyQueues(tenant_limits=lambda _t: _limits())
    _ready(queues, A, 2)
    queues.hold(A, until=5.0)
    assert queues.pop_for(WORKER, now=1.0) is None
    assert queues.next_eligible_at(1.0) == 5.0
    assert queues.throttles() == {(A, HeldBy.RATE): 1}
    popped = queues.pop_for(WORKER, now=5.0)
    assert popped is not None and popped.tenant_id == A


def test_a_tenant_at_its_concurrency_probes_once_per_interval() -> None:
    queues = ReadyQueues(tenant_limits=lambda _t: _limits(max_concurrent=2), concurrency_probe_s=1)
    _ready(queues, A, 5)
    queues.observe_in_flight(A, 2, now=0.0)  # the database counted 2 in flight
    assert queues.pop_for(WORKER, now=0.5) is None
    assert queues.next_eligible_at(0.5) == 1.0
    probe = queues.pop_for(WORKER, now=1.0)  # one goes, for the database to judge
    assert probe is not None
    queues.task_started(probe)
    assert queues.pop_for(WORKER, now=1.0) is None  # and only one
    # The round found the tenant's other attempts settled (through other nodes).
    queues.observe_in_flight(A, 1, now=1.0)
    again = queues.pop_for(WORKER, now=1.0)
    assert again is not None and again.tenant_id == A
    assert queues.get_stats()["concurrency_probes"] == 1


def test_without_probes_a_tenant_at_its_concurrency_waits_for_a_finish() -> None:
    queues = ReadyQueues(tenant_limits=lambda _t: _limits(max_concurrent=1))
    _ready(queues, A, 2)
    first = queues.pop_for(WORKER, now=0.0)
    assert first is not None
    queues.task_started(first)
    assert queues.pop_for(WORKER, now=100.0) is None
    assert queues.next_eligible_at(100.0) is None
    queues.task_finished(A, Priority.STANDARD)
    assert queues.pop_for(WORKER, now=100.0) is not None


def test_a_closed_stream_frees_the_class_slot_but_not_the_tenants() -> None:
    queues = ReadyQueues(tenant_limits=lambda _t: _limits(max_concurrent=1))
    _ready(queues, A, 2)
    first = queues.pop_for(WORKER, now=0.0)
    assert first is not None
    queues.task_started(first)
    queues.task_left(first.priority)  # the worker's stream closed; it may still run
    assert queues.get_stats()["in_flight_standard"] == 0
    assert queues.pop_for(WORKER, now=0.0) is None  # the tenant's slot is still taken
    # It settles through another stream (another node): the next round's count says so.
    queues.observe_in_flight(A, 0, now=0.0)
    assert queues.pop_for(WORKER, now=0.0) is not None


def test_a_probe_interval_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="concurrency_probe_s"):
        ReadyQueues(concurrency_probe_s=0)


# --- the throttling metric's tenant label --------------------------------------------------


def test_a_tenant_keeps_its_throttling_series_and_latecomers_share_other() -> None:
    labels = TenantLabels(max_tenants=1)
    first = tenant_totals({(B, "rate"): 3, (A, "rate"): 1}, labels)
    # The first by id gets the named series, for good.
    assert first == {(str(A), "rate"): 1.0, (OTHER_TENANTS, "rate"): 3.0}
    later = tenant_totals({(B, "rate"): 5, (A, "rate"): 9, (A, "concurrency"): 2}, labels)
    assert later == {
        (str(A), "rate"): 9.0,
        (str(A), "concurrency"): 2.0,
        (OTHER_TENANTS, "rate"): 5.0,
    }


# --- the signal `tenants update` sends -----------------------------------------------------


def test_the_tenants_signal_is_what_the_operators_statement_sends() -> None:
    statement = queries.load("tenants.sql")["notify_tenants_changed"]
    assert f"pg_notify('{CHANNEL}', '{TENANTS_CHANGED}')" in statement
    assert decode(TENANTS_CHANGED) == (TENANTS_CHANGED, set(), [])
