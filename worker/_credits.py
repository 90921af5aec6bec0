"""Credit accounting: how many assignments each node may send, never more than free slots.

The invariant (docs/worker-protocol.md, "Credits") is ``occupied + outstanding <= slots``
where ``occupied`` counts the slots held by accepted tasks (from their Assignment until
the handler has really stopped) and ``outstanding`` sums the credits granted to all nodes
and not yet consumed by an Assignment. Every method keeps it:

- :meth:`plan` grants only ``slots - occupied - outstanding``: first to the nodes with
  ``ready`` tasks (up to ``ready``, largest backlog first, at least one each), then the
  rest spread evenly, so no slot sits idle while a node could send work.
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

    def plan(self) -> dict[str, int]:
        """Credits to grant now, by node; recorded as outstanding before returning."""
        free = self.free
        if not self.granting or free <= 0:
            return {}
        # Largest backlog first; ties go to the node holding fewer credits, then by name
        # so the plan is deterministic.
        order = sorted(
            ((name, state) for name, state in self._nodes.items() if state.accepting),
            key=lambda item: (-item[1].ready, item[1].outstanding, item[0]),
        )
        grants: dict[str, int] = {}
        for name, state in order:
            if free == 0:
                break
            give = min(free, max(1, state.ready) - state.outstanding)
            if give > 0:
                state.outstanding += give
                grants[name] = give
                free -= give
        # Then no slot idles: what is left is spread over the nodes, fewest credits first.
        # Backlog reports lag (a node reports only tasks already due), and a task that
        # becomes due on a node must not wait for a credit round trip while slots are
        # free; the backlog pass above steers each freed slot to where work waits.
        while free > 0 and order:
            name, state = min(order, key=lambda item: (item[1].outstanding, item[0]))
            state.outstanding += 1
            grants[name] = grants.get(name, 0) + 1
            free -= 1
        return grants

    def stats(self) -> dict[str, int]:
        return {
            "slots": self.slots,
            "occupied": self.occupied,
            "outstanding": self.outstanding,
            "unexpected_assignments": self.unexpected_assignments,
        }
