"""The dispatch round's policy (``core/rounds.py``): credits are spent and returned
exactly, tenants' in-flight counts follow the choices, and what the transaction did not
write is chosen again only when it was read back as unwritten."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoshard.scheduler.core import rounds
from chronoshard.scheduler.core.fairness import ReadyQueues, ReadyTask, TenantLimits, WorkerOffer
from chronoshard.scheduler.core.models import Priority
from chronoshard.scheduler.core.timing_wheel import TimingWheel

NOW = 1000.0


@dataclass
class Session:
    name: str
    credits: int
    queues: frozenset[str] = frozenset({"default"})

    @property
    def offer(self) -> WorkerOffer:
        return WorkerOffer(queues=self.queues, types=frozenset({"t"}), session_id=self.name)


def _task(tenant: uuid.UUID, n: int, queue: str = "default") -> ReadyTask:
    return ReadyTask(
        id=uuid.uuid4(),
        tenant_id=tenant,
        priority=Priority.STANDARD,
        queue=queue,
        type="t",
        due_at_wall=float(n),
    )


@dataclass(frozen=True)
class Row:
    """What the intents' transaction returned, as far as the round reads it."""

    id: uuid.UUID


def _row(task: ReadyTask) -> Row:
    return Row(task.id)


def _queues(tasks: list[ReadyTask], **kw: object) -> ReadyQueues:
    ready = ReadyQueues(capacity=1000, **kw)  # type: ignore[arg-type]
    for task in tasks:
        ready.push(task, NOW)
    return ready


def _in_flight(ready: ReadyQueues) -> int:
    return ready.get_stats()["in_flight_standard"]


def test_each_task_goes_to_the_session_holding_most_credits() -> None:
    tenant = uuid.uuid4()
    ready = _queues([_task(tenant, n) for n in range(12)])
    a, b = Session("a", 2), Session("b", 10)

    chosen = rounds.choose([a, b], ready, batch_max=100, now=NOW)

    # b alone until it is down to a's two; then they take turns, a first (never chosen).
    assert [s.name for s, _ in chosen] == ["b"] * 8 + ["a", "b", "a", "b"]
    assert (a.credits, b.credits) == (0, 0)
    assert len(ready) == 0 and _in_flight(ready) == 12


def test_equal_credits_take_turns_across_rounds() -> None:
    # The issue 14 trickle: one task per round, every credit back before the next round.
    # In the registry's order the first session took all of them.
    tenant = uuid.uuid4()
    a, b, c = Session("a", 10), Session("b", 10), Session("c", 10)
    spread = rounds.Spread()
    names = []
    for n in range(7):
        ready = _queues([_task(tenant, n)])
        ((session, _),) = spread.choose([a, b, c], ready, batch_max=100, now=NOW)
        names.append(session.name)
        session.credits += 1  # the worker granted it again before the next round
    assert names == ["a", "b", "c", "a", "b", "c", "a"]


def test_a_session_offered_nothing_does_not_hold_up_the_others() -> None:
    tenant = uuid.uuid4()
    ready = _queues([_task(tenant, n) for n in range(3)])
    other, default = Session("other", 10, frozenset({"other"})), Session("default", 2)

    chosen = rounds.choose([other, default], ready, batch_max=100, now=NOW)

    assert [s.name for s, _ in chosen] == ["default", "default"]
    assert (other.credits, default.credits) == (10, 0) and len(ready) == 1


def test_choose_stops_at_the_batch_size() -> None:
    tenant = uuid.uuid4()
    ready = _queues([_task(tenant, n) for n in range(10)])
    session = Session("a", 10)

    chosen = rounds.choose([session], ready, batch_max=3, now=NOW)

    assert len(chosen) == 3 and session.credits == 7 and len(ready) == 7


def test_a_choice_counts_against_the_tenants_limit_before_the_commit() -> None:
    # Counted at choice time: one round cannot take a tenant past its concurrency limit.
    tenant = uuid.uuid4()
    limits = TenantLimits(max_concurrent=2)
    ready = _queues([_task(tenant, n) for n in range(5)], tenant_limits=lambda _t: limits)
    session = Session("a", 5)

    chosen = rounds.choose([session], ready, batch_max=100, now=NOW)

    assert len(chosen) == 2 and session.credits == 3


def test_a_session_is_offered_only_what_it_serves() -> None:
    tenant = uuid.uuid4()
    ready = _queues([_task(tenant, 0, queue="other"), _task(tenant, 1)])
    session = Session("a", 5)

    chosen = rounds.choose([session], ready, batch_max=100, now=NOW)

    assert [t.queue for _, t in chosen] == ["default"] and len(ready) == 1


