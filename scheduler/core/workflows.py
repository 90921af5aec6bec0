"""Workflows: the rules of a DAG of tasks, pure (no I/O, no clock, no generated code).

A workflow is tasks named by local references and edges ``parent -> child``
(docs/architecture.md#d9). Nothing here polls the graph. Each task row carries
``unresolved_dependencies``, which starts at its in-degree (:func:`validate` gives it,
:attr:`Dag.in_degrees`) and counts the parents that are **not terminal yet**, whatever
the trigger rule: a parent reaching any terminal state takes one off each of its
children that still waits (SCHEDULED), in the transaction that made it terminal. A
child that reaches 0 while still SCHEDULED is due at once. The unlock never needs
more than the counter because of the one rule that decides early:

* ``ALL_SUCCESS`` (the default): the child runs when every parent COMPLETED. A parent
  that ends DEAD_LETTER, CANCELLED or UPSTREAM_FAILED makes it UPSTREAM_FAILED **at
  once**, in the failing parent's transaction, not when its last parent finishes. It
  can never run, so waiting would only keep a doomed row SCHEDULED behind a sibling
  that may run for hours (or sit OUTCOME_UNKNOWN for days), make its fate depend on a
  later transaction, and leave the run looking alive. Deciding at the failure also
  means the cause is recorded once, by the write that knew it, and never recomputed.
  So an ALL_SUCCESS task still SCHEDULED with a counter of 0 has only COMPLETED parents.
* ``ALL_DONE``: the child runs when every parent is terminal, whatever the outcome; a
  failed parent moves its counter like a completed one.

The cause of an UPSTREAM_FAILED task is the task that actually failed (DEAD_LETTER or
CANCELLED), carried down a chain of UPSTREAM_FAILED tasks unchanged: issue 16 names it
"the parent's id", the dead-lettered parent whose descendants these are, and it answers
"what went wrong" without a walk. With several failing parents it is the first failure
whose write reached the row (the row's status guard makes that the first committed).

A terminal failure is applied by the store in two statements of its own transaction:

1. :func:`upstream_failures` (the workflow's edges, rules and statuses, read once in
   the transaction): ``UPDATE ... SET status = 'UPSTREAM_FAILED', cause = ... WHERE
   status = 'SCHEDULED' RETURNING id``. The guard is what makes concurrent failures
   safe: two transactions may both plan a shared descendant; the first to lock the row
   writes it, the other's update passes over it.
2. :func:`released_by` over the failed task **and the ids the update returned** (not
   the plan: a descendant another failure already wrote has had its children released
   by that transaction, and counting it again would double a decrement):
   ``UPDATE ... SET unresolved_dependencies = unresolved_dependencies - n WHERE status
   = 'SCHEDULED' RETURNING ...``; rows at 0 are due now.

A completion needs neither function: it takes one off each child (``released_by`` of
the one task). The run's state (:func:`run_state`) and a retry (:func:`plan_retry`)
are read off the tasks' statuses. :func:`unlock` states the rule for one child given
its parents' outcomes; it is the specification the counters implement and what the
tests check them against.
"""

from __future__ import annotations

import re
import uuid
from collections import deque
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, NamedTuple, TypeVar

from chronoshard.scheduler.core.states import TERMINAL, TaskEvent, TaskStatus, sources
from chronoshard.scheduler.errors import InvalidArgument, shown

MAX_TASKS = 10_000
"""The most tasks one workflow may have (issue 16): its create is one transaction, and a
failure's propagation reads the whole graph."""
MAX_EDGES = 50_000
"""The most edges one workflow may have: five per task on average."""
MAX_NAME_LENGTH = 200
MAX_REF_LENGTH = 100
REF_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_REF_LENGTH - 1}}}")
"""A task's local reference: short, and made of characters that need no quoting in an
error message, a drawing of the DAG or a YAML key (so ``a -> b`` is unambiguous)."""
CYCLE_SHOWN = 10
"""A cycle longer than this is named by its first references and its length: the
message stays bounded (~1 KiB) for a cycle through 10,000 tasks."""

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class TriggerRule(StrEnum):
    """When a task with parents runs; the value is what the API and the task row spell."""

    ALL_SUCCESS = "all_success"
    """Every parent COMPLETED; a failed or cancelled one makes this task UPSTREAM_FAILED."""
    ALL_DONE = "all_done"
    """Every parent terminal, whatever its outcome."""


