"""Credit accounting: how many assignments each node may send, never more than free slots.

The invariant (docs/worker-protocol.md, "Credits") is ``occupied + outstanding <= slots``
where ``occupied`` counts the slots held by accepted tasks (from their Assignment until
the handler has really stopped) and ``outstanding`` sums the credits granted to all nodes
and not yet consumed by an Assignment. Every method keeps it:

- :meth:`plan` grants only ``slots - occupied - outstanding``, aiming at
  :meth:`desired`: one credit per node, then up to each node's backlog, then the rest
  evenly, so no slot sits idle while a node could send work. When a node holds fewer
  than it should and no slot is free, :meth:`plan` recalls the excess from others; a
  recall frees nothing until the node answers (:meth:`returned`), so the invariant holds
  whatever the node did with those credits meanwhile.
- An Assignment first consumes its node's credit (:meth:`consume`), then takes a slot
  (:meth:`try_occupy`) only if the sum is still below ``slots``: an Assignment sent
  without a credit, or after the credits were withdrawn, is refused, not run.
- A node whose stream ended forgot the session and its credits (:meth:`close`). A node
  that sent ``Drain`` gets no new credits but keeps its outstanding ones counted until
  its stream ends, because nothing withdraws them on its side. ``DrainStarted`` (the
  worker draining) withdraws everything (:meth:`stop_granting`).

Pure: no I/O, no clock; the session layer sends what :meth:`plan` returns.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _NodeCredit:
    outstanding: int = 0
    ready: int = 0
    accepting: bool = True
    # Credits asked back and not yet answered (still counted in outstanding).
    recalling: int = 0


class CreditLedger:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self.occupied = 0
        self.granting = True
        self._nodes: dict[str, _NodeCredit] = {}
        self.unexpected_assignments = 0

    # ---- nodes ---------------------------------------------------------------------

    def open(self, node: str) -> None:
        """A session was welcomed: the node starts with no credits."""
        self._nodes[node] = _NodeCredit()

    def close(self, node: str) -> None:
        """The node's stream ended: its credits are gone with the session."""
        self._nodes.pop(node, None)

    def stop_node(self, node: str) -> None:
        """The node sent Drain: no more credits for it (its outstanding ones stay counted)."""
        state = self._nodes.get(node)
        if state is not None:
            state.accepting = False

    def set_backlog(self, node: str, ready: int) -> None:
        state = self._nodes.get(node)
        if state is not None:
            state.ready = max(0, ready)

    def stop_granting(self) -> None:
        """The worker sent DrainStarted to every node: all credits are withdrawn."""
        self.granting = False
        for state in self._nodes.values():
            state.outstanding = 0

    # ---- assignments and slots -----------------------------------------------------

    def consume(self, node: str) -> bool:
        """An Assignment arrived from ``node``: use one of its credits.

        Returns False (and counts it) when the node had none: a protocol violation the
        caller answers by refusing the task if no slot is free.
        """
        state = self._nodes.get(node)
        if state is None or state.outstanding == 0:
            self.unexpected_assignments += 1
            return False
        state.outstanding -= 1
        return True

    def try_occupy(self) -> bool:
        """Take a slot for an accepted assignment if the invariant allows it."""
        if not self.granting or self.occupied + self.outstanding >= self.slots:
            return False
        self.occupied += 1
        return True

    def release_slot(self) -> None:
        """A handler really stopped: its slot is free again."""
        if self.occupied == 0:
            raise RuntimeError("release_slot without an occupied slot")
        self.occupied -= 1

    # ---- grants --------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return sum(state.outstanding for state in self._nodes.values())

    def outstanding_for(self, node: str) -> int:
        state = self._nodes.get(node)
        return state.outstanding if state is not None else 0

    @property
    def free(self) -> int:
        return self.slots - self.occupied - self.outstanding

    def desired(self) -> dict[str, int]:
        """How many credits each accepting node should hold, given ``slots - occupied``.

        One each first (a task that becomes due anywhere is sent at once), then up to
        each node's reported backlog (largest first), then the rest evenly: no slot idles.
        """
        nodes = sorted(
            ((name, state) for name, state in self._nodes.items() if state.accepting),
            key=lambda item: (-item[1].ready, item[0]),
        )
        want = {name: 0 for name, _ in nodes}
        if not self.granting:
            return want
        avail = self.slots - self.occupied
        for name, _ in nodes:
            if avail == 0:
                return want
            want[name] = 1
            avail -= 1
        for name, state in nodes:
            extra = min(avail, max(0, state.ready - want[name]))
            want[name] += extra
            avail -= extra
        if avail > 0 and nodes:
            _fill_evenly(want, avail)
        return want

    def plan(self) -> tuple[dict[str, int], dict[str, int]]:
        """Credits to grant now and credits to recall now, by node.

        Grants are recorded as outstanding at once. A recall is only recorded as pending:
        the credits stay outstanding until the node answers (:meth:`returned`), because
        the node may already have used them. Recalls happen only to serve a node that
        holds fewer credits than it should while no slot is free.
        """
        if not self.granting:
            return {}, {}
        want = self.desired()
        free = self.free
        grants: dict[str, int] = {}
        for name in sorted(want, key=lambda n: (self._nodes[n].outstanding - want[n], n)):
            state = self._nodes[name]
            give = min(free, want[name] - state.outstanding)
            if give > 0:
                state.outstanding += give
                grants[name] = give
                free -= give
        shortfall = sum(max(0, want[n] - self._nodes[n].outstanding) for n in want)
        recalls: dict[str, int] = {}
        if shortfall > 0:
            for name, state in sorted(self._nodes.items()):
                excess = state.outstanding - state.recalling - want.get(name, 0)
                if excess <= 0:
                    continue
                take = min(excess, shortfall)
                state.recalling += take
                recalls[name] = take
                shortfall -= take
                if shortfall == 0:
                    break
        return grants, recalls

    def returned(self, node: str, credits: int) -> None:
        """The node gave back ``credits`` unused credits (its answer to a recall)."""
        state = self._nodes.get(node)
        if state is None:
            return
        credits = min(credits, state.outstanding)
        state.outstanding -= credits
        state.recalling = max(0, state.recalling - credits)

    def stats(self) -> dict[str, int]:
        return {
            "slots": self.slots,
            "occupied": self.occupied,
            "outstanding": self.outstanding,
            "unexpected_assignments": self.unexpected_assignments,
        }


def _fill_evenly(want: dict[str, int], avail: int) -> None:
    """Hand out ``avail`` credits one at a time, each to the node holding fewest (ties
    by name), computed by levels: O(nodes log nodes), not O(avail x nodes). This runs
    after every settlement, with ``avail`` up to the worker's slot count."""
    order = sorted(want, key=lambda n: (want[n], n))
    level = want[order[0]]
    raised = 0  # nodes at `level`: order[:raised]
    while True:
        while raised < len(order) and want[order[raised]] <= level:
            raised += 1
        above = want[order[raised]] if raised < len(order) else None
        step = avail // raised if above is None else min(avail // raised, above - level)
        if step == 0:
            break
        level += step
        avail -= step * raised
    # Every node below `level` comes up to it; what is left (fewer than `raised`) goes one
    # each to the nodes now at `level`, by name, as the one-at-a-time rule would.
    for name in order[:raised]:
        want[name] = level
    for name in sorted(order[:raised])[:avail]:
        want[name] += 1
