"""Worker self-fencing: a run's lease as the worker sees it, and what the context and the
outcome table do once it is lost. Pure: the clock is a FakeClock, the handlers run through
the testing helper on the test's loop."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fixtures.attempts import attempt_context
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.clock import FakeClock
from chronoshard.worker import LeaseLost, StopReason, TaskCancelled, TaskContext
from chronoshard.worker._execution import LEASE_LOST, Abandoned, Completed, Released, decide
from chronoshard.worker._execution import not_started as outcome_before_start
from chronoshard.worker._lease import RunLease, initial_deadline
from chronoshard.worker._models import HeartbeatReply, NodeInfo
from chronoshard.worker._session import NodeSession
from chronoshard.worker.testing import TaskEnvironment

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
LEASE_S = 30.0
MARGIN_S = 2.0


def _lease(clock: FakeClock, deadline_in_s: float = LEASE_S) -> RunLease:
    return RunLease(
        deadline=clock.monotonic() + deadline_in_s, margin_s=MARGIN_S, monotonic=clock.monotonic
    )


def _context(clock: FakeClock, lease: RunLease) -> TaskContext:
    return attempt_context(lease, token=7, now=clock.now)


# ---- the initial deadline --------------------------------------------------------------


def test_the_initial_deadline_is_the_earlier_bound() -> None:
    # Received 0.3 s after the intent committed (lease written then): the wall-clock bound
    # (synchronised clocks) is the node's lease exactly; received + lease is 0.3 s later.
    expires = T0 + timedelta(seconds=LEASE_S)
    received_wall = T0 + timedelta(seconds=0.3)
    deadline = initial_deadline(
        received_at=100.0, lease_s=LEASE_S, lease_expires_at=expires, wall_now=received_wall
    )
    assert deadline == pytest.approx(100.0 + LEASE_S - 0.3)
    # A worker clock 10 s behind: the wall bound would be 10 s late; received + lease wins.
    behind = received_wall - timedelta(seconds=10)
    deadline = initial_deadline(
        received_at=100.0, lease_s=LEASE_S, lease_expires_at=expires, wall_now=behind
    )
    assert deadline == pytest.approx(100.0 + LEASE_S)
    # Nothing known (an old node): no deadline, the lease never lapses on its own.
    assert (
        initial_deadline(received_at=1.0, lease_s=None, lease_expires_at=None, wall_now=T0) is None
    )


@settings(max_examples=300, deadline=None)
@given(
    transit_s=st.floats(0, 5),
    offset_s=st.floats(-60, 60),
    beats=st.lists(st.tuples(st.floats(0.1, 10), st.floats(0, 3), st.booleans()), max_size=20),
)
def test_the_worker_s_lease_never_outlives_the_node_s_by_more_than_the_transit(
    transit_s: float, offset_s: float, beats: list[tuple[float, float, bool]]
) -> None:
    """In true time, with the node's leases written at commit time: the worker's deadline
    is never later than the node's lease, except by what the assignment's transit adds
    when the worker's wall clock is behind (the margin covers that). Heartbeats are
    (gap since the last send, commit delay after the send, answered?)."""
    commit = 0.0
    node_expiry = commit + LEASE_S
    received = commit + transit_s
    deadline = initial_deadline(
        received_at=received,
        lease_s=LEASE_S,
        lease_expires_at=T0 + timedelta(seconds=node_expiry),
        wall_now=T0 + timedelta(seconds=received + offset_s),
    )
    assert deadline is not None
    now = received
    lease = RunLease(deadline=deadline, margin_s=MARGIN_S, monotonic=lambda: now)
    slack = min(transit_s, max(0.0, -offset_s)) + 1e-6
    assert lease.deadline is not None and lease.deadline <= node_expiry + slack
    for gap_s, commit_delay_s, answered in beats:
        now += gap_s
        sent = now
        node_commit = sent + commit_delay_s
        node_expiry = max(node_expiry, node_commit + LEASE_S)
        if answered:
            lease.extend(sent, LEASE_S)
        assert lease.deadline is not None and lease.deadline <= node_expiry + slack


# ---- the lease ---------------------------------------------------------------------------


def test_a_lease_lapses_margin_before_its_deadline_and_stays_lapsed() -> None:
    clock = FakeClock()
    lease = _lease(clock)
    clock.advance(LEASE_S - MARGIN_S - 0.001)
    assert lease.held() and lease.remaining_s() == pytest.approx(0.001)
    clock.advance(0.001)
    assert not lease.held() and lease.lapsed() and lease.remaining_s() == 0.0
    # A reply arriving now does not revive it: a write may have been refused already.
    assert lease.extend(clock.monotonic(), LEASE_S) is False
    assert not lease.held()


def test_a_reply_extends_from_when_the_heartbeat_was_sent_never_shorter() -> None:
    clock = FakeClock()
    lease = _lease(clock)
    start = clock.monotonic()
    clock.advance(5)
    sent = clock.monotonic()
    clock.advance(1)  # the reply comes 1 s later
    assert lease.extend(sent, LEASE_S)
    assert lease.deadline == pytest.approx(start + 5 + LEASE_S)
    # A reply to an older heartbeat (sent earlier) never moves the deadline back.
    assert lease.extend(start + 1, LEASE_S)
    assert lease.deadline == pytest.approx(start + 5 + LEASE_S)


def test_a_fenced_lease_is_not_held_and_keeps_its_first_reason() -> None:
    clock = FakeClock()
    lease = _lease(clock)
    lease.fence("the attempt timed out")
    lease.fence("the attempt was released")
    assert not lease.held() and lease.fenced == "the attempt timed out"
    assert lease.remaining_s() == 0.0 and not lease.extend(clock.monotonic(), LEASE_S)
    unbounded = RunLease.unbounded(clock.monotonic)
    clock.advance(10_000)
    assert unbounded.held() and unbounded.remaining_s() is None


# ---- the context -------------------------------------------------------------------------


def test_the_context_sees_a_lapsed_lease_from_the_clock_alone() -> None:
    """No request_stop: a thread checking at its deadline is refused even before the event
    loop got to fence the run (a process resumed after SIGSTOP)."""
    clock = FakeClock()
    ctx = _context(clock, _lease(clock))
    assert ctx.holds_lease and not ctx.cancelled and ctx.cancel_reason is None
    assert ctx.lease_remaining_s == pytest.approx(LEASE_S - MARGIN_S)
    ctx.check_lease()
    clock.advance(LEASE_S - MARGIN_S)
    assert not ctx.holds_lease and ctx.cancelled
    assert ctx.cancel_reason is StopReason.LEASE_LOST and ctx.lease_remaining_s == 0.0
    with pytest.raises(LeaseLost, match="no node renewed its lease"):
        ctx.check_lease()
    with pytest.raises(LeaseLost):
        ctx.raise_if_cancelled()
    assert issubclass(LeaseLost, TaskCancelled)


def test_a_revoked_attempt_may_not_write_either() -> None:
    clock = FakeClock()
    ctx = _context(clock, _lease(clock))
    ctx._request_stop(StopReason.REVOKED)
    with pytest.raises(LeaseLost, match="another attempt owns the task"):
        ctx.check_lease()
    assert ctx.lease_remaining_s == 0.0


def test_a_lost_lease_overrides_a_cancel_but_not_a_revocation() -> None:
    clock = FakeClock()
    ctx = _context(clock, _lease(clock))
    ctx._request_stop(StopReason.CANCELLED)
    ctx._request_stop(StopReason.LEASE_LOST)
    assert ctx.cancel_reason is StopReason.LEASE_LOST
    ctx._request_stop(StopReason.REVOKED)
    assert ctx.cancel_reason is StopReason.LEASE_LOST, "the first final reason stays"
    other = _context(clock, _lease(clock))
    other._request_stop(StopReason.REVOKED)
    other._request_stop(StopReason.LEASE_LOST)
    assert other.cancel_reason is StopReason.REVOKED


def test_a_sync_wait_ends_at_the_lease_deadline_without_the_event_loop() -> None:
    """The thread's wait wakes by itself when the lease lapses (real time, short lease)."""
    lease = RunLease(deadline=time.monotonic() + 0.3, margin_s=0.1, monotonic=time.monotonic)
    ctx = _context(FakeClock(), lease)
    started = time.monotonic()
    assert ctx.wait_cancelled_sync(10.0) is True
    waited = time.monotonic() - started
    assert 0.15 <= waited < 2.0, waited
    assert ctx.cancel_reason is StopReason.LEASE_LOST


