"""Credit accounting: how many assignments each node may send, never more than free slots.

The invariant (docs/worker-protocol.md, "Credits") is ``occupied + outstanding <= slots``
where ``occupied`` counts the slots held by accepted tasks (from their Assignment until
the handler has really stopped) and ``outstanding`` sums the credits granted to all nodes
and not yet consumed by an Assignment or given back. Every method keeps it:

- :meth:`CreditLedger.plan` grants only ``slots - occupied - outstanding``, aiming at
  :func:`allocate`: first each node's reported backlog (shared max-min fairly when slots
  are short), then one credit for every node that has none (a task that becomes due
  there is sent at once), then the rest evenly. So a slot never idles while a node
  reports work this worker can run.
- When two or more nodes report backlog, the slots that free go to one of them at a time
  (:class:`Turns`), and whose turn it is is read off the wall clock: each node with
  backlog has the free slots for ``TURN_S`` in turn, in an order drawn afresh for every
  cycle of turns from the cycle's number and the node names. So every worker gives its
  freed slots to the same node at the same moment, and that node's rounds carry what
  the workers freed together, as a lone node's would. Spread one by one, three nodes on
  one machine paid every per-round cost (the intent transaction, the stream messages)
  three times as often and did 40 % of one node's rate (issue 14); with turns counted by
  each worker on its own, the workers' turns drifted apart, each node's rounds carried
  one worker's slots, and three nodes ran a fifth more write transactions per task than
  one. A turn takes every slot that frees in it that its node can use (the rest go on to
  the next nodes in the order). Over the turns each node with backlog has the slots an
  equal time; a drawn order, not a fixed one, so that runs lasting a multiple of the
  cycle cannot keep returning their slots to the node that held them.
- When a node holds fewer credits than its backlog share (or its one) and no slot is
  free, :meth:`CreditLedger.plan` recalls the difference from nodes holding more than
  theirs, and always recalls every credit of a node that stopped accepting (it sent
  ``Drain``). While turns are taken, credits are recalled only from nodes without
  backlog: a node with backlog waits for its turn as slots free, and a recall from
  another such node would move the credits back one by one. A
  recall frees nothing until the node answers (:meth:`CreditLedger.returned`): the node
  may already have used those credits, and the Assignments it sent before its
  answer reach the worker before the answer does (one ordered stream).
- Every ``CreditRecall`` is answered by exactly one ``CreditReturn``, in order, so an
  answer closes the oldest recall of that node *whatever it returned*: what it did not
  return, it had used. (Counting only the returned credits as answered left the rest
  "being recalled" forever, and the ledger then never asked those nodes again: credits
  stranded on nodes without work while another node's tasks waited, issue 12 items 7, 8
  and 11.)
- An Assignment first consumes its node's credit (:meth:`CreditLedger.consume`), then
  takes a slot (:meth:`CreditLedger.try_occupy`) only if the sum is still below ``slots``:
  an Assignment sent without a credit, or after the credits were withdrawn, is refused,
  not run.
- A node whose stream ended forgot the session and its credits
  (:meth:`CreditLedger.close`). ``DrainStarted`` (the worker draining) withdraws
  everything (:meth:`CreditLedger.stop_granting`).

Pure: no I/O, no clock (the time comes in as ``now``); the session layer sends what
:meth:`CreditLedger.plan` returns.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class _NodeCredit:
    outstanding: int = 0
    ready: int = 0
    accepting: bool = True
    # The amounts of the recalls not answered yet, oldest first (still in outstanding).
    recalls: deque[int] = field(default_factory=deque)

    @property
    def recalling(self) -> int:
        return sum(self.recalls)

    @property
    def kept(self) -> int:
        """Credits the node keeps once its pending recalls are answered (at least)."""
        return self.outstanding - min(self.recalling, self.outstanding)


@dataclass(frozen=True)
class Allocation:
    """How many credits each accepting node should hold, by tier.

    ``backlog``: each node's share of its reported backlog; ``needed``: that plus one for
    every node left with none (worth a recall from a node holding more); ``desired``:
    that plus the rest spread evenly (granted from free slots, never recalled for).
    """

    backlog: dict[str, int]
    needed: dict[str, int]
    desired: dict[str, int]


def allocate(avail: int, backlogs: Mapping[str, int]) -> Allocation:
    """Share ``avail`` credits among the nodes of ``backlogs`` (node -> reported backlog).

    Backlog first, max-min fair (each node in turn gets one more until it has its
    backlog or nothing is left, the node holding fewest first, ties by name), then one
    each for the nodes still at zero (by name), then the rest evenly.
    """
    zero = dict.fromkeys(backlogs, 0)
    backlog, avail = water_fill(zero, {n: max(0, b) for n, b in backlogs.items()}, avail)
    needed = dict(backlog)
    for name in sorted(needed):
        if avail == 0:
            break
        if needed[name] == 0:
            needed[name] = 1
            avail -= 1
    desired = needed
    if avail > 0 and needed:
        desired, avail = water_fill(needed, None, avail)
    return Allocation(backlog, needed, desired)


def water_fill(
    base: Mapping[str, int], caps: Mapping[str, int] | None, avail: int
) -> tuple[dict[str, int], int]:
    """Hand out up to ``avail`` credits one at a time, each to the node holding fewest
    (ties by name) that may take more (``caps``: how many more each may take; None:
    unlimited). Returns the new holdings and what was left over.

    Computed by levels, O(nodes log slots), not O(avail x nodes): this runs after every
    settlement, with ``avail`` up to the worker's slot count.
    """
    if avail <= 0 or not base:
        return dict(base), max(0, avail)

    def room(name: str) -> int | None:
        return None if caps is None else caps.get(name, 0)

    def given_at(level: int) -> int:
        """Credits needed to bring every node that may grow up to ``level``."""
        total = 0
        for name, held in base.items():
            extra = max(0, level - held)
            cap = room(name)
            total += extra if cap is None else min(extra, cap)
        return total

    low = min(base.values())
    # No level above this gives more: every node that may grow is full by then (with no
    # caps, the node holding fewest alone would have taken everything).
    if caps is None:
        high = max(base.values()) + avail
    else:
        high = max(held + caps.get(name, 0) for name, held in base.items())
    if given_at(high) <= avail:
        level = high
    else:
        # The highest level that does not take more than avail.
        while low < high:
            mid = (low + high + 1) // 2
            if given_at(mid) <= avail:
                low = mid
            else:
                high = mid - 1
        level = low
    filled: dict[str, int] = {}
    for name, held in base.items():
        extra = max(0, level - held)
        cap = room(name)
        filled[name] = held + (extra if cap is None else min(extra, cap))
    left = avail - (sum(filled.values()) - sum(base.values()))
    # What is left (fewer than the nodes at `level` that may grow) goes one each to those
    # nodes by name, as the one-at-a-time rule would.
    for name in sorted(filled):
        if left == 0:
            break
        cap = room(name)
        if filled[name] == level and (cap is None or filled[name] - base[name] < cap):
            filled[name] += 1
            left -= 1
    return filled, left


TURN_S = 0.05
"""How long each node with backlog has a worker's free slots while several have backlog.
Long against a round (a few ms), so the workers' grants meet in one node's rounds; short
against the 100 ms dispatch lead, so a node waits little for its turn (measured in
bench/README.md, "Turns by the clock")."""


@dataclass
class Turns:
    """Which node with backlog the free slots go to at a time: the turns of a cycle are
    ``turn_s`` long, one for each node with backlog, in an order drawn from the cycle's
    number, so every worker with the same clock and the same nodes computes the same.
    A worker whose clock is off only gives its slots out of step: its rounds are smaller,
    nothing else changes."""

    turn_s: float = TURN_S
    _drawn_for: tuple[int, tuple[str, ...]] | None = None
    _drawn: list[str] = field(default_factory=list)

    def order(self, backlogged: Iterable[str], now: float) -> list[str]:
        """The nodes of ``backlogged`` in the order free slots go to them at ``now``
        (wall-clock seconds): the node whose turn it is, then the ones whose turns come
        next in this cycle, then the cycle's earlier ones (wrapping round)."""
        names = tuple(sorted(backlogged))
        if not names:
            return []
        cycle, position = divmod(math.floor(now / self.turn_s), len(names))
        if self._drawn_for != (cycle, names):
            self._drawn_for = (cycle, names)
            self._drawn = sorted(names, key=lambda name: (_draw(cycle, name), name))
        return self._drawn[position:] + self._drawn[:position]