FAILING: frozenset[TaskStatus] = frozenset(
    {TaskStatus.DEAD_LETTER, TaskStatus.CANCELLED, TaskStatus.UPSTREAM_FAILED}
)
"""A parent's terminal states that make an ALL_SUCCESS child UPSTREAM_FAILED."""
CAUSES: frozenset[TaskStatus] = frozenset({TaskStatus.DEAD_LETTER, TaskStatus.CANCELLED})
"""The terminal states of a task that failed by itself: what an UPSTREAM_FAILED names."""
_WAITING = sources(TaskEvent.UPSTREAM_FAIL)
"""The states a task can be failed from by a parent (SCHEDULED: a child with a parent
not terminal is never dispatched)."""


# ---- what a client asks for ------------------------------------------------------------


class Edge(NamedTuple):
    """``child`` runs after ``parent`` (the request's ``edges[i].parent``/``.child``)."""

    parent: str
    child: str


@dataclass(frozen=True, slots=True)
class WorkflowTaskSpec(Generic[T]):
    """One task of a workflow request. ``template`` is whatever the API builds for the
    task (its validated submit); this module never looks inside it."""

    ref: str
    template: T
    trigger_rule: TriggerRule = TriggerRule.ALL_SUCCESS


@dataclass(frozen=True, slots=True)
class WorkflowSpec(Generic[T]):
    """A workflow request: tasks by reference and the edges between them, as sent."""

    name: str
    tasks: Sequence[WorkflowTaskSpec[T]]
    edges: Sequence[tuple[str, str]]


# ---- the graph -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Dag(Generic[K]):
    """An acyclic graph of tasks keyed by ``K``: references (``str``) when built by
    :func:`validate` from a request, task ids when the store rebuilds it from
    ``task_dependencies`` rows (:meth:`of`). Every task is a key of every mapping."""

    order: tuple[K, ...]
    """Every task, parents before children (Kahn's order: the tasks of the request with
    no parent first, in the request's order). The order the store inserts in."""
    parents: Mapping[K, tuple[K, ...]]
    children: Mapping[K, tuple[K, ...]]
    rules: Mapping[K, TriggerRule]
    in_degrees: Mapping[K, int]
    """Each task's number of parents: its ``unresolved_dependencies`` at creation."""

    @classmethod
    def of(cls, rules: Mapping[K, TriggerRule], edges: Iterable[tuple[K, K]]) -> Dag[K]:
        """The graph of trusted rows (a workflow :func:`validate` accepted once).

        Raises:
            ValueError: an edge names an unknown task or the edges hold a cycle: the rows
                are corrupt, which no request can cause.
        """
        parents: dict[K, list[K]] = {task: [] for task in rules}
        children: dict[K, list[K]] = {task: [] for task in rules}
        for parent, child in edges:
            if parent not in children or child not in parents:
                raise ValueError(f"edge {parent!r} -> {child!r} names a task not in the graph")
            children[parent].append(child)
            parents[child].append(parent)
        dag, stuck = _sorted(list(rules), parents, children, rules)
        if stuck:
            raise ValueError(f"the edges hold a cycle through {stuck[0]!r}")
        return dag


def _sorted(
    tasks: list[K],
    parents: dict[K, list[K]],
    children: dict[K, list[K]],
    rules: Mapping[K, TriggerRule],
) -> tuple[Dag[K], list[K]]:
    """Kahn's algorithm, O(tasks + edges): the graph, and the tasks it could not order
    (empty unless there is a cycle; then every cycle's tasks and all below them)."""
    in_degrees = {task: len(parents[task]) for task in tasks}
    remaining = dict(in_degrees)
    queue = deque(task for task in tasks if remaining[task] == 0)
    order: list[K] = []
    while queue:
        task = queue.popleft()
        order.append(task)
        for child in children[task]:
            remaining[child] -= 1
            if remaining[child] == 0:
                queue.append(child)
    stuck = [task for task in tasks if remaining[task] > 0] if len(order) < len(tasks) else []
    dag = Dag(
        order=tuple(order),
        parents={task: tuple(found) for task, found in parents.items()},
        children={task: tuple(found) for task, found in children.items()},
        rules=rules,
        in_degrees=in_degrees,
    )
    return dag, stuck