def test_after_the_outcome_is_decided_nothing_of_the_attempt_may_write() -> None:
    clock = FakeClock()
    ctx = _context(clock, _lease(clock))
    ctx._end_attempt("the attempt timed out")
    with pytest.raises(LeaseLost, match="the attempt timed out"):
        ctx.check_lease()


# ---- the outcome table ---------------------------------------------------------------------


def test_a_lost_lease_is_never_settled_as_a_success() -> None:
    # A handler that swallowed the helpers' LeaseLost and returned a value must not be
    # recorded COMPLETED: its effect was refused.
    assert decide(StopReason.LEASE_LOST, value={"ok": True}) == LEASE_LOST
    assert decide(StopReason.LEASE_LOST, exc=RuntimeError("x")) == LEASE_LOST
    assert isinstance(LEASE_LOST, Abandoned) and LEASE_LOST.lease_lost
    assert decide(None, value=1) == Completed(b"1")


def test_a_lease_lost_before_the_handler_started_gives_the_task_back() -> None:
    released = outcome_before_start(StopReason.LEASE_LOST)
    assert isinstance(released, Released) and released.never_started
    assert released.checkpoint is None


# ---- through the testing helper --------------------------------------------------------------


async def test_an_async_handler_is_cancelled_when_its_lease_lapses() -> None:
    seen: list[Any] = []
    started = asyncio.Event()

    async def handler(ctx: TaskContext) -> str:
        started.set()
        try:
            await asyncio.Event().wait()  # works until stopped
        except asyncio.CancelledError:
            seen.append((ctx.cancel_reason, ctx.holds_lease))
            raise
        return "late"

    env = TaskEnvironment()
    run = asyncio.create_task(env.run(handler))
    await asyncio.wait_for(started.wait(), timeout=5)
    env.lose_lease()  # what the per-run lapse timer calls
    outcome = await asyncio.wait_for(run, timeout=5)
    assert outcome.status == "lease_lost"
    assert seen == [(StopReason.LEASE_LOST, False)]


