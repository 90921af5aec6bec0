"""The credit protocol as a whole, simulated: workers' ledgers talking to model nodes.

Each model node behaves as ``scheduler/dispatch/sessions.py`` and
``scheduler/dispatch/dispatcher.py`` do: it sends an Assignment only against a credit it
holds, answers every CreditRecall with one CreditReturn of ``min(held, asked)``, reports
its backlog (ready tasks) whenever it changed, and after ``Drain`` dispatches nothing
more but keeps (and gives back on recall) the credits it holds. Messages travel in order
on each (worker, node) stream in each direction, but hypothesis picks which stream moves
next, when tasks become ready on which node and when running tasks end, so every
interleaving of the real system is a candidate. Two properties:

* **safety**, after every step: ``occupied + outstanding <= slots`` on every worker, and
  an Assignment sent against a credit always finds a free slot (none is refused);
* **liveness**, once every message is delivered: no slot idles while a node that still
  dispatches has ready work (every worker is full or no such node has work), the
  ledgers agree with the nodes on every credit, and a drained node holds none.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.worker._credits import CreditLedger

NOW = 1_000_000.0  # wall-clock seconds: one turn throughout (whose, does not matter here)

NODES = ("a", "b", "c")


@dataclass
class Stream:
    """One worker's session with one node: both directions, in order."""

    to_node: deque[tuple[str, int]] = field(default_factory=deque)
    to_worker: deque[tuple[str, int]] = field(default_factory=deque)
    credits: int = 0  # held by the node for this worker
    reported: int | None = None  # the last backlog the node sent on this stream


@dataclass
class Node:
    ready: int = 0
    draining: bool = False


class Model:
    def __init__(self, slots: list[int]) -> None:
        self.ledgers = [CreditLedger(n) for n in slots]
        self.nodes = {name: Node() for name in NODES}
        self.streams = {(w, n): Stream() for w in range(len(slots)) for n in NODES}
        self.refused = 0
        for w, ledger in enumerate(self.ledgers):
            for name in NODES:
                ledger.open(name)
            self.plan(w)

    # ---- worker side ---------------------------------------------------------------

    def plan(self, w: int) -> None:
        grants, recalls = self.ledgers[w].plan(NOW)
        for name, n in grants.items():
            assert n > 0
            self.streams[(w, name)].to_node.append(("grant", n))
        for name, n in recalls.items():
            assert n > 0
            self.streams[(w, name)].to_node.append(("recall", n))

    def to_worker(self, w: int, name: str) -> None:
        stream = self.streams[(w, name)]
        if not stream.to_worker:
            return
        kind, n = stream.to_worker.popleft()
        ledger = self.ledgers[w]
        if kind == "assignment":
            if not (ledger.consume(name) and ledger.try_occupy()):
                self.refused += 1
                stream.to_node.append(("release", 1))
        elif kind == "return":
            ledger.returned(name, n)
        elif kind == "backlog":
            ledger.set_backlog(name, n)
        elif kind == "drain":
            ledger.stop_node(name)
        self.plan(w)

    def finish(self, w: int) -> None:
        if self.ledgers[w].occupied:
            self.ledgers[w].release_slot()
            self.plan(w)

    # ---- node side ------------------------------------------------------------------

    def to_node(self, w: int, name: str) -> None:
        stream = self.streams[(w, name)]
        if not stream.to_node:
            return
        kind, n = stream.to_node.popleft()
        if kind == "grant":
            stream.credits += n
        elif kind == "recall":
            back = min(stream.credits, n)
            stream.credits -= back
            stream.to_worker.append(("return", back))
        elif kind == "release":
            self.nodes[name].ready += n
        self.dispatch(name)

    def add_work(self, name: str, tasks: int) -> None:
        self.nodes[name].ready += tasks
        self.dispatch(name)

    def drain(self, name: str) -> None:
        node = self.nodes[name]
        if not node.draining:
            node.draining = True
            for w in range(len(self.ledgers)):
                self.streams[(w, name)].to_worker.append(("drain", 0))

    def dispatch(self, name: str) -> None:
        node = self.nodes[name]
        sessions = [self.streams[(w, name)] for w in range(len(self.ledgers))]
        while not node.draining and node.ready:
            with_credit = [s for s in sessions if s.credits]
            if not with_credit:
                break
            for stream in with_credit:
                if not node.ready:
                    break
                stream.credits -= 1
                node.ready -= 1
                stream.to_worker.append(("assignment", 1))
        for stream in sessions:
            if stream.reported != node.ready:
                stream.reported = node.ready
                stream.to_worker.append(("backlog", node.ready))

    # ---- checks ---------------------------------------------------------------------

    def check_safety(self) -> None:
        assert self.refused == 0, "an assignment sent against a credit found no slot"
        for ledger in self.ledgers:
            assert 0 <= ledger.occupied + ledger.outstanding <= ledger.slots

    def settle(self) -> None:
        """Deliver every message, in a fixed order, until nothing moves."""
        for _ in range(10_000):
            moving = [k for k, s in self.streams.items() if s.to_node or s.to_worker]
            if not moving:
                return
            for w, name in moving:
                self.to_node(w, name)
                self.to_worker(w, name)
                self.check_safety()
        raise AssertionError("messages never stopped flowing")

    def check_liveness(self) -> None:
        waiting = {n: node.ready for n, node in self.nodes.items() if not node.draining}
        for w, ledger in enumerate(self.ledgers):
            for name in NODES:
                assert ledger.outstanding_for(name) == self.streams[(w, name)].credits
                if self.nodes[name].draining:
                    assert ledger.outstanding_for(name) == 0, "a drained node kept credits"
            if any(waiting.values()):
                assert ledger.occupied == ledger.slots, (
                    f"worker {w}: {ledger.slots - ledger.occupied} slots idle while "
                    f"{waiting} wait ({ledger.by_node()})"
                )


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("to_node"), st.integers(0, 1), st.sampled_from(NODES)),
        st.tuples(st.just("to_worker"), st.integers(0, 1), st.sampled_from(NODES)),
        st.tuples(st.just("work"), st.sampled_from(NODES), st.integers(1, 30)),
        st.tuples(st.just("finish"), st.integers(0, 1), st.integers(1, 10)),
        st.tuples(st.just("drain"), st.sampled_from(NODES)),
    ),
    max_size=120,
)