def test_put_back_undoes_every_choice() -> None:
    tenant = uuid.uuid4()
    tasks = [_task(tenant, n) for n in range(4)]
    ready = _queues(tasks)
    session = Session("a", 3)
    chosen = rounds.choose([session], ready, batch_max=100, now=NOW)

    rounds.put_back(chosen, ready, NOW)

    assert session.credits == 3 and len(ready) == 4 and _in_flight(ready) == 0
    again = rounds.choose([session], ready, batch_max=100, now=NOW)
    assert [t.id for _, t in again] == [t.id for _, t in chosen]


def test_what_was_written_is_sent_and_the_rest_given_back() -> None:
    tenant = uuid.uuid4()
    tasks = [_task(tenant, n) for n in range(4)]
    ready = _queues(tasks)
    session = Session("a", 4)
    chosen = rounds.choose([session], ready, batch_max=100, now=NOW)
    written, cancelled, unwritten = chosen[0][1], chosen[1][1], chosen[2][1]
    also_written = chosen[3][1]

    matched = rounds.match_written(chosen, [_row(also_written), _row(written)])
    dropped = rounds.give_back(matched.leftover, {unwritten.id}, ready, NOW)

    assert [(s.name, row.id, t.id) for s, row, t in matched.to_send] == [
        ("a", also_written.id, also_written.id),
        ("a", written.id, written.id),
    ]
    assert {t.id for _, t in matched.leftover} == {cancelled.id, unwritten.id}
    assert dropped == 1  # the cancelled one: its row moved on
    assert session.credits == 2  # the two leftovers' credits came back
    assert unwritten.id in ready and cancelled.id not in ready
    assert _in_flight(ready) == 2  # only the two sent are running


@given(
    credits=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    waiting=st.integers(0, 20),
    batch_max=st.integers(1, 30),
    written_mask=st.lists(st.booleans(), min_size=30, max_size=30),
    unwritten_mask=st.lists(st.booleans(), min_size=30, max_size=30),
)
def test_credits_and_tasks_are_conserved_through_a_round(
    credits: list[int],
    waiting: int,
    batch_max: int,
    written_mask: list[bool],
    unwritten_mask: list[bool],
) -> None:
    tenants = [uuid.uuid4() for _ in range(3)]
    ready = _queues([_task(tenants[n % 3], n) for n in range(waiting)])
    sessions = [Session(str(i), c) for i, c in enumerate(credits)]

    chosen = rounds.choose(sessions, ready, batch_max, NOW)

    assert len(chosen) == min(sum(credits), waiting, batch_max)
    assert sum(s.credits for s in sessions) == sum(credits) - len(chosen)
    assert len(ready) + len(chosen) == waiting
    assert len({t.id for _, t in chosen}) == len(chosen)

    rows = [_row(t) for (_, t), keep in zip(chosen, written_mask, strict=False) if keep]
    matched = rounds.match_written(chosen, rows)
    unwritten = {
        t.id for (_, t), mark in zip(matched.leftover, unwritten_mask, strict=False) if mark
    }
    dropped = rounds.give_back(matched.leftover, unwritten, ready, NOW)

    assert len(matched.to_send) == len(rows)
    assert sum(s.credits for s in sessions) == sum(credits) - len(rows)
    assert dropped == len(matched.leftover) - len(unwritten)
    assert len(ready) == waiting - len(chosen) + len(unwritten)
    assert _in_flight(ready) == len(rows)


@given(
    credits=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    waiting=st.integers(0, 60),
    batch_max=st.integers(1, 80),
)
def test_no_session_with_more_credits_is_passed_over(
    credits: list[int], waiting: int, batch_max: int
) -> None:
    # Every session serves every task: each choice went to a session holding the most
    # credits then, so one that took a task ends at most one below any other.
    tenant = uuid.uuid4()
    ready = _queues([_task(tenant, n) for n in range(waiting)])
    sessions = [Session(str(i), c) for i, c in enumerate(credits)]

    chosen = rounds.choose(sessions, ready, batch_max, NOW)

    assert len(chosen) == min(sum(credits), waiting, batch_max)
    took = {s.name for s, _ in chosen}
    for taker in sessions:
        if taker.name in took:
            assert all(other.credits <= taker.credits + 1 for other in sessions)
    got = {s.name: 0 for s in sessions}
    for s, _ in chosen:
        got[s.name] += 1
    assert all(got[s.name] <= c for s, c in zip(sessions, credits, strict=True))