async def test_a_sync_handler_that_ignores_the_stop_is_refused_its_write() -> None:
    """A thread cannot be stopped: the check before its write is what protects."""
    wrote: list[str] = []
    refused = threading.Event()
    started, proceed = threading.Event(), threading.Event()

    def handler(ctx: TaskContext) -> str:
        started.set()
        proceed.wait(10)  # ignores ctx.cancelled, as a blocking call would
        try:
            ctx.check_lease()
        except LeaseLost:
            refused.set()
            return "swallowed the refusal"
        wrote.append("effect")
        return "wrote"

    env = TaskEnvironment()
    run = asyncio.create_task(env.run(handler))
    assert await asyncio.to_thread(started.wait, 5)
    env.lose_lease()  # the lease lapses while the thread is blocked
    proceed.set()
    outcome = await asyncio.wait_for(run, timeout=10)
    assert outcome.status == "lease_lost" and outcome.result is None
    assert refused.is_set() and wrote == []


async def test_a_handler_within_its_lease_completes_and_may_write() -> None:
    async def handler(ctx: TaskContext) -> float | None:
        ctx.check_lease()
        return ctx.lease_remaining_s

    outcome = await TaskEnvironment(lease_s=60).run(handler)
    assert outcome.status == "completed" and 50 < outcome.result <= 60


async def test_lose_lease_before_the_start_releases_without_running() -> None:
    env = TaskEnvironment(due_at=datetime.now(UTC) + timedelta(seconds=30))
    env.lose_lease()
    ran: list[bool] = []

    async def handler(ctx: TaskContext) -> None:
        ran.append(True)

    outcome = await env.run(handler)
    assert outcome.status == "released" and ran == []


# ---- heartbeat replies are matched by number -------------------------------------------------


class _Host:
    worker_id = "w"


def _session_with_pending(*seqs: int) -> NodeSession:
    session = NodeSession(NodeInfo("n", "n:1"), _Host(), transport=None)  # type: ignore[arg-type]
    for seq in seqs:
        session._pending_heartbeats[seq] = f"sent-{seq}"
    return session


def test_a_reply_answers_the_heartbeat_with_its_number_and_forgets_older_ones() -> None:
    session = _session_with_pending(1, 2, 3)
    # Heartbeat 1 got no reply (the node could not commit it): the reply to 2 is 2's,
    # not 1's, so its runs are extended from 2's send, and 1 will never be answered.
    assert session._answered(HeartbeatReply((), seq=2)) == "sent-2"
    assert list(session._pending_heartbeats) == [3]
    assert session._answered(HeartbeatReply((), seq=9)) is None  # unknown: nothing to extend
    assert list(session._pending_heartbeats) == [3]
    # A node that does not number its replies answers every heartbeat, in order.
    assert session._answered(HeartbeatReply((), seq=0)) == "sent-3"
    assert session._answered(HeartbeatReply((), seq=0)) is None


def test_the_node_s_send_time_makes_the_initial_deadline_independent_of_the_worker_clock() -> None:
    """With the node's clock at the send (Assignment.sent_at), a worker clock far ahead
    cannot shorten the lease (it would fence every run before its first heartbeat)."""
    expires = T0 + timedelta(seconds=LEASE_S)
    sent = T0 + timedelta(seconds=0.2)
    far_ahead = T0 + timedelta(seconds=600)
    deadline = initial_deadline(
        received_at=50.0, lease_s=LEASE_S, lease_expires_at=expires, wall_now=far_ahead,
        sent_at=sent,
    )  # fmt: skip
    assert deadline == pytest.approx(50.0 + LEASE_S - 0.2)