def _draw(cycle: int, node: str) -> bytes:
    """The same for every worker, fresh for every cycle (BLAKE2b: not ``hash``, which
    differs between processes for strings)."""
    return hashlib.blake2b(f"{cycle}/{node}".encode(), digest_size=8).digest()


class CreditLedger:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self.occupied = 0
        self.granting = True
        self._nodes: dict[str, _NodeCredit] = {}
        self.unexpected_assignments = 0
        self.recalls_sent = 0
        self.turns = Turns()

    # ---- nodes ---------------------------------------------------------------------

    def open(self, node: str) -> None:
        """A session was welcomed: the node starts with no credits."""
        self._nodes[node] = _NodeCredit()

    def close(self, node: str) -> None:
        """The node's stream ended: its credits are gone with the session."""
        self._nodes.pop(node, None)

    def stop_node(self, node: str) -> None:
        """The node sent Drain: no more credits for it, and the next plan recalls its
        outstanding ones (they stay counted until it answers)."""
        state = self._nodes.get(node)
        if state is not None:
            state.accepting = False

    def resume_node(self, node: str) -> None:
        """The node sent Resume (it was undrained): it may get credits again."""
        state = self._nodes.get(node)
        if state is not None:
            state.accepting = True

    def set_backlog(self, node: str, ready: int) -> None:
        state = self._nodes.get(node)
        if state is not None:
            state.ready = max(0, ready)

    def stop_granting(self) -> None:
        """The worker sent DrainStarted to every node: all credits are withdrawn."""
        self.granting = False
        for state in self._nodes.values():
            state.outstanding = 0
            state.recalls.clear()

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

    def recalling_for(self, node: str) -> int:
        state = self._nodes.get(node)
        return state.recalling if state is not None else 0

    @property
    def free(self) -> int:
        return self.slots - self.occupied - self.outstanding

    def allocation(self) -> Allocation:
        """The target holdings of the accepting nodes, given ``slots - occupied``."""
        backlogs = {name: s.ready for name, s in self._nodes.items() if s.accepting}
        avail = self.slots - self.occupied if self.granting else 0
        return allocate(avail, backlogs)

    def desired(self) -> dict[str, int]:
        return self.allocation().desired

    def plan(self, now: float) -> tuple[dict[str, int], dict[str, int]]:
        """Credits to grant now and credits to recall now, by node; ``now`` is the wall
        clock in seconds (it says whose turn it is).

        Grants come from free slots: to the node whose turn it is when several report
        backlog (up to what it can use, then the next in the turns' order), then tier by
        tier (backlog shares first, then the one each, then the even spread); they are
        recorded as outstanding at once. Recalls are recorded as pending: the credits
        stay outstanding until the node answers, because it may already have used them.
        A node that stopped accepting has all its credits recalled; otherwise credits
        are recalled only while a node holds fewer than it needs (its backlog share, or
        its one), no slot is free, and the recalls already on their way do not cover it;
        while turns are taken, only from nodes without backlog.
        """
        if not self.granting:
            return {}, {}
        alloc = self.allocation()
        free = self.free
        grants: dict[str, int] = {}
        backlogged = [n for n, s in self._nodes.items() if s.accepting and s.ready > 0]
        taking_turns = len(backlogged) >= 2
        if taking_turns and free > 0:
            for name in self.turns.order(backlogged, now):
                if free == 0:
                    break
                state = self._nodes[name]
                # A turn takes all it can use of what is free now: splitting the slots
                # that freed together would split the round.
                give = min(free, state.ready - state.kept)
                if give > 0:
                    state.outstanding += give
                    grants[name] = give
                    free -= give
        for target in (alloc.backlog, alloc.needed, alloc.desired):
            for name in sorted(target):
                if free == 0:
                    break
                state = self._nodes[name]
                give = min(free, target[name] - state.kept)
                if give > 0:
                    state.outstanding += give
                    grants[name] = grants.get(name, 0) + give
                    free -= give
        recalls: dict[str, int] = {}
        for name, state in sorted(self._nodes.items()):
            if not state.accepting and state.kept > 0:
                recalls[name] = state.kept
        shortfall = sum(max(0, alloc.needed[n] - self._nodes[n].kept) for n in alloc.needed)
        shortfall -= sum(s.recalling for s in self._nodes.values()) + sum(recalls.values())
        if shortfall > 0:
            spare = sorted(
                (
                    (state.kept - alloc.needed[name], name)
                    for name, state in self._nodes.items()
                    if state.accepting
                    and state.kept > alloc.needed[name]
                    # Turns move credits between nodes with backlog; a recall only
                    # takes back what a node without any holds beyond its due.
                    and not (taking_turns and state.ready > 0)
                ),
                key=lambda item: (-item[0], item[1]),
            )
            for excess, name in spare:
                take = min(excess, shortfall)
                recalls[name] = take
                shortfall -= take
                if shortfall == 0:
                    break
        for name, credits in recalls.items():
            self._nodes[name].recalls.append(credits)
        self.recalls_sent += len(recalls)
        return grants, recalls

    def returned(self, node: str, credits: int) -> None:
        """The node answered its oldest pending recall, giving back ``credits`` unused
        credits (the rest of what was asked it had used: those Assignments came first)."""
        state = self._nodes.get(node)
        if state is None:
            return
        state.outstanding -= min(max(0, credits), state.outstanding)
        if state.recalls:
            state.recalls.popleft()

    def stats(self) -> dict[str, int]:
        return {
            "slots": self.slots,
            "occupied": self.occupied,
            "outstanding": self.outstanding,
            "unexpected_assignments": self.unexpected_assignments,
            "recalls_sent": self.recalls_sent,
        }

    def by_node(self) -> dict[str, dict[str, int]]:
        """Per node: credits outstanding, being recalled, reported backlog (for logs)."""
        return {
            name: {
                "outstanding": s.outstanding,
                "recalling": s.recalling,
                "backlog": s.ready,
                "accepting": int(s.accepting),
            }
            for name, s in sorted(self._nodes.items())
        }