def _one_cycle(stuck: list[K], parents: Mapping[K, Sequence[K]]) -> list[K]:
    """One cycle among the tasks Kahn's algorithm could not order, in edge order, starting
    at the first of them in the request. Linear: every such task has a parent that is one
    too (its count never reached 0), so walking up from any of them must meet itself."""
    unordered = set(stuck)
    position: dict[K, int] = {}
    walk: list[K] = []
    task = stuck[0]
    while task not in position:
        position[task] = len(walk)
        walk.append(task)
        task = next(parent for parent in parents[task] if parent in unordered)
    cycle = walk[position[task] :]
    cycle.reverse()  # the walk went child -> parent
    rank = {found: i for i, found in enumerate(stuck)}
    first = min(range(len(cycle)), key=lambda i: rank[cycle[i]])
    return cycle[first:] + cycle[:first]


def _cycle_text(cycle: Sequence[str]) -> str:
    if len(cycle) <= CYCLE_SHOWN:
        return "a cycle: " + " -> ".join([*cycle, cycle[0]])
    head = CYCLE_SHOWN - 2
    return (
        f"a cycle of {len(cycle)} tasks: "
        + " -> ".join(cycle[:head])
        + f" -> ({len(cycle) - head} more) -> {cycle[0]}"
    )


def validate(
    spec: WorkflowSpec[T], *, max_tasks: int = MAX_TASKS, max_edges: int = MAX_EDGES
) -> Dag[str]:
    """The graph of ``spec``, keyed by reference, or the first thing wrong with it.

    Sizes are checked before anything is read, so a huge request is refused in constant
    time; the rest is linear in tasks + edges (10,000 and 50,000 took 0.06 s here).

    Raises:
        InvalidArgument: on the field as a request spells it: ``name`` too long;
            ``tasks`` none or too many; ``edges`` too many; ``tasks[i].ref`` not a
            reference (:data:`REF_PATTERN`) or repeated; ``edges[i].parent`` /
            ``edges[i].child`` naming no task; ``edges[i]`` a self-loop or a repeat;
            ``edges`` holding a cycle, the message naming one in order
            (``a cycle: fetch -> invoice -> fetch``).
    """
    if len(spec.name) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            "name", f"{len(spec.name)} characters is over the limit of {MAX_NAME_LENGTH}"
        )
    if not spec.tasks:
        raise InvalidArgument("tasks", "a workflow needs at least one task")
    if len(spec.tasks) > max_tasks:
        raise InvalidArgument(
            "tasks", f"{len(spec.tasks)} tasks is over the limit of {max_tasks} per workflow"
        )
    if len(spec.edges) > max_edges:
        raise InvalidArgument(
            "edges", f"{len(spec.edges)} edges is over the limit of {max_edges} per workflow"
        )
    index: dict[str, int] = {}
    for i, task in enumerate(spec.tasks):
        if REF_PATTERN.fullmatch(task.ref) is None:
            raise InvalidArgument(
                f"tasks[{i}].ref",
                f"{shown(task.ref)} is not a reference: 1 to {MAX_REF_LENGTH} letters, digits, "
                "'_', '.' or '-', starting with a letter or digit",
            )
        first = index.setdefault(task.ref, i)
        if first != i:
            raise InvalidArgument(
                f"tasks[{i}].ref", f"{task.ref} is already the reference of tasks[{first}]"
            )
    refs = list(index)
    parents: dict[str, list[str]] = {ref: [] for ref in refs}
    children: dict[str, list[str]] = {ref: [] for ref in refs}
    seen: dict[tuple[str, str], int] = {}
    for j, (parent, child) in enumerate(spec.edges):
        for side, ref in (("parent", parent), ("child", child)):
            if ref not in index:
                raise InvalidArgument(
                    f"edges[{j}].{side}", f"no task has the reference {shown(ref)}"
                )
        if parent == child:
            raise InvalidArgument(
                f"edges[{j}]", f"{parent} -> {child}: a task cannot depend on itself"
            )
        earlier = seen.setdefault((parent, child), j)
        if earlier != j:
            raise InvalidArgument(f"edges[{j}]", f"{parent} -> {child} repeats edges[{earlier}]")
        children[parent].append(child)
        parents[child].append(parent)
    rules = {task.ref: task.trigger_rule for task in spec.tasks}
    dag, stuck = _sorted(refs, parents, children, rules)
    if stuck:
        raise InvalidArgument("edges", _cycle_text(_one_cycle(stuck, parents)))
    return dag


# ---- unlocking one child ---------------------------------------------------------------


