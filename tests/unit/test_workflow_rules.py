"""The workflow rules (core/workflows): validation, unlocking, failure propagation, the
run's state and retry, as examples and as runs of random DAGs over a simulated store that
applies them the way the store will (status-guarded writes, concurrent transactions
planned from one snapshot)."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.states import TERMINAL, TaskStatus
from chronoshard.scheduler.core.workflows import (
    CYCLE_SHOWN,
    FAILING,
    MAX_EDGES,
    MAX_REF_LENGTH,
    MAX_TASKS,
    Dag,
    Edge,
    Parent,
    ParentOutcome,
    Readiness,
    RetryPlan,
    RunState,
    TriggerRule,
    Unlock,
    WorkflowSpec,
    WorkflowTaskSpec,
    bounded_results,
    plan_retry,
    released_by,
    run_state,
    unlock,
    upstream_failures,
    validate,
)
from chronoshard.scheduler.errors import InvalidArgument

S = TaskStatus
ALL_SUCCESS = TriggerRule.ALL_SUCCESS
ALL_DONE = TriggerRule.ALL_DONE
PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)


def _spec(
    refs: Sequence[str],
    edges: Sequence[tuple[str, str]],
    rules: Mapping[str, TriggerRule] | None = None,
) -> WorkflowSpec[None]:
    rules = rules or {}
    tasks = [WorkflowTaskSpec(ref, None, rules.get(ref, ALL_SUCCESS)) for ref in refs]
    return WorkflowSpec("w", tasks, [Edge(parent, child) for parent, child in edges])


def _refused(spec: WorkflowSpec[None], **limits: int) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        validate(spec, **limits)
    return caught.value


DIAMOND = _spec(["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])


# ---- validate: examples ---------------------------------------------------------------


def test_the_diamond() -> None:
    dag = validate(DIAMOND)
    assert dag.order == ("a", "b", "c", "d")
    assert dag.in_degrees == {"a": 0, "b": 1, "c": 1, "d": 2}
    assert dag.children == {"a": ("b", "c"), "b": ("d",), "c": ("d",), "d": ()}
    assert dag.parents == {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}
    assert dag.rules == dict.fromkeys("abcd", ALL_SUCCESS)


def test_the_order_is_topological_not_the_requests() -> None:
    dag = validate(_spec(["send", "fetch", "invoice"], [("invoice", "send"), ("fetch", "invoice")]))
    assert dag.order == ("fetch", "invoice", "send")


def test_the_template_is_opaque() -> None:
    spec = WorkflowSpec("w", [WorkflowTaskSpec("a", b"\x00anything", ALL_DONE)], [])
    assert validate(spec).rules == {"a": ALL_DONE}
    assert WorkflowTaskSpec("a", object()).trigger_rule is ALL_SUCCESS


def test_no_tasks() -> None:
    error = _refused(_spec([], []))
    assert (error.field, error.message) == ("tasks", "a workflow needs at least one task")


def test_too_many_tasks_and_edges() -> None:
    assert (MAX_TASKS, MAX_EDGES) == (10_000, 50_000)
    error = _refused(_spec(["a", "b", "c"], []), max_tasks=2)
    assert (error.field, error.message) == ("tasks", "3 tasks is over the limit of 2 per workflow")
    error = _refused(_spec(["a", "b", "c"], [("a", "b"), ("b", "c")]), max_edges=1)
    assert (error.field, error.message) == ("edges", "2 edges is over the limit of 1 per workflow")


def test_sizes_are_checked_before_anything_is_read() -> None:
    # An unknown reference in edges[0] is not reached: the count refuses first.
    error = _refused(_spec(["a"], [("x", "y"), ("y", "z")]), max_edges=1)
    assert error.field == "edges"


def test_a_long_name() -> None:
    spec = WorkflowSpec("n" * 201, [WorkflowTaskSpec("a", None)], [])
    error = _refused(spec)
    assert (error.field, error.message) == ("name", "201 characters is over the limit of 200")
    assert validate(WorkflowSpec("", [WorkflowTaskSpec("a", None)], [])).order == ("a",)


@pytest.mark.parametrize(
    "ref", ["", " a", "a b", "-a", ".a", "_a", "a\n", "é", "a/b", "a>b", "x" * (MAX_REF_LENGTH + 1)]
)
def test_not_a_reference(ref: str) -> None:
    error = _refused(_spec(["ok", ref], []))
    assert error.field == "tasks[1].ref"
    assert error.message.endswith(
        "is not a reference: 1 to 100 letters, digits, '_', '.' or '-', starting with a letter "
        "or digit"
    )
    assert len(error.message) < 200  # a long ref is quoted cut short


@pytest.mark.parametrize("ref", ["a", "A9", "fetch_records", "v1.2-rc", "9", "x" * MAX_REF_LENGTH])
def test_references(ref: str) -> None:
    assert validate(_spec([ref], [])).order == (ref,)


def test_a_repeated_reference() -> None:
    error = _refused(_spec(["a", "b", "c", "b"], []))
    assert (error.field, error.message) == (
        "tasks[3].ref",
        "b is already the reference of tasks[1]",
    )


def test_an_unknown_reference() -> None:
    error = _refused(_spec(["a", "b"], [("a", "b"), ("b", "zz")]))
    assert (error.field, error.message) == ("edges[1].child", "no task has the reference 'zz'")
    error = _refused(_spec(["a", "b"], [("a", "b"), ("a", "b "), ("q", "b")]))
    assert (error.field, error.message) == ("edges[1].child", "no task has the reference 'b '")
    error = _refused(_spec(["a", "b"], [("q", "b")]))
    assert (error.field, error.message) == ("edges[0].parent", "no task has the reference 'q'")


def test_a_self_loop() -> None:
    error = _refused(_spec(["a", "b"], [("a", "b"), ("b", "b")]))
    assert (error.field, error.message) == ("edges[1]", "b -> b: a task cannot depend on itself")


def test_a_repeated_edge() -> None:
    error = _refused(_spec(["a", "b", "c"], [("a", "b"), ("b", "c"), ("a", "b")]))
    assert (error.field, error.message) == ("edges[2]", "a -> b repeats edges[0]")


def test_a_cycle_is_named_in_order_from_its_first_task() -> None:
    error = _refused(_spec(["fetch", "invoice"], [("fetch", "invoice"), ("invoice", "fetch")]))
    assert (error.field, error.message) == ("edges", "a cycle: fetch -> invoice -> fetch")
    # Tasks upstream and downstream of the cycle are not in it; it starts at the first
    # of its tasks in the request, whatever the edges' order.
    spec = _spec(
        ["start", "x", "y", "z", "after"],
        [("z", "x"), ("start", "y"), ("y", "z"), ("x", "y"), ("z", "after")],
    )
    assert _refused(spec).message == "a cycle: x -> y -> z -> x"


def test_one_cycle_of_several() -> None:
    spec = _spec(["a", "b", "c", "d"], [("c", "d"), ("d", "c"), ("a", "b"), ("b", "a")])
    assert _refused(spec).message == "a cycle: a -> b -> a"


def test_a_long_cycle_is_named_short() -> None:
    refs = [f"t{i}" for i in range(5000)]
    edges = [(refs[i], refs[(i + 1) % len(refs)]) for i in range(len(refs))]
    message = _refused(_spec(refs, edges)).message
    assert message == (
        "a cycle of 5000 tasks: t0 -> t1 -> t2 -> t3 -> t4 -> t5 -> t6 -> t7 -> (4992 more) -> t0"
    )
    exactly = _spec(refs[:CYCLE_SHOWN], [*edges[: CYCLE_SHOWN - 1], (refs[CYCLE_SHOWN - 1], "t0")])
    assert _refused(exactly).message == "a cycle: " + " -> ".join([*refs[:CYCLE_SHOWN], "t0"])


def test_trusted_rows() -> None:
    dag = Dag.of({1: ALL_SUCCESS, 2: ALL_DONE, 3: ALL_SUCCESS}, [(2, 3), (1, 2)])
    assert dag.order == (1, 2, 3)
    assert dag.in_degrees == {1: 0, 2: 1, 3: 1}
    with pytest.raises(ValueError, match="cycle"):
        Dag.of({1: ALL_SUCCESS, 2: ALL_SUCCESS}, [(1, 2), (2, 1)])
    with pytest.raises(ValueError, match="not in the graph"):
        Dag.of({1: ALL_SUCCESS}, [(1, 2)])


# ---- validate: properties -------------------------------------------------------------


@dataclass(frozen=True)
class Graph:
    refs: list[str]
    edges: list[tuple[str, str]]
    rules: dict[str, TriggerRule]


@st.composite
def graphs(draw: st.DrawFn, *, max_tasks: int = 200, extra_edges: int = 0) -> Graph:
    """A random DAG (listed in an order that is not topological), plus up to
    ``extra_edges`` random edges that may close cycles."""
    size = draw(st.integers(1, 8) | st.integers(9, max_tasks) | st.just(max_tasks))
    per_task = draw(st.floats(0, 4))
    all_done_share = draw(st.sampled_from([0.0, 0.3, 1.0]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    found: set[tuple[int, int]] = set()
    for _ in range(int(size * per_task) if size > 1 else 0):
        low = rng.randrange(size - 1)
        # Mostly near neighbours: deep chains, not only a shallow tangle.
        span = 3 if rng.random() < 0.5 else size
        found.add((low, rng.randrange(low + 1, min(size, low + 1 + span))))
    for _ in range(draw(st.integers(0, extra_edges)) if size > 1 else 0):
        one, other = rng.sample(range(size), 2)
        found.add((one, other))
    # t0, t1, ... is a topological numbering; the request lists them shuffled.
    refs = [f"t{i}" for i in range(size)]
    edges = [(refs[parent], refs[child]) for parent, child in found]
    rng.shuffle(edges)
    rng.shuffle(refs)
    rules = {ref: ALL_DONE if rng.random() < all_done_share else ALL_SUCCESS for ref in refs}
    return Graph(refs, edges, rules)


def _cycle_free(graph: Graph) -> bool:
    """Independently of Kahn: a depth-first search for a back edge."""
    children: dict[str, list[str]] = {ref: [] for ref in graph.refs}
    for parent, child in graph.edges:
        children[parent].append(child)
    colour = dict.fromkeys(graph.refs, 0)  # 0 unseen, 1 on the path, 2 done
    for start in graph.refs:
        if colour[start]:
            continue
        colour[start] = 1
        stack = [(start, iter(children[start]))]
        while stack:
            node, rest = stack[-1]
            below = next(rest, None)
            if below is None:
                colour[node] = 2
                stack.pop()
            elif colour[below] == 1:
                return False
            elif colour[below] == 0:
                colour[below] = 1
                stack.append((below, iter(children[below])))
    return True


@PROPERTY_SETTINGS
@given(graphs())
def test_every_dag_is_accepted(graph: Graph) -> None:
    dag = validate(_spec(graph.refs, graph.edges, graph.rules))
    assert sorted(dag.order) == sorted(graph.refs)
    position = {ref: i for i, ref in enumerate(dag.order)}
    for parent, child in graph.edges:
        assert position[parent] < position[child]
        assert child in dag.children[parent]
        assert parent in dag.parents[child]
    assert sum(dag.in_degrees.values()) == len(graph.edges)
    assert all(dag.in_degrees[ref] == len(dag.parents[ref]) for ref in graph.refs)
    assert dag.rules == graph.rules
    rebuilt = Dag.of(graph.rules, graph.edges)
    assert (rebuilt.order, rebuilt.parents, rebuilt.children) == (
        dag.order,
        dag.parents,
        dag.children,
    )


@PROPERTY_SETTINGS
@given(graphs(max_tasks=60, extra_edges=6))
def test_a_graph_is_refused_exactly_when_it_has_a_cycle_and_the_cycle_is_real(
    graph: Graph,
) -> None:
    spec = _spec(graph.refs, graph.edges, graph.rules)
    if _cycle_free(graph):
        event("acyclic")
        validate(spec)
        return
    error = _refused(spec)
    event("a cycle named in full" if error.message.startswith("a cycle: ") else "a long cycle")
    assert error.field == "edges"
    edges = set(graph.edges)
    if error.message.startswith("a cycle: "):
        named = error.message.removeprefix("a cycle: ").split(" -> ")
        assert named[0] == named[-1]
        assert len(set(named[:-1])) == len(named) - 1  # a simple cycle
    else:
        head, _, tail = error.message.partition(": ")
        length = int(head.removeprefix("a cycle of ").removesuffix(" tasks"))
        assert length > CYCLE_SHOWN
        shown_part, _, last = tail.partition(f" -> ({length - (CYCLE_SHOWN - 2)} more) -> ")
        named = shown_part.split(" -> ")
        assert last == named[0]
    assert all((named[i], named[i + 1]) in edges for i in range(len(named) - 1))


def test_validate_is_fast_enough_for_the_limits() -> None:
    """10,000 tasks and 50,000 edges (measured: ~0.06 s; no timing is asserted)."""
    rng = random.Random(16)
    refs = [f"task-{i}" for i in range(MAX_TASKS)]
    edges: set[tuple[str, str]] = set()
    while len(edges) < MAX_EDGES:
        low = rng.randrange(MAX_TASKS - 1)
        edges.add((refs[low], refs[rng.randrange(low + 1, min(MAX_TASKS, low + 40))]))
    dag = validate(_spec(refs, sorted(edges)))
    assert len(dag.order) == MAX_TASKS


# ---- unlock: examples -----------------------------------------------------------------


def _done(parent: str, status: TaskStatus, cause: str | None = None) -> ParentOutcome[str]:
    return ParentOutcome(parent, status, cause)


def test_all_success_waits_for_every_parent() -> None:
    assert unlock(ALL_SUCCESS, 2, []) == Unlock(Readiness.WAITING)
    assert unlock(ALL_SUCCESS, 2, [_done("b", S.COMPLETED)]) == Unlock(Readiness.WAITING)
    both = [_done("b", S.COMPLETED), _done("c", S.COMPLETED)]
    assert unlock(ALL_SUCCESS, 2, both) == Unlock(Readiness.READY)
    assert unlock(ALL_SUCCESS, 0, []) == Unlock(Readiness.READY)


def test_all_success_fails_at_the_first_failure_without_waiting_for_the_rest() -> None:
    # c has not finished: d is decided anyway, with the cause b.
    assert unlock(ALL_SUCCESS, 2, [_done("b", S.DEAD_LETTER)]) == Unlock(
        Readiness.UPSTREAM_FAILED, "b"
    )
    later = [_done("c", S.COMPLETED), _done("b", S.CANCELLED), _done("e", S.DEAD_LETTER)]
    assert unlock(ALL_SUCCESS, 3, later) == Unlock(Readiness.UPSTREAM_FAILED, "b")


def test_an_upstream_failure_passes_its_cause_down() -> None:
    outcome = _done("d", S.UPSTREAM_FAILED, cause="b")
    assert outcome.failure == "b"
    assert unlock(ALL_SUCCESS, 1, [outcome]) == Unlock(Readiness.UPSTREAM_FAILED, "b")


def test_all_done_runs_after_any_outcomes() -> None:
    some = [_done("b", S.DEAD_LETTER), _done("c", S.UPSTREAM_FAILED, "a")]
    assert unlock(ALL_DONE, 3, some) == Unlock(Readiness.WAITING)
    every = [*some, _done("e", S.CANCELLED)]
    assert unlock(ALL_DONE, 3, every) == Unlock(Readiness.READY)


def test_outcomes_that_cannot_be() -> None:
    with pytest.raises(ValueError, match="not terminal"):
        _done("b", S.RUNNING)
    with pytest.raises(ValueError, match="only with it"):
        _done("b", S.UPSTREAM_FAILED)
    with pytest.raises(ValueError, match="only with it"):
        _done("b", S.DEAD_LETTER, cause="a")
    with pytest.raises(ValueError, match="counted twice"):
        unlock(ALL_DONE, 2, [_done("b", S.COMPLETED), _done("b", S.COMPLETED)])
    with pytest.raises(ValueError, match="2 outcomes for 1 parents"):
        unlock(ALL_DONE, 1, [_done("b", S.COMPLETED), _done("c", S.COMPLETED)])


# ---- propagation: examples ------------------------------------------------------------


def _statuses(dag: Dag[str], **known: TaskStatus) -> dict[str, TaskStatus]:
    return {ref: known.get(ref, S.SCHEDULED) for ref in dag.order}


def test_a_failure_fails_its_all_success_chain_with_one_cause() -> None:
    dag = validate(_spec(list("abcde"), [("a", "b"), ("b", "c"), ("c", "d"), ("a", "e")]))
    statuses = _statuses(dag, a=S.DEAD_LETTER)
    assert upstream_failures(dag, ["a"], statuses) == dict.fromkeys("bcde", "a")
    statuses = _statuses(dag, a=S.COMPLETED, b=S.CANCELLED, e=S.RUNNING)
    assert upstream_failures(dag, ["b"], statuses) == {"c": "b", "d": "b"}


def test_the_diamond_with_a_failing_branch() -> None:
    spec = _spec(["a", "b", "c", "d"], DIAMOND.edges)
    dag = validate(spec)
    statuses = _statuses(dag, a=S.COMPLETED, b=S.DEAD_LETTER, c=S.RUNNING)
    assert upstream_failures(dag, ["b"], statuses) == {"d": "b"}
    # All_done: d is not failed; its counter moves (b is terminal) and it runs after c.
    dag = validate(_spec(["a", "b", "c", "d"], DIAMOND.edges, {"d": ALL_DONE}))
    assert upstream_failures(dag, ["b"], statuses) == {}
    assert released_by(dag, ["b"]) == {"d": 1}


def test_all_done_stops_the_walk() -> None:
    dag = validate(_spec(list("abcd"), [("a", "b"), ("b", "c"), ("c", "d")], {"c": ALL_DONE}))
    statuses = _statuses(dag, a=S.DEAD_LETTER)
    assert upstream_failures(dag, ["a"], statuses) == {"b": "a"}
    # Writing b terminal releases c; d waits for c, which will run.
    assert released_by(dag, ["a", "b"]) == {"b": 1, "c": 1}


def test_a_decided_task_keeps_its_cause() -> None:
    dag = validate(_spec(list("xyab"), [("x", "a"), ("y", "a"), ("a", "b")]))
    first = upstream_failures(dag, ["x"], _statuses(dag, x=S.DEAD_LETTER))
    assert first == {"a": "x", "b": "x"}
    later = _statuses(
        dag, x=S.DEAD_LETTER, y=S.DEAD_LETTER, a=S.UPSTREAM_FAILED, b=S.UPSTREAM_FAILED
    )
    assert upstream_failures(dag, ["y"], later) == {}


def test_several_failures_at_once_take_the_first_given() -> None:
    dag = validate(_spec(list("xyab"), [("x", "a"), ("y", "a"), ("y", "b")]))
    statuses = _statuses(dag, x=S.DEAD_LETTER, y=S.CANCELLED)
    assert upstream_failures(dag, ["x", "y"], statuses) == {"a": "x", "b": "y"}
    assert upstream_failures(dag, ["y", "x"], statuses) == {"a": "y", "b": "y"}


def test_a_failed_task_read_as_scheduled_is_not_marked() -> None:
    # y, waiting below x, is cancelled in the same transaction that dead-letters x.
    dag = validate(_spec(list("xyz"), [("x", "y"), ("y", "z")]))
    statuses = _statuses(dag, x=S.RUNNING)
    assert upstream_failures(dag, ["x", "y"], statuses) == {"z": "y"}


def test_concurrent_failures_release_only_what_each_wrote() -> None:
    """x and y fail in two transactions that read the same snapshot; both plan a (below
    both), whose all_done child z must lose one, not two. The store's guard writes a for
    the first only, and each releases what it wrote."""
    dag = validate(_spec(list("xyaz"), [("x", "a"), ("y", "a"), ("a", "z")], {"z": ALL_DONE}))
    snapshot = _statuses(dag, x=S.RUNNING, y=S.RUNNING)
    plan_x = upstream_failures(dag, ["x"], snapshot)
    plan_y = upstream_failures(dag, ["y"], snapshot)
    assert plan_x == {"a": "x"} and plan_y == {"a": "y"}
    rows = dict(snapshot)
    unresolved = dict(dag.in_degrees)
    for failed, plan in (("x", plan_x), ("y", plan_y)):
        rows[failed] = S.DEAD_LETTER
        written = [task for task in plan if rows[task] is S.SCHEDULED]
        rows.update(dict.fromkeys(written, S.UPSTREAM_FAILED))
        for child, count in released_by(dag, [failed, *written]).items():
            if rows[child] is S.SCHEDULED:
                unresolved[child] -= count
    assert unresolved["z"] == 0
    # Releasing by the plans instead would have taken z to -1.
    assert dag.in_degrees["z"] - released_by(dag, [*plan_x, *plan_y])["z"] == -1


# ---- the run's state --------------------------------------------------------------------


def test_run_states() -> None:
    assert run_state([S.COMPLETED, S.COMPLETED]) is RunState.SUCCEEDED
    assert run_state([S.COMPLETED, S.RUNNING]) is RunState.RUNNING
    assert run_state([S.DEAD_LETTER, S.OUTCOME_UNKNOWN]) is RunState.RUNNING
    assert run_state([S.COMPLETED, S.UPSTREAM_FAILED]) is RunState.FAILED
    assert run_state([S.CANCELLED, S.DEAD_LETTER]) is RunState.FAILED
    assert run_state([S.COMPLETED, S.CANCELLED]) is RunState.CANCELLED


# ---- retry: examples ------------------------------------------------------------------


def test_retry_the_diamond_from_its_failure() -> None:
    dag = validate(DIAMOND)
    statuses = _statuses(dag, a=S.COMPLETED, b=S.DEAD_LETTER, c=S.COMPLETED, d=S.UPSTREAM_FAILED)
    plan = plan_retry(dag, statuses)
    assert plan == RetryPlan(reopened={"b": 0, "d": 1}, kept=frozenset({"a", "c"}))
    assert plan.ready == ("b",)


def test_retry_keeps_an_all_done_task_that_completed() -> None:
    dag = validate(_spec(list("abc"), [("a", "b"), ("b", "c")], {"b": ALL_DONE}))
    plan = plan_retry(dag, _statuses(dag, a=S.CANCELLED, b=S.COMPLETED, c=S.COMPLETED))
    assert plan.reopened == {"a": 0}
    assert plan.kept == {"b", "c"}


def test_retry_a_run_that_succeeded_or_still_runs() -> None:
    dag = validate(DIAMOND)
    assert plan_retry(dag, dict.fromkeys("abcd", S.COMPLETED)).reopened == {}
    with pytest.raises(ValueError, match="2 tasks are not terminal, 'c' first"):
        plan_retry(dag, _statuses(dag, a=S.COMPLETED, b=S.DEAD_LETTER, c=S.RUNNING, d=S.SCHEDULED))


# ---- a run over a simulated store -----------------------------------------------------


@dataclass
class Store:
    """The rows of one workflow and the writes the store makes, applied one transaction
    at a time; concurrent transactions plan from the snapshot they all read."""

    dag: Dag[str]
    status: dict[str, TaskStatus] = field(init=False)
    unresolved: dict[str, int] = field(init=False)
    cause: dict[str, str] = field(default_factory=dict)
    heard: dict[str, list[ParentOutcome[str]]] = field(init=False)
    """Each task's parents' outcomes in the order their writes landed."""
    due: list[str] = field(default_factory=list)
    made_due: Counter[str] = field(default_factory=Counter)
    runs: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.status = dict.fromkeys(self.dag.order, S.SCHEDULED)
        self.unresolved = dict(self.dag.in_degrees)
        self.heard = {task: [] for task in self.dag.order}
        for task in self.dag.order:
            if self.unresolved[task] == 0:
                self._make_due(task)

    def _make_due(self, task: str) -> None:
        self.made_due[task] += 1
        assert self.made_due[task] == 1, f"{task} made due twice"
        parents = [self.status[parent] for parent in self.dag.parents[task]]
        if self.dag.rules[task] is ALL_SUCCESS:
            assert all(status is S.COMPLETED for status in parents)
        else:
            assert all(status in TERMINAL for status in parents)
        readiness = unlock(self.dag.rules[task], self.dag.in_degrees[task], self.heard[task])
        assert readiness == Unlock(Readiness.READY)
        self.due.append(task)

    def _terminal(self, task: str, status: TaskStatus) -> None:
        self.status[task] = status
        outcome = ParentOutcome(task, status, self.cause.get(task))
        for child in self.dag.children[task]:
            self.heard[child].append(outcome)

    def plan(self, task: str, outcome: TaskStatus) -> dict[str, str]:
        """What the transaction settling ``task`` computes from what it read."""
        if outcome is S.COMPLETED:
            return {}
        return upstream_failures(self.dag, [task], self.status)

    def settle(self, task: str, outcome: TaskStatus, plan: Mapping[str, str]) -> None:
        """The transaction: the task's own write, the guarded failures, the releases."""
        assert self.status[task] is S.RUNNING
        self._terminal(task, outcome)
        written = [child for child in plan if self.status[child] is S.SCHEDULED]
        if len(written) < len(plan):
            event("a concurrent failure wrote part of a plan first")
        for child in written:
            self.cause[child] = plan[child]
            expected = Unlock(Readiness.UPSTREAM_FAILED, plan[child])
            rule = self.dag.rules[child]
            assert unlock(rule, self.dag.in_degrees[child], self.heard[child]) == expected
            self._terminal(child, S.UPSTREAM_FAILED)
        for child, count in released_by(self.dag, [task, *written]).items():
            if self.status[child] is not S.SCHEDULED:
                continue
            self.unresolved[child] -= count
            assert self.unresolved[child] >= 0, f"{child}: a decrement doubled"
            if self.unresolved[child] == 0:
                self._make_due(child)

    def run(
        self, rng: random.Random, outcomes: Mapping[str, TaskStatus], *, at_once: int = 4
    ) -> None:
        """Start due tasks and settle running ones in random order, up to ``at_once``
        transactions at a time planned from one snapshot (READ COMMITTED: each read
        before the others committed; each guarded write sees the rows as they are)."""
        running: list[str] = []
        while self.due or running:
            rng.shuffle(self.due)
            for _ in range(rng.randint(1 if not running else 0, len(self.due))):
                task = self.due.pop()
                self.status[task] = S.RUNNING
                self.runs[task] += 1
                running.append(task)
            rng.shuffle(running)
            batch = [running.pop() for _ in range(min(len(running), rng.randint(1, at_once)))]
            plans = [(task, outcomes[task], self.plan(task, outcomes[task])) for task in batch]
            for task, outcome, plan in plans:
                self.settle(task, outcome, plan)