@given(
    sessions_n=st.integers(1, 6),
    slots=st.integers(1, 10),
    per_round=st.lists(st.integers(0, 60), min_size=1, max_size=25),
)
def test_workers_with_equal_credits_share_tasks_within_one(
    sessions_n: int, slots: int, per_round: list[int]
) -> None:
    # Each round every session holds all its credits again (its worker's runs ended and
    # were granted back): over any number of rounds of any size, no session ran more
    # than one task more than another.
    tenant = uuid.uuid4()
    sessions = [Session(str(i), slots) for i in range(sessions_n)]
    spread = rounds.Spread()
    got = dict.fromkeys((s.name for s in sessions), 0)
    for r, waiting in enumerate(per_round):
        ready = _queues([_task(tenant, r * 100 + n) for n in range(waiting)])
        for s in sessions:
            s.credits = slots
        for s, _ in spread.choose(sessions, ready, batch_max=1000, now=NOW):
            got[s.name] += 1
    assert max(got.values()) - min(got.values()) <= 1
    assert sum(got.values()) == sum(min(w, sessions_n * slots) for w in per_round)


# --- Gathering: when the wheel's timers fire -------------------------------------------

EPSILON = 1e-9


def _drive(
    deadlines: list[float], window_s: float, other_wakes: list[float]
) -> tuple[dict[int, float], list[float]]:
    """The dispatcher's loop over a real wheel: at each wake-up, advance the wheel to the
    gathering's horizon, then sleep until the gathering's wake time or another wake-up
    (credits, a new round), whichever is first. When each timer fired, and the times at
    which any fired."""
    wheel: TimingWheel[int, int] = TimingWheel(0.0, tick_s=0.01, slots=8)
    for key, deadline in enumerate(deadlines):
        wheel.add(key, deadline, key)
    gathering = rounds.Gathering(window_s)
    fired_at: dict[int, float] = {}
    firings: list[float] = []
    now = 0.0
    pending_wakes = sorted(other_wakes)
    while len(fired_at) < len(deadlines):
        fired = wheel.advance(gathering.horizon(now))
        if fired:
            firings.append(now)
        for entry in fired:
            fired_at[entry.key] = now
        if len(fired_at) == len(deadlines):
            break
        candidates = [w for w in pending_wakes if w > now]
        wake = gathering.wake_at(wheel.next_deadline())
        if wake is not None:
            candidates.append(wake)
        now = max(now, min(candidates))
    return fired_at, firings


_times = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


@given(
    deadlines=st.lists(_times, min_size=1, max_size=60),
    window_s=st.sampled_from([0.0, 0.001, 0.02, 0.05, 0.3]),
    other_wakes=st.lists(_times, max_size=30),
)
def test_a_timer_fires_within_the_window_before_its_deadline(
    deadlines: list[float], window_s: float, other_wakes: list[float]
) -> None:
    fired_at, _ = _drive(deadlines, window_s, other_wakes)
    for key, deadline in enumerate(deadlines):
        assert deadline - window_s - EPSILON <= fired_at[key] <= deadline + EPSILON


@given(
    deadlines=st.lists(_times, min_size=1, max_size=60),
    window_s=st.sampled_from([0.001, 0.02, 0.05, 0.3]),
    other_wakes=st.lists(_times, max_size=30),
)
def test_timers_fire_at_most_once_per_window(
    deadlines: list[float], window_s: float, other_wakes: list[float]
) -> None:
    # However the deadlines spread and whatever else wakes the loop: at most one round
    # a window starts from the wheel.
    _, firings = _drive(deadlines, window_s, other_wakes)
    assert all(b - a >= window_s - EPSILON for a, b in itertools.pairwise(firings))


@given(
    deadlines=st.lists(_times, min_size=1, max_size=60),
    other_wakes=st.lists(_times, max_size=30),
)
def test_without_a_window_each_timer_fires_at_its_deadline(
    deadlines: list[float], other_wakes: list[float]
) -> None:
    fired_at, _ = _drive(deadlines, 0.0, other_wakes)
    assert [fired_at[key] for key in range(len(deadlines))] == deadlines


def test_a_steady_trickle_is_gathered_into_rounds() -> None:
    # 200 timers 5 ms apart (a steady 200/s): one firing per 20 ms window, four timers
    # each (the first window opens 20 ms before the first deadline and holds it alone).
    deadlines = [1.0 + i * 0.005 for i in range(200)]
    _, firings = _drive(deadlines, 0.02, [])
    assert len(firings) == 51
    _, alone = _drive(deadlines, 0.0, [])
    assert len(alone) == 200


def test_a_timer_added_inside_the_window_fires_at_once() -> None:
    gathering = rounds.Gathering(0.02)
    assert gathering.horizon(10.0) == pytest.approx(10.02)
    # A wake-up 5 ms later (a new timer due in 10 ms): the same window, which holds it.
    assert gathering.horizon(10.005) == pytest.approx(10.02)
    # A timer already due fires whatever the window.
    assert gathering.horizon(10.03) >= 10.03
    with pytest.raises(ValueError, match="window_s"):
        rounds.Gathering(-0.01)