@settings(max_examples=400, deadline=None)
@given(slots=st.lists(st.integers(1, 12), min_size=1, max_size=2), steps=_steps)
def test_no_slot_idles_while_a_node_has_work_and_slots_are_never_overbooked(
    slots: list[int], steps: list[tuple]
) -> None:
    model = Model(slots)
    workers = len(slots)
    for step in steps:
        match step:
            case ("to_node", w, name):
                model.to_node(w % workers, name)
            case ("to_worker", w, name):
                model.to_worker(w % workers, name)
            case ("work", name, tasks):
                model.add_work(name, tasks)
            case ("finish", w, count):
                for _ in range(count):
                    model.finish(w % workers)
            case ("drain", name) if sum(n.draining for n in model.nodes.values()) < 2:
                model.drain(name)
        model.check_safety()
    model.settle()
    model.check_liveness()
    # And it stays so as runs end and new work arrives: each freed slot is refilled.
    for w in range(workers):
        for _ in range(3):
            model.finish(w)
    model.settle()
    model.check_liveness()


def test_a_stampede_with_exactly_as_many_tasks_as_slots_fills_every_slot() -> None:
    """Issue 12 item 8: 100 slots, 100 tasks due at once on three nodes unevenly."""
    model = Model([100])
    model.settle()
    # Spread evenly while no node reports backlog: 34, 33, 33.
    assert [model.streams[(0, n)].credits for n in NODES] == [34, 33, 33]
    model.add_work("a", 20)
    model.add_work("b", 50)
    model.add_work("c", 30)
    model.settle()
    assert model.ledgers[0].occupied == 100
    assert all(node.ready == 0 for node in model.nodes.values())


def test_a_stampede_on_three_nodes_never_strands_credits() -> None:
    """Issue 12 item 11: two workers of 10 slots, 1,000 tasks per node, runs ending in
    bursts while backlog reports arrive: at the end nothing waits and nothing idles."""
    model = Model([10, 10])
    for name in NODES:
        model.add_work(name, 1000)
    rounds = 0
    while any(node.ready for node in model.nodes.values()):
        rounds += 1
        assert rounds < 10_000
        # Deliver part of the traffic only, so answers and reports cross each other.
        for (w, name), stream in list(model.streams.items()):
            if rounds % 3 and stream.to_worker:
                model.to_worker(w, name)
            if stream.to_node:
                model.to_node(w, name)
        for w in (0, 1):
            for _ in range(rounds % 7):
                model.finish(w)
        model.check_safety()
    model.settle()
    model.check_liveness()