def _expected(dag: Dag[str], outcomes: Mapping[str, TaskStatus]) -> dict[str, TaskStatus]:
    """The final statuses by the rules alone, in topological order."""
    final: dict[str, TaskStatus] = {}
    for task in dag.order:
        parents = [final[parent] for parent in dag.parents[task]]
        if dag.rules[task] is ALL_SUCCESS and any(status is not S.COMPLETED for status in parents):
            final[task] = S.UPSTREAM_FAILED
        else:
            final[task] = outcomes[task]
    return final


def _ancestors_through_failures(store: Store, task: str) -> set[str]:
    """The tasks above ``task`` along paths whose inner tasks are all UPSTREAM_FAILED."""
    found: set[str] = set()
    stack = [task]
    while stack:
        for parent in store.dag.parents[stack.pop()]:
            if parent not in found:
                found.add(parent)
                if store.status[parent] is S.UPSTREAM_FAILED:
                    stack.append(parent)
    return found


@dataclass(frozen=True)
class Run:
    graph: Graph
    outcomes: dict[str, TaskStatus]
    rng: random.Random
    at_once: int


@st.composite
def runs(draw: st.DrawFn) -> Run:
    graph = draw(graphs())
    rng = random.Random(draw(st.integers(0, 2**32)))
    failing = draw(st.sampled_from([0.0, 0.05, 0.2, 0.6]))
    outcomes = {
        ref: rng.choice([S.DEAD_LETTER, S.CANCELLED]) if rng.random() < failing else S.COMPLETED
        for ref in graph.refs
    }
    # 200 at once: every running task settles from one snapshot, the stalest plans.
    return Run(graph, outcomes, rng, draw(st.sampled_from([1, 4, 200])))