class Readiness(StrEnum):
    WAITING = "WAITING"
    """Some parent is not terminal yet, and none has failed it."""
    READY = "READY"
    """Due at once."""
    UPSTREAM_FAILED = "UPSTREAM_FAILED"
    """It will never run; ``cause`` says which failure."""


@dataclass(frozen=True, slots=True)
class ParentOutcome(Generic[K]):
    """A parent's terminal state as its child learns it. An UPSTREAM_FAILED parent
    carries its own recorded ``cause``, which its children inherit."""

    parent: K
    status: TaskStatus
    cause: K | None = None

    def __post_init__(self) -> None:
        if self.status not in TERMINAL:
            raise ValueError(f"{self.status} is not terminal: a child learns only outcomes")
        if (self.status is TaskStatus.UPSTREAM_FAILED) != (self.cause is not None):
            raise ValueError("a cause is recorded with UPSTREAM_FAILED and only with it")

    @property
    def failure(self) -> K | None:
        """The task whose failure this outcome passes down, or None if it passes none."""
        if self.status in CAUSES:
            return self.parent
        return self.cause


@dataclass(frozen=True, slots=True)
class Unlock(Generic[K]):
    readiness: Readiness
    cause: K | None = None


def unlock(rule: TriggerRule, in_degree: int, finished: Sequence[ParentOutcome[K]]) -> Unlock[K]:
    """What a child with ``in_degree`` parents is, given the outcomes of those that have
    finished, in the order they finished.

    ALL_SUCCESS: UPSTREAM_FAILED as soon as one outcome is failing (the earliest names
    the cause), READY when all ``in_degree`` COMPLETED. ALL_DONE: READY when all are
    in. Otherwise WAITING.

    Raises:
        ValueError: more outcomes than parents, or one parent twice (a doubled decrement).
    """
    if len(finished) > in_degree:
        raise ValueError(f"{len(finished)} outcomes for {in_degree} parents")
    if len({outcome.parent for outcome in finished}) < len(finished):
        raise ValueError("a parent's outcome is counted twice")
    if rule is TriggerRule.ALL_SUCCESS:
        for outcome in finished:
            if outcome.status in FAILING:
                return Unlock(Readiness.UPSTREAM_FAILED, outcome.failure)
    if len(finished) == in_degree:
        return Unlock(Readiness.READY)
    return Unlock(Readiness.WAITING)


# ---- propagation, as the store applies it ---------------------------------------------


def upstream_failures(
    dag: Dag[K], failed: Iterable[K], statuses: Mapping[K, TaskStatus]
) -> dict[K, K]:
    """The tasks that become UPSTREAM_FAILED because the tasks ``failed`` ended
    DEAD_LETTER or CANCELLED, each with its cause (the failed task it descends from),
    parents before children.

    A descendant is failed through a chain of ALL_SUCCESS tasks still waiting in
    ``statuses`` (as the transaction read them). The walk stops at an ALL_DONE task (it
    will run; its counter moves, see :func:`released_by`) and at a task already
    terminal (an earlier failure decided it and its descendants; its cause stays). With
    several ``failed``, a task below two of them takes the first in the order given,
    exactly as if they had been applied one at a time. O(tasks + edges).
    """
    roots = list(failed)
    excluded = set(roots)  # a failed task read SCHEDULED (a waiting task cancelled) is not marked
    marked: dict[K, K] = {}
    for root in roots:
        queue = deque([root])
        while queue:
            task = queue.popleft()
            for child in dag.children[task]:
                if (
                    child in marked
                    or child in excluded
                    or dag.rules[child] is not TriggerRule.ALL_SUCCESS
                    or statuses[child] not in _WAITING
                ):
                    continue
                marked[child] = root
                queue.append(child)
    return marked


def released_by(dag: Dag[K], finished: Iterable[K]) -> dict[K, int]:
    """How far each child's ``unresolved_dependencies`` falls when the tasks ``finished``
    become terminal in one transaction: its number of parents among them.

    The store applies it only to children still SCHEDULED (a child failed in the same
    transaction is terminal and keeps its count), and only for tasks it actually made
    terminal (the module docstring says why).
    """
    released: dict[K, int] = {}
    for task in finished:
        for child in dag.children[task]:
            released[child] = released.get(child, 0) + 1
    return released


# ---- what a dispatched task learns --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parent:
    """A parent of a task being dispatched, as its assignment tells the handler."""

    task_id: uuid.UUID
    ref: str
    status: TaskStatus
    result_json: str | None
    """What it returned (JSON text as stored), None if nothing."""


