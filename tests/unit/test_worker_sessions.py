"""The node's worker sessions (``dispatch/sessions.py``): credits counted per session
(capped at slots, recalled exactly, withdrawn by DrainStarted), the node's drain, what
the reconciler is told about attempts, and the bounded outbox. In memory: a fake clock
and a recording listener, no stream and no database."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from fixtures.timers import timer_task
from hypothesis import given
from hypothesis import strategies as st

from chronoshard.clock import FakeClock
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.dispatch.sessions import (
    OUTBOX_PER_SLOT,
    SessionRegistry,
    WorkerSession,
)
from chronoshard.v1 import worker_service_pb2

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Listener:
    def __init__(self) -> None:
        self.woken = 0
        self.ended: list[TimerTask] = []
        self.left: list[TimerTask] = []

    def credits_available(self) -> None:
        self.woken += 1

    def task_ended(self, task: TimerTask) -> None:
        self.ended.append(task)

    def task_left(self, task: TimerTask) -> None:
        self.left.append(task)


def _registry(
    send_queue: int = 64,
) -> tuple[SessionRegistry, Listener, FakeClock]:
    clock = FakeClock(AT)
    registry = SessionRegistry("node-a", clock, send_queue=send_queue)
    listener = Listener()
    registry.set_listener(listener)
    return registry, listener, clock


def _open(registry: SessionRegistry, worker_id: str = "w1", slots: int = 4) -> WorkerSession:
    return registry.open(
        worker_id,
        queues=frozenset({"default"}),
        types=frozenset({"t"}),
        slots=slots,
        accepts_batches=True,
    )


def _hold(session: WorkerSession, token: int = 1) -> TimerTask:
    """What send_assignment records once the assignment is queued."""
    timer = timer_task()
    session.assigned[timer.id] = (timer, token)
    return timer


def _drained(session: WorkerSession) -> list[worker_service_pb2.SchedulerMessage]:
    out = []
    while not session.outbox.empty():
        out.append(session.outbox.get_nowait())
    return out


def _kinds(messages: list[worker_service_pb2.SchedulerMessage]) -> list[str | None]:
    return [m.WhichOneof("message") for m in messages]


# ---- credits ------------------------------------------------------------------------------


@given(
    slots=st.integers(1, 50),
    steps=st.lists(
        st.tuples(st.sampled_from(["grant", "recall", "spend"]), st.integers(0, 80)),
        max_size=40,
    ),
)
def test_credits_never_exceed_slots_and_a_recall_returns_exactly_what_is_unused(
    slots: int, steps: list[tuple[str, int]]
) -> None:
    session = WorkerSession("s", "w", frozenset(), frozenset({"t"}), slots, asyncio.Queue())
    for step, n in steps:
        before = session.credits
        if step == "grant":
            assert session.grant(n)
            assert session.credits == min(slots, before + n)
        elif step == "recall":
            returned = session.recall(n)
            assert returned == min(before, n)
            assert session.credits == before - returned
        elif before > 0:  # a dispatch round spends one (core/rounds.py)
            session.credits -= 1
        assert 0 <= session.credits <= slots


def test_drain_started_withdraws_every_credit_and_later_grants_are_ignored() -> None:
    registry, listener, _ = _registry()
    session = _open(registry, slots=8)
    registry.credits_granted(session, 5)
    assert (session.credits, listener.woken) == (5, 1)
    assert registry.with_credit() == [session]

    session.worker_draining()
    registry.credits_granted(session, 3)

    assert session.credits == 0
    assert listener.woken == 1  # the dispatcher is not woken for a grant not counted
    assert registry.with_credit() == []


def test_a_recall_is_answered_with_one_credit_return_of_what_was_unused() -> None:
    registry, _, _ = _registry()
    session = _open(registry)
    _drained(session)
    registry.credits_granted(session, 3)
    session.credits -= 2  # two assignments went out

    registry.credits_recalled(session, 3)

    (answer,) = _drained(session)
    assert answer.credit_return.credits == 1
    assert session.credits == 0
    assert registry.credits_held() == 0


# ---- the node's drain ---------------------------------------------------------------------


def test_a_drained_node_sends_nothing_but_keeps_the_credits_until_recalled() -> None:
    registry, _, _ = _registry()
    a, b = _open(registry, "a"), _open(registry, "b")
    registry.credits_granted(a, 2)
    registry.credits_granted(b, 3)

    registry.drain_all("operator drain")

    assert registry.draining
    assert registry.with_credit() == []
    assert registry.credits_held() == 5
    for session in (a, b):
        (drain,) = _drained(session)
        assert drain.drain.reason == "operator drain"
        assert not drain.drain.shutting_down

    registry.resume()

    assert not registry.draining
    assert {s.worker_id for s in registry.with_credit()} == {"a", "b"}
    assert [_kinds(_drained(s)) for s in (a, b)] == [["resume"], ["resume"]]


def test_a_drain_is_told_once_and_again_only_when_it_becomes_a_shutdown() -> None:
    registry, _, _ = _registry()
    session = _open(registry)
    _drained(session)

    registry.drain_all("drain")
    registry.drain_all("drain again")
    registry.drain_all("stopping", shutting_down=True)
    registry.drain_all("stopping twice", shutting_down=True)
    registry.drain_all("a plain drain after the shutdown", shutting_down=False)

    told = _drained(session)
    assert [(m.drain.reason, m.drain.shutting_down) for m in told] == [
        ("drain", False),
        ("stopping", True),
    ]
    # A worker connecting now hears the latest drain (Connect sends this after Welcome).
    assert registry.drain_message().drain.reason == "stopping"
    assert registry.drain_message().drain.shutting_down


# ---- sessions and the attempts they hold --------------------------------------------------


def test_a_reconnect_replaces_the_old_session_and_lets_go_of_what_it_held() -> None:
    changes: list[int] = []
    registry, listener, _ = _registry()
    registry.on_sessions_changed = lambda: changes.append(len(registry.live()))
    old = _open(registry, "w1")
    held = _hold(old)

    new = _open(registry, "w1")

    assert old.closed and not new.closed
    assert new.session_id != old.session_id
    assert new.session_id.startswith("node-a/")
    assert registry.live() == [new]
    assert registry.worker_ids() == {"w1"}
    # Let go of, not ended: the worker may still be running it (it still counts for
    # its tenant's concurrency until it settles).
    assert listener.left == [held] and listener.ended == []
    assert old.assigned == {}
    # The old stream's own close, when it ends later, leaves the new session alone.
    registry.close(old)
    assert registry.live() == [new]
    assert changes == [1, 0, 1, 1]


def test_settled_and_superseded_attempts_end_once_and_only_for_their_token() -> None:
    registry, listener, _ = _registry()
    session = _open(registry)
    done, stale, other = _hold(session, 3), _hold(session, 4), _hold(session, 5)

    registry.settled(session, done.id)
    registry.settled(session, done.id)  # a repeated settlement (idempotent)
    registry.attempt_superseded(stale.id, 99)  # not the token this session holds
    registry.attempt_superseded(stale.id, 4)

    assert listener.ended == [done, stale]
    assert set(session.assigned) == {other.id}


def test_the_reconciler_hears_only_from_a_session_old_enough_to_vouch() -> None:
    registry, _, clock = _registry()
    session = _open(registry, "w1")
    timer = _hold(session, token=7)

    assert registry.knows("nobody", timer.id, 7) is None
    assert registry.knows("w1", timer.id, 7, min_age_s=10) is None  # just connected
    clock.advance(10)
    assert registry.knows("w1", timer.id, 7, min_age_s=10) is True
    assert registry.knows("w1", timer.id, 8, min_age_s=10) is False
    assert registry.knows("w1", uuid.uuid4(), 7, min_age_s=10) is False
    registry.close(session)
    assert registry.knows("w1", timer.id, 7) is None


def test_cancel_goes_to_the_session_holding_the_task_with_its_token() -> None:
    registry, _, _ = _registry()
    a, b = _open(registry, "a"), _open(registry, "b")
    _drained(a)
    _drained(b)
    timer = _hold(b, token=12)

    assert registry.send_cancel(timer.id, "cancelled by the operator")
    assert not registry.send_cancel(uuid.uuid4(), "nobody holds it")

    assert _drained(a) == []
    (cancel,) = _drained(b)
    assert cancel.cancel.task.id == str(timer.id)
    assert (cancel.cancel.fencing_token, cancel.cancel.reason) == (12, "cancelled by the operator")


def test_a_backlog_report_goes_out_only_when_it_changed() -> None:
    registry, _, _ = _registry()
    session = _open(registry)
    _drained(session)

    for ready in (0, 0, 5, 5, 0):
        registry.send_backlog(session, ready)

    assert [m.backlog.ready for m in _drained(session)] == [0, 5, 0]


@pytest.mark.parametrize("slots", [1, 100])
def test_a_full_outbox_drops_the_session_instead_of_waiting(slots: int) -> None:
    registry, _, _ = _registry(send_queue=8)
    session = _open(registry, slots=slots)
    capacity = max(8, OUTBOX_PER_SLOT * slots)
    assert session.outbox.maxsize == capacity

    sent = [registry.send_cancel(_hold(session).id, "x") for _ in range(capacity + 1)]

    assert sent == [True] * capacity + [False]
    assert session.closed
    assert registry.with_credit() == []
    assert not session.send(worker_service_pb2.SchedulerMessage())
