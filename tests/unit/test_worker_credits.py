"""Credit accounting and backoff of the worker SDK: pure, no I/O."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.worker._backoff import RECONNECT_MAX_S, backoff_s
from chronoshard.worker._credits import TURN_S, CreditLedger, Turns

# Wall-clock seconds for the plans that do not depend on whose turn it is.
NOW = 1_000_000.0


def opened(slots: int, nodes: list[str], **backlogs: int) -> CreditLedger:
    """A ledger of ``slots`` with ``nodes`` open (in order), then ``backlogs`` set."""
    ledger = CreditLedger(slots)
    for node in nodes:
        ledger.open(node)
    for node, ready in backlogs.items():
        ledger.set_backlog(node, ready)
    return ledger


def test_free_slots_are_spread_over_nodes_without_backlog() -> None:
    ledger = CreditLedger(10)
    ledger.open("a")
    ledger.open("b")
    assert ledger.plan(NOW) == ({"a": 5, "b": 5}, {})
    assert ledger.plan(NOW) == ({}, {})  # every slot is spoken for
    assert ledger.free == 0


def test_a_single_node_gets_every_free_slot() -> None:
    ledger = CreditLedger(7)
    ledger.open("a")
    assert ledger.plan(NOW) == ({"a": 7}, {})


def test_backlog_first_then_one_each_then_evenly() -> None:
    ledger = opened(8, ["a", "b", "c"], b=1, c=4)
    # Backlog 1 + 4, then one for a, then the last two evenly (fewest first, by name).
    assert ledger.desired() == {"a": 2, "b": 2, "c": 4}
    assert ledger.plan(NOW) == ({"a": 2, "b": 2, "c": 4}, {})


def test_when_slots_are_short_the_backlog_is_shared_fairly_and_idle_nodes_get_none() -> None:
    ledger = opened(5, ["a", "b", "c"], b=1, c=10)
    assert ledger.desired() == {"a": 0, "b": 1, "c": 4}
    ledger.set_backlog("a", 1000)
    assert ledger.desired() == {"a": 2, "b": 1, "c": 2}


def test_a_new_node_gets_credits_recalled_from_an_idle_one() -> None:
    ledger = CreditLedger(2)
    ledger.open("a")
    assert ledger.plan(NOW) == ({"a": 2}, {})
    ledger.open("b")
    # No free slot: a holds one more than its share, so one is asked back.
    assert ledger.plan(NOW) == ({}, {"a": 1})
    assert ledger.plan(NOW) == ({}, {})  # already asked
    assert ledger.free == 0  # a recalled credit is not free until a answers
    ledger.returned("a", 1)
    assert ledger.plan(NOW) == ({"b": 1}, {})


def test_a_recall_answered_with_fewer_credits_frees_only_those() -> None:
    ledger = CreditLedger(2)
    ledger.open("a")
    ledger.plan(NOW)
    ledger.open("b")
    assert ledger.plan(NOW) == ({}, {"a": 1})
    # a had already used both credits before the recall reached it.
    assert ledger.consume("a") and ledger.try_occupy()
    assert ledger.consume("a") and ledger.try_occupy()
    ledger.returned("a", 0)
    assert ledger.free == 0 and ledger.plan(NOW) == ({}, {})
    ledger.release_slot()
    grants, recalls = ledger.plan(NOW)
    assert sum(grants.values()) == 1 and recalls == {} and ledger.free == 0


def test_an_answered_recall_is_closed_whatever_came_back() -> None:
    """Issue 12 items 7, 8, 11: a recall answered with fewer credits than asked (the node
    had used some) used to stay "being recalled" for the difference, forever, and the
    node's credits were never asked back again while another node's tasks waited."""
    ledger = opened(10, ["a", "b"], a=100)
    # All slots to the backlog while it exceeds them: none for the idle node.
    assert ledger.plan(NOW) == ({"a": 10}, {})
    ledger.set_backlog("a", 0)
    ledger.set_backlog("b", 100)
    assert ledger.plan(NOW) == ({}, {"a": 10})
    # a used 7 of them before the recall reached it: 3 come back.
    for _ in range(7):
        assert ledger.consume("a") and ledger.try_occupy()
    ledger.returned("a", 3)
    assert ledger.recalling_for("a") == 0
    assert ledger.plan(NOW) == ({"b": 3}, {})
    # The 7 runs end; a holds nothing now, b gets the slots.
    for _ in range(7):
        ledger.release_slot()
    assert ledger.plan(NOW) == ({"b": 7}, {})
    assert ledger.outstanding_for("b") == 10


def test_recalls_already_on_their_way_are_not_repeated() -> None:
    ledger = opened(4, ["a", "b"], a=4)
    assert ledger.plan(NOW) == ({"a": 4}, {})
    ledger.set_backlog("a", 0)
    ledger.set_backlog("b", 3)
    assert ledger.plan(NOW) == ({}, {"a": 3})
    ledger.set_backlog("b", 4)  # one more: one more recall, not four
    assert ledger.plan(NOW) == ({}, {"a": 1})
    ledger.returned("a", 3)
    ledger.returned("a", 1)
    assert ledger.plan(NOW) == ({"b": 4}, {})


def test_assignment_moves_a_credit_to_a_slot_and_a_freed_slot_is_granted_again() -> None:
    ledger = CreditLedger(2)
    ledger.open("a")
    ledger.set_backlog("a", 5)
    assert ledger.plan(NOW) == ({"a": 2}, {})
    assert ledger.consume("a") and ledger.try_occupy()
    assert (ledger.occupied, ledger.outstanding) == (1, 1)
    assert ledger.plan(NOW) == ({}, {})  # no free slot to grant
    ledger.release_slot()
    assert ledger.plan(NOW) == ({"a": 1}, {})


def test_assignment_without_credit_is_refused_when_slots_are_spoken_for() -> None:
    ledger = CreditLedger(1)
    ledger.open("a")
    ledger.open("b")
    assert ledger.plan(NOW) == ({"a": 1}, {})
    assert not ledger.consume("b")
    assert ledger.unexpected_assignments == 1
    assert not ledger.try_occupy()  # a's credit still holds the only slot
    assert ledger.consume("a") and ledger.try_occupy()


def test_a_draining_node_gets_no_more_and_its_credits_are_recalled() -> None:
    ledger = CreditLedger(4)
    ledger.open("a")
    ledger.open("b")
    assert ledger.plan(NOW) == ({"a": 2, "b": 2}, {})
    ledger.stop_node("a")
    # b should hold all four now: a's two are asked back, nothing is free meanwhile.
    assert ledger.plan(NOW) == ({}, {"a": 2})
    assert ledger.outstanding_for("a") == 2
    ledger.returned("a", 2)
    assert ledger.plan(NOW) == ({"b": 2}, {})


def test_a_resumed_node_gets_credits_again() -> None:
    ledger = CreditLedger(4)
    ledger.open("a")
    ledger.open("b")
    ledger.plan(NOW)
    ledger.stop_node("a")
    ledger.plan(NOW)
    ledger.returned("a", 2)
    assert ledger.plan(NOW) == ({"b": 2}, {})
    ledger.resume_node("a")
    # No free slot: b gives one back for a's one credit.
    assert ledger.plan(NOW) == ({}, {"b": 1})
    ledger.returned("b", 1)
    assert ledger.plan(NOW) == ({"a": 1}, {})


def test_worker_drain_withdraws_everything_and_refuses_assignments() -> None:
    ledger = CreditLedger(3)
    ledger.open("a")
    ledger.set_backlog("a", 3)
    ledger.plan(NOW)
    ledger.stop_granting()
    assert ledger.outstanding == 0
    assert ledger.plan(NOW) == ({}, {})
    ledger.consume("a")
    assert not ledger.try_occupy()


def test_release_without_a_slot_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        CreditLedger(1).release_slot()


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.sampled_from("abc")),
        st.tuples(st.just("close"), st.sampled_from("abc")),
        st.tuples(st.just("drain_node"), st.sampled_from("abc")),
        st.tuples(st.just("backlog"), st.sampled_from("abc"), st.integers(0, 12)),
        st.tuples(st.just("assign"), st.sampled_from("abc")),
        st.tuples(st.just("finish")),
        st.tuples(st.just("plan")),
        st.tuples(st.just("answer_recalls"), st.sampled_from("abc")),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(slots=st.integers(1, 8), ops=_ops)
def test_running_plus_outstanding_never_exceeds_slots(slots: int, ops: list[tuple]) -> None:
    ledger = CreditLedger(slots)
    # The scheduler side: a node sends an assignment only against a credit it holds.
    held: dict[str, int] = {}
    asked: dict[str, list[int]] = {}
    for op in ops:
        match op:
            case ("open", node):
                # A Welcome starts a new session: what the node held or was asked under
                # an earlier one is gone with it (its answers never come).
                ledger.open(node)
                held[node] = 0
                asked.pop(node, None)
            case ("close", node):
                ledger.close(node)
                held.pop(node, None)
                asked.pop(node, None)
            case ("drain_node", node):
                ledger.stop_node(node)
            case ("backlog", node, ready):
                ledger.set_backlog(node, ready)
            case ("assign", node) if held.get(node, 0) > 0:
                held[node] -= 1
                assert ledger.consume(node)
                # An assignment sent against a credit always finds a free slot.
                assert ledger.try_occupy()
            case ("finish",) if ledger.occupied:
                ledger.release_slot()
            case ("plan",):
                grants, recalls = ledger.plan(NOW)
                for node, n in grants.items():
                    assert n > 0
                    held[node] += n
                for node, n in recalls.items():
                    assert n > 0
                    asked.setdefault(node, []).append(n)
            case ("answer_recalls", node) if node in held and asked.get(node):
                # The node answers its oldest recall: it drops what it still holds of
                # what was asked, exactly.
                give = min(held[node], asked[node].pop(0))
                held[node] -= give
                ledger.returned(node, give)
                assert ledger.recalling_for(node) == sum(asked[node])
        assert 0 <= ledger.occupied + ledger.outstanding <= slots
        assert ledger.outstanding == sum(held.values())


@given(failures=st.integers(1, 200), unit=st.floats(0, 1, exclude_max=True))
def test_backoff_is_jittered_within_half_to_full_base_and_capped(
    failures: int, unit: float
) -> None:
    delay = backoff_s(failures, unit)
    base = min(RECONNECT_MAX_S, 0.1 * 2 ** min(failures - 1, 64))
    assert base / 2 <= delay <= base
    assert delay <= RECONNECT_MAX_S


def test_backoff_doubles_from_a_tenth_of_a_second() -> None:
    assert [backoff_s(n, 0.999999) for n in (1, 2, 3)] == pytest.approx([0.1, 0.2, 0.4], 1e-4)
    assert backoff_s(30, 0.0) == RECONNECT_MAX_S / 2
    with pytest.raises(ValueError):
        backoff_s(0, 0.5)


def _run_one_task(ledger: CreditLedger, node: str, now: float = NOW) -> dict[str, int]:
    """``node`` sends one Assignment, its run ends at once; what the plan at ``now``
    grants."""
    assert ledger.consume(node)
    assert ledger.try_occupy()
    ledger.release_slot()
    grants, recalls = ledger.plan(now)
    assert recalls == {}
    return grants


def test_backlogged_nodes_take_turns_by_the_clock() -> None:
    """Issue 14: freed slots go to one node with backlog at a time, so its rounds carry
    what a lone node's would; spread one by one, three nodes paid every per-round cost
    three times as often. Whose turn it is changes every TURN_S; in each cycle of three
    turns every node has one."""
    nodes = ["a", "b", "c"]
    ledger = opened(4, nodes, a=1000, b=1000, c=1000)
    start = 3 * TURN_S * 1000  # the start of a cycle
    first = ledger.turns.order(nodes, start)[0]
    assert ledger.plan(start) == ({first: 4}, {})  # its turn: every free slot
    holder = [first] * 4
    granted_in_turn: list[set[str]] = [set() for _ in range(3)]
    for step in range(12):
        turn = step // 4  # four runs end in each turn
        now = start + turn * TURN_S + (step % 4 + 0.5) * TURN_S / 4
        grants = _run_one_task(ledger, holder.pop(0), now)
        (node, credits), *rest = grants.items()
        assert credits == 1 and not rest
        granted_in_turn[turn].add(node)
        holder.append(node)
    assert all(len(granted) == 1 for granted in granted_in_turn)
    owners = [next(iter(granted)) for granted in granted_in_turn]
    assert sorted(owners) == nodes and owners[0] == first


def test_every_worker_gives_its_free_slots_to_the_same_node_at_once() -> None:
    """Two workers (two ledgers) with the same nodes grant to the same one at the same
    time, whatever each granted before: the node's round carries both workers' slots."""
    nodes = ["n1", "n2", "n3"]
    workers = [opened(2, nodes, **dict.fromkeys(nodes, 1000)) for _ in range(2)]
    workers[1].plan(NOW - 7.3 * TURN_S)  # the second started earlier
    for step in range(40):
        now = NOW + step * TURN_S / 2
        chosen = set()
        for ledger in workers:
            for name in nodes:  # every credit used at once, every run ended
                for _ in range(ledger.outstanding_for(name)):
                    assert ledger.consume(name)
                    assert ledger.try_occupy()
            for _ in range(ledger.occupied):
                ledger.release_slot()
            grants, _ = ledger.plan(now)
            assert len(grants) == 1
            chosen |= set(grants)
        assert len(chosen) == 1


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.sets(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=6),
    cycle=st.integers(-(10**6), 10**9),
    turn_s=st.sampled_from([0.01, TURN_S, 0.3]),
)
def test_every_node_with_backlog_has_one_turn_in_every_cycle(
    nodes: set[str], cycle: int, turn_s: float
) -> None:
    turns = Turns(turn_s)
    n = len(nodes)
    orders = [turns.order(nodes, (cycle * n + position + 0.5) * turn_s) for position in range(n)]
    for position, order in enumerate(orders):
        assert sorted(order) == sorted(nodes)  # every node, once
        # After the node whose turn it is: the cycle's turns that follow, then the others.
        assert order == orders[0][position:] + orders[0][:position]
    # The order comes from the cycle and the names alone: another worker agrees.
    assert (
        Turns(turn_s).order(sorted(nodes, reverse=True), (cycle * n + 0.5) * turn_s) == (orders[0])
    )


def test_runs_lasting_a_cycle_do_not_keep_their_slots_on_one_node() -> None:
    """If the order of the turns were the same every cycle, a run lasting exactly one
    cycle would end in its node's turn again, and a node that took every slot first would
    keep them all: the order is drawn afresh for each cycle."""
    nodes = ["a", "b"]
    ledger = opened(10, nodes, a=10**9, b=10**9)
    cycle_s = len(nodes) * TURN_S
    start = 1000 * cycle_s + TURN_S / 2
    first = ledger.turns.order(nodes, start)[0]
    assert ledger.plan(start) == ({first: 10}, {})
    running = [(start + cycle_s, first)] * 10  # (ends at, node)
    granted = dict.fromkeys(nodes, 0)
    for _ in range(2000):
        running.sort()
        ends_at, node = running.pop(0)
        grants = _run_one_task(ledger, node, ends_at)
        (taker, credits), *rest = grants.items()
        assert credits == 1 and not rest
        granted[taker] += 1
        running.append((ends_at + cycle_s, taker))
    assert min(granted.values()) > 0.4 * sum(granted.values())


def test_a_turn_ends_early_once_the_nodes_backlog_is_covered() -> None:
    ledger = opened(6, ["a", "b"], a=2, b=1000)
    a_turn = next(
        t for t in (NOW + k * TURN_S for k in range(10)) if ledger.turns.order("ab", t)[0] == "a"
    )
    # It is a's turn, but a can use two: the rest of the free slots go on to b.
    assert ledger.plan(a_turn) == ({"a": 2, "b": 4}, {})


def test_when_the_slots_cover_every_backlog_the_turn_changes_nothing() -> None:
    ledger = opened(10, ["a", "b", "idle"], a=3, b=3)
    # Each its backlog, the idle node its one, the rest evenly: as without turns.
    assert ledger.plan(NOW) == ({"a": 4, "b": 3, "idle": 3}, {})


@pytest.mark.parametrize("nodes", [2, 3, 5])
def test_over_the_cycles_every_backlogged_node_gets_an_equal_share(nodes: int) -> None:
    """Turns share time, not a count: when runs end independently of the turns (here at
    random, a fixed seed, ~8 per turn), every node that always has backlog gets an equal
    share of the credits over the cycles (within 10 % of it over 400 cycles), and no slot
    stays free."""
    names = [f"n{i}" for i in range(nodes)]
    slots = 10
    ledger = opened(slots, names, **dict.fromkeys(names, 10**9))
    granted = dict.fromkeys(names, 0)
    running: list[str] = []
    rng = random.Random(nodes)
    now = NOW

    def grant() -> None:
        grants, recalls = ledger.plan(now)
        assert recalls == {}  # every node has work: nothing is moved back
        for name, credits in grants.items():
            granted[name] += credits
            for _ in range(credits):  # each node uses its credits at once
                assert ledger.consume(name)
                assert ledger.try_occupy()
                running.append(name)
        assert ledger.free == 0

    grant()
    end = NOW + 400 * nodes * TURN_S
    while now < end:
        now += rng.expovariate(8 / TURN_S)
        running.pop(rng.randrange(len(running)))
        ledger.release_slot()
        grant()
    total = sum(granted.values())
    for name in names:
        assert abs(granted[name] - total / nodes) < 0.1 * total / nodes, granted