@dataclass(frozen=True, slots=True)
class Place:
    """A workflow task's place in its run: its ref and its parents, in the run's order."""

    ref: str
    parents: tuple[Parent, ...] = ()


def bounded_results(parents: Sequence[Parent], max_bytes: int) -> list[tuple[Parent, bool]]:
    """Each parent with whether its result is carried: in order, while the results'
    total UTF-8 size stays within ``max_bytes`` (``workflows.max_parent_results_bytes``);
    every parent after the first that does not fit is left out too, so a handler sees
    "the first N in the run's order", never a gap it must notice."""
    carried: list[tuple[Parent, bool]] = []
    total = 0
    fits = True
    for parent in parents:
        size = len(parent.result_json.encode()) if parent.result_json is not None else 0
        fits = fits and total + size <= max_bytes
        if fits:
            total += size
        carried.append((parent, fits))
    return carried


# ---- the run ---------------------------------------------------------------------------


class RunState(StrEnum):
    """``workflow_runs.state``."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


_RUN_FAILURES = frozenset({TaskStatus.DEAD_LETTER, TaskStatus.UPSTREAM_FAILED})


def run_state(statuses: Collection[TaskStatus]) -> RunState:
    """The state of a run whose tasks are in ``statuses`` (each distinct status once is
    enough: the reconciler's aggregate reads ``DISTINCT status``).

    * RUNNING while any task is not terminal (OUTCOME_UNKNOWN included: it waits for its
      settlement or an operator).
    * SUCCEEDED when every task COMPLETED.
    * FAILED when a task DEAD_LETTER or UPSTREAM_FAILED, also when the run was then
      cancelled: the failure is the truer account of what happened, and retry serves
      both. A task cancelled on its own (``CancelTask``) fails its ALL_SUCCESS
      descendants, and so the run.
    * CANCELLED otherwise: every task not COMPLETED was CANCELLED. Cancelling a run
      cancels each non-terminal task, its waiting ones in the same statement (so they
      read CANCELLED, never UPSTREAM_FAILED), its running ones cooperatively.

    The reconciler asks it through ``core.repairs.workflow_outcome`` (RUNNING there is
    None).
    """
    if any(status not in TERMINAL for status in statuses):
        return RunState.RUNNING
    if any(status in _RUN_FAILURES for status in statuses):
        return RunState.FAILED
    if TaskStatus.CANCELLED in statuses:
        return RunState.CANCELLED
    return RunState.SUCCEEDED


@dataclass(frozen=True, slots=True)
class RetryPlan(Generic[K]):
    """What a retry of a finished run writes."""

    reopened: dict[K, int]
    """The tasks that go back to SCHEDULED, parents before children, each with its new
    ``unresolved_dependencies``: its parents that are reopened too."""
    kept: frozenset[K]
    """The tasks that COMPLETED: untouched, not run again; their results stay."""

    @property
    def ready(self) -> tuple[K, ...]:
        """The reopened tasks due at once (every parent kept, or none)."""
        return tuple(task for task, unresolved in self.reopened.items() if unresolved == 0)


def plan_retry(dag: Dag[K], statuses: Mapping[K, TaskStatus]) -> RetryPlan[K]:
    """Retry a finished run from its failures on, keeping what succeeded.

    Reopened: the DEAD_LETTER, CANCELLED and UPSTREAM_FAILED tasks and every task below
    them that did not complete; in a finished run those are exactly the tasks that did
    not COMPLETE. An ALL_DONE task that completed after a failed parent is kept: it ran
    and succeeded. A run with nothing to reopen (SUCCEEDED) gets an empty plan.

    Only a finished run is retried: a task still live below a failure (an ALL_DONE child
    running) cannot be reopened under its worker. The API checks ``run_state`` first.

    Raises:
        ValueError: some task is not terminal.
    """
    live = [task for task in dag.order if statuses[task] not in TERMINAL]
    if live:
        raise ValueError(f"{len(live)} tasks are not terminal, {live[0]!r} first")
    reopened: dict[K, int] = {}
    for task in dag.order:
        if statuses[task] is TaskStatus.COMPLETED:
            continue
        reopened[task] = sum(
            1 for parent in dag.parents[task] if statuses[parent] is not TaskStatus.COMPLETED
        )
    kept = frozenset(task for task in dag.order if task not in reopened)
    return RetryPlan(reopened=reopened, kept=kept)