@PROPERTY_SETTINGS
@given(runs())
def test_a_run_unlocks_each_task_once_and_fails_exactly_the_right_ones(
    case: Run,
) -> None:
    graph, outcomes, rng = case.graph, case.outcomes, case.rng
    dag = validate(_spec(graph.refs, graph.edges, graph.rules))
    store = Store(dag)
    store.run(rng, outcomes, at_once=case.at_once)
    # Nothing is left waiting: no decrement was lost (a doubled one failed an assert).
    assert all(status in TERMINAL for status in store.status.values())
    assert store.status == _expected(dag, outcomes)
    if S.UPSTREAM_FAILED in store.status.values():
        event("some task upstream-failed")
    if any(dag.rules[t] is ALL_DONE and store.runs[t] for t in dag.order if dag.parents[t]):
        event("an all_done task with parents ran")
    for task in dag.order:
        ran = store.status[task] is not S.UPSTREAM_FAILED
        assert store.runs[task] == store.made_due[task] == (1 if ran else 0)
        if ran:
            assert store.unresolved[task] == 0
        else:
            cause = store.cause[task]
            assert store.status[cause] in {S.DEAD_LETTER, S.CANCELLED}
            assert cause in _ancestors_through_failures(store, task)


@PROPERTY_SETTINGS
@given(runs())
def test_a_retry_reruns_each_failed_task_once_and_succeeds(
    case: Run,
) -> None:
    graph, outcomes, rng = case.graph, case.outcomes, case.rng
    dag = validate(_spec(graph.refs, graph.edges, graph.rules))
    store = Store(dag)
    store.run(rng, outcomes, at_once=case.at_once)
    before = dict(store.status)
    plan = plan_retry(dag, before)

    # The brief's definition: the failures and everything below them that did not succeed.
    failures = {task for task, status in before.items() if status in FAILING}
    below: set[str] = set()
    stack = list(failures)
    while stack:
        for child in dag.children[stack.pop()]:
            if child not in below and before[child] is not S.COMPLETED:
                below.add(child)
                stack.append(child)
    assert set(plan.reopened) == failures | below
    assert plan.kept == {task for task, status in before.items() if status is S.COMPLETED}
    assert list(plan.reopened) == [task for task in dag.order if task in plan.reopened]

    # Apply it as the store would: reopened rows SCHEDULED with their new counters and no
    # cause; each reopened task has heard only from its kept parents.
    store.runs.clear()
    store.made_due.clear()
    store.due.clear()
    for task, unresolved in plan.reopened.items():
        store.status[task] = S.SCHEDULED
        store.unresolved[task] = unresolved
        store.cause.pop(task, None)
        store.heard[task] = [
            ParentOutcome(parent, S.COMPLETED)
            for parent in dag.parents[task]
            if parent in plan.kept
        ]
        assert unresolved == dag.in_degrees[task] - len(store.heard[task])
    for task in plan.ready:
        store._make_due(task)
    store.run(rng, dict.fromkeys(dag.order, S.COMPLETED), at_once=case.at_once)

    assert set(store.status.values()) == {S.COMPLETED}
    assert run_state(set(store.status.values())) is RunState.SUCCEEDED
    for task in dag.order:
        assert store.runs[task] == (1 if task in plan.reopened else 0)


# ---- what a dispatched child carries ----------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.text(max_size=30)), max_size=20),
    st.integers(min_value=0, max_value=200),
)
def test_parents_results_are_carried_as_a_prefix_within_the_bound(
    results: list[str | None], max_bytes: int
) -> None:
    parents = [
        Parent(uuid.uuid4(), f"p{i}", TaskStatus.COMPLETED, result)
        for i, result in enumerate(results)
    ]
    carried = bounded_results(parents, max_bytes)
    assert [parent for parent, _ in carried] == parents  # every parent, in order
    flags = [fits for _, fits in carried]
    assert flags == sorted(flags, reverse=True)  # the carried ones are the first N
    size = sum(len((p.result_json or "").encode()) for p, fits in carried if fits)
    assert size <= max_bytes
    left_out = next((p for p, fits in carried if not fits), None)
    if left_out is not None:  # the first one left out did not fit
        assert size + len((left_out.result_json or "").encode()) > max_bytes
