"""DAG workflows (issue 16): what a workflow's tasks and edges cost over plain tasks, and
how long a finished parent takes to start its child.

Every variant runs on its own node: one scheduler process on a fresh database
(PostgreSQL as the rest of the suite: fsync on) and two worker processes running
``bench.record`` (``bench/bench_workers.py``: notes its start in the ``effects`` ledger
with a buffered COPY, then returns), the same handler and payload in every variant, all
tasks ``strict_timing`` (no jitter: each is due the moment it may run).

* ``flat``: ``--tasks`` plain tasks due now, submitted as the stampede does
  (``SubmitBatch`` calls of 1,000, 2 in flight; ``bench/timing.py``).
* ``dag``: the same number of tasks as one workflow (one ``CreateWorkflow`` call),
  *layered*: a root, then layers of ``--width`` tasks, task ``j`` of a layer depending on
  tasks ``j, j+1, ..., j+P-1`` (mod the width) of the layer before, P = ``--parents``
  (default 2). The first layer has only the root as its parent, so 10,000 tasks at width
  100 are 101 layers and 100 + 9,899 × 2 = 19,898 edges.
* ``dag-x2``: the same tasks and layers with 2P parents each (39,696 edges at the
  defaults): the difference from ``dag`` is the cost of the extra edges alone.
* ``chain``: ``--chain`` tasks (200), each depending on the one before (width 1): one
  task ready at a time, so each edge's unlock latency is measured without contention.

Per variant: the create's wall time (the ``CreateWorkflow`` call, or all the batch
submits) and the CPU this process spent in it; create → last completion (from the
create's start to the latest ``tasks.finished_at``); CPU seconds (``/proc/<pid>/stat``)
of the node, each worker and PostgreSQL (every process of the server) from just before
the create until the run was seen finished (polled every 50 ms: ``workflow_runs.state``,
one row, for a workflow; a count of completed tasks for ``flat``). Derived:

* extra node + PostgreSQL CPU per task of a DAG over flat: ``(cpu_dag − cpu_flat) /
  tasks`` (this includes the task's ~P edges);
* per edge: ``(cpu_dag-x2 − cpu_dag) / (edges_dag-x2 − edges_dag)``; and per task
  without its edges: the first minus P × the second.

A DAG's layers run one after another, so its wall time is bounded by its depth times the
time one layer takes; the overhead figures are therefore CPU, not wall time. The node's
idle CPU (measured over ``--idle-s`` before each create) is reported so that the part of
the difference that is only the longer wall time can be judged.

*Unlock latency* of an edge: the child's handler start (``effects.started_at``, the
worker's clock) − the ``finished_at`` of its last-finishing parent, the one whose
completion released it (PostgreSQL's ``now()`` in the completion's transaction; one
machine, one clock). The release is that transaction too (it sets the child's ``due_at``
to the same ``now()``), so the latency splits into finished → intent
(``task_attempts.entered_at``: the commit, the node's preload pass, wheel and dispatch
transaction) and intent → handler start (its commit, the send, the SDK).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import uvloop
from harness.history import History

from bench import timing
from bench._cluster import Infrastructure, Node, cpu_used, node
from bench._report import Report, Target, ms, percentile
from chronoshard import Client, TaskSpec, WorkflowTask

WORKERS = timing.WORKERS
TASK_TYPE = "bench.record"
POLL_S = 0.05
# A 10,000-task create is one transaction of 10,000 task rows and up to 50,000 edges: it
# must not meet the client's default 10 s deadline on a loaded machine.
CREATE_TIMEOUT_S = 300.0
IDLE_S = 2.0
VARIANTS = ("flat", "dag", "dag-x2", "chain")


@dataclass(frozen=True)
class Shape:
    """A layered DAG: task refs, edges (parent, child) and the number of layers."""

    refs: list[str]
    edges: list[tuple[str, str]]
    depth: int


def layered(tasks: int, width: int, parents: int) -> Shape:
    """A root, then layers of ``width`` tasks, task ``j`` of a layer depending on tasks
    ``j .. j+parents-1`` (mod the previous layer's size) of the layer before; a chain
    is ``width=1, parents=1``."""
    if tasks < 1 or width < 1 or parents < 1:
        raise ValueError("tasks, width and parents must be at least 1")
    refs = [f"t{i}" for i in range(tasks)]
    edges: list[tuple[str, str]] = []
    previous, depth, i = [refs[0]], 1, 1
    while i < tasks:
        layer = refs[i : i + width]
        for j, child in enumerate(layer):
            # Fewer distinct parents when the layer before is smaller (the root's).
            for parent in dict.fromkeys(previous[(j + k) % len(previous)] for k in range(parents)):
                edges.append((parent, child))
        previous, depth, i = layer, depth + 1, i + len(layer)
    return Shape(refs, edges, depth)


def _spec(i: int) -> TaskSpec:
    # The payload the stampede's submits carry (bench/timing.py), so both variants send
    # and store the same bytes per task.
    return TaskSpec(type=TASK_TYPE, payload={"i": i, "ms": 0.0}, strict_timing=True)


@dataclass
class Created:
    started_at: datetime
    seconds: float
    client_cpu_s: float
    workflow_id: uuid.UUID | None  # None for flat


async def _create_workflow(n: Node, name: str, shape: Shape) -> uuid.UUID:
    tasks = [WorkflowTask(ref, _spec(i)) for i, ref in enumerate(shape.refs)]
    async with Client(n.address, api_key=n.api_key, timeout_s=CREATE_TIMEOUT_S) as client:
        result = await client.create_workflow(name, tasks, shape.edges)
    return uuid.UUID(result.workflow.id)


def create(n: Node, variant: str, shape: Shape) -> Created:
    """Submit the variant's tasks (flat: batches; else one workflow), timed."""
    started_at, t0, c0 = datetime.now(UTC), time.perf_counter(), time.process_time()
    workflow_id = None
    if variant == "flat":
        # The stampede's submit loop, every task due now (a past instant runs at once).
        uvloop.run(timing._submit(n, [started_at] * len(shape.refs), History(), 0.0))
    else:
        workflow_id = uvloop.run(_create_workflow(n, f"bench-{variant}", shape))
    return Created(started_at, time.perf_counter() - t0, time.process_time() - c0, workflow_id)


def _one(dsn: str, sql: str, params: Any = None) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def wait_finished(n: Node, created: Created, tasks: int, timeout_s: float) -> bool:
    """Whether the run finished within ``timeout_s``; polls one row for a workflow (a
    count over every task would charge PostgreSQL a scan per poll)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(n.dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if created.workflow_id is not None:
                row = conn.execute(
                    "SELECT state <> 'RUNNING' FROM workflow_runs WHERE id = %s",
                    (created.workflow_id,),
                ).fetchone()
                done = bool(row and row[0])
            else:
                row = conn.execute(
                    "SELECT count(*) FROM tasks WHERE status = 'COMPLETED'"
                ).fetchone()
                done = row is not None and int(row[0]) >= tasks
            if done:
                return True
            time.sleep(POLL_S)
    return False


@dataclass
class Outcome:
    completed: int
    ran: int  # successful handler runs in the ledger
    distinct: int  # of distinct tasks
    last_completion: datetime | None
    state: str  # the workflow's, or "—"


def read_outcome(n: Node, created: Created, tasks: int) -> Outcome:
    timing._wait_ledger(n.dsn, tasks, datetime.min.replace(tzinfo=UTC))
    with psycopg.connect(n.dsn) as conn:
        completed, last = conn.execute(
            "SELECT count(*), max(finished_at) FROM tasks WHERE status = 'COMPLETED'"
        ).fetchone() or (0, None)
        ran, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT task_id) FROM effects WHERE outcome = 'ok'"
        ).fetchone() or (0, 0)
        state = "—"
        if created.workflow_id is not None:
            row = conn.execute(
                "SELECT state FROM workflow_runs WHERE id = %s", (created.workflow_id,)
            ).fetchone()
            state = "?" if row is None else str(row[0])
    return Outcome(int(completed), int(ran), int(distinct), last, state)


@dataclass
class Unlocks:
    total_s: list[float]  # child start − releasing parent's finished_at
    dispatched_s: list[float]  # intent − that finished_at
    started_s: list[float]  # handler start − intent


UNLOCKS_SQL = """
WITH released AS (
    SELECT d.child_task_id AS child, max(p.finished_at) AS parent_done
    FROM task_dependencies AS d
    JOIN tasks AS p ON p.id = d.parent_task_id
    WHERE d.workflow_id = %(w)s
    GROUP BY d.child_task_id
), starts AS (
    SELECT task_id, min(started_at) AS started_at FROM effects
    WHERE outcome = 'ok' GROUP BY task_id
)
SELECT extract(epoch FROM s.started_at - r.parent_done),
       extract(epoch FROM a.entered_at - r.parent_done),
       extract(epoch FROM s.started_at - a.entered_at)
FROM released AS r
JOIN starts AS s ON s.task_id = r.child
JOIN task_attempts AS a ON a.task_id = r.child AND a.attempt = 1
"""


def read_unlocks(dsn: str, workflow_id: uuid.UUID) -> Unlocks:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(UNLOCKS_SQL, {"w": workflow_id}).fetchall()
    columns = [[float(v) for v in column] for column in zip(*rows, strict=True)] or [[]] * 3
    return Unlocks(*columns)


def _cpu(
    before: Mapping[str, Mapping[int, float]], after: Mapping[str, Mapping[int, float]]
) -> dict[str, float]:
    return {k: cpu_used(before[k], after[k]) for k in before}


def _idle_rate(n: Node, seconds: float) -> float:
    """Node + PostgreSQL CPU seconds per second with nothing to do."""
    if seconds <= 0:
        return math.nan
    before = n.cpu_snapshot()
    time.sleep(seconds)
    cpu = _cpu(before, n.cpu_snapshot())
    return (cpu["scheduler"] + cpu["postgres"]) / seconds


def _triple(samples: list[float]) -> str:
    return " / ".join(
        ms(v)
        for v in (percentile(samples, 50), percentile(samples, 99), max(samples, default=math.nan))
    )


def run_variant(
    infra: Infrastructure, variant: str, shape: Shape, slots: int, idle_s: float
) -> tuple[dict[str, Any], list[str]]:
    """One variant on its own node and database: its row, and its notes."""
    tasks = len(shape.refs)
    notes: list[str] = []
    with node(
        infra, f"workflows_{variant}", env=timing._env(None), workers=WORKERS, slots=slots
    ) as n:
        idle_rate = _idle_rate(n, idle_s)
        cpu0 = n.cpu_snapshot()
        created = create(n, variant, shape)
        cpu_create = _cpu(cpu0, n.cpu_snapshot())
        finished = wait_finished(n, created, tasks, timeout_s=max(120.0, tasks / 20))
        cpu1 = n.cpu_snapshot()
        outcome = read_outcome(n, created, tasks)
        unlocks = (
            read_unlocks(n.dsn, created.workflow_id)
            if created.workflow_id is not None
            else Unlocks([], [], [])
        )
        if not finished:
            notes.append(f"{variant}: NOT finished in time; node log: {n.group.logs()[-1500:]}")
    wall = (
        (outcome.last_completion - created.started_at).total_seconds()
        if outcome.last_completion is not None
        else math.nan
    )
    cpu = _cpu(cpu0, cpu1)
    per_worker = [c - cpu0["workers"].get(pid, 0.0) for pid, c in sorted(cpu1["workers"].items())]
    node_pg = cpu["scheduler"] + cpu["postgres"]
    row: dict[str, Any] = {
        "variant": variant,
        "tasks": tasks,
        "edges": len(shape.edges),
        "layers": shape.depth,
        "create s": created.seconds,
        "create client CPU s": created.client_cpu_s,
        "create node+PG CPU s": cpu_create["scheduler"] + cpu_create["postgres"],
        "create → last completion s": wall,
        "ms per layer": (wall - created.seconds) / shape.depth * 1000
        if variant != "flat"
        else math.nan,
        "node CPU s": cpu["scheduler"],
        "worker CPU s (each)": " / ".join(f"{c:.2f}" for c in per_worker),
        "PG CPU s": cpu["postgres"],
        "node+PG CPU s": node_pg,
        "idle node+PG CPU s/s": idle_rate,
        "unlock p50 / p99 / max": _triple(unlocks.total_s),
        "finished → intent p50 / p99": " / ".join(
            ms(percentile(unlocks.dispatched_s, q)) for q in (50, 99)
        ),
        "intent → start p50 / p99": " / ".join(
            ms(percentile(unlocks.started_s, q)) for q in (50, 99)
        ),
        "state": outcome.state,
        "none lost or doubled": outcome.completed == outcome.ran == outcome.distinct == tasks,
    }
    if not row["none lost or doubled"]:
        notes.append(
            f"{variant}: {outcome.completed:,} completed, {outcome.ran:,} handler runs of "
            f"{outcome.distinct:,} distinct tasks, {tasks:,} expected"
        )
    return row, notes


def derive(rows: list[dict[str, Any]]) -> list[str]:
    """Add the overhead over ``flat`` to the DAG rows; the formulas as notes."""
    by = {r["variant"]: r for r in rows}
    flat, dag, wide = by.get("flat"), by.get("dag"), by.get("dag-x2")
    notes: list[str] = []
    for r in rows:
        r["node+PG µs/task over flat"] = math.nan
        r["node+PG µs/edge"] = math.nan
    if flat is None:
        return notes
    for d in (dag, wide):
        if d is not None and d["tasks"] == flat["tasks"]:
            d["node+PG µs/task over flat"] = (
                (d["node+PG CPU s"] - flat["node+PG CPU s"]) / d["tasks"] * 1e6
            )
    if dag is not None and wide is not None and wide["edges"] > dag["edges"]:
        per_edge = (wide["node+PG CPU s"] - dag["node+PG CPU s"]) / (wide["edges"] - dag["edges"])
        wide["node+PG µs/edge"] = per_edge * 1e6
        per_task = dag["node+PG µs/task over flat"]
        notes.append(
            f"node+PG CPU per edge = (dag-x2 − dag) / (edges dag-x2 − edges dag) = "
            f"({wide['node+PG CPU s']:.2f} − {dag['node+PG CPU s']:.2f}) s / "
            f"{wide['edges'] - dag['edges']:,} = {per_edge * 1e6:.1f} µs; per DAG task "
            f"without its edges = (dag − flat) / tasks − edges per task × per edge = "
            f"{per_task:.1f} − {dag['edges'] / dag['tasks']:.2f} × {per_edge * 1e6:.1f} = "
            f"{per_task - dag['edges'] / dag['tasks'] * per_edge * 1e6:.1f} µs"
        )
    return notes


def workflows(
    infra: Infrastructure,
    tasks: int,
    width: int,
    parents: int,
    chain: int,
    variants: list[str],
    slots: int,
    idle_s: float,
) -> Report:
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    shapes = {
        # The same tasks, no edges.
        "flat": Shape(layered(tasks, width, parents).refs, [], 1),
        "dag": layered(tasks, width, parents),
        "dag-x2": layered(tasks, width, 2 * parents),
        "chain": layered(chain, 1, 1),
    }
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for variant in variants:
        if variant == "chain" and chain < 2:
            continue
        row, variant_notes = run_variant(infra, variant, shapes[variant], slots, idle_s)
        rows.append(row)
        notes += variant_notes
    notes += derive(rows)
    notes.append(
        "µs/task over flat = (node+PG CPU of the DAG − of flat) / tasks, with the task's "
        "edges; µs/edge = (dag-x2 − dag) / edge difference. CPU from just before the "
        "create until the run was seen finished; PG is every process of the server. "
        "unlock = child handler start − finished_at of the parent that released it "
        "(its last); ms per layer = (create → last completion − create) / layers."
    )
    return Report(
        workload="workflows",
        command="",
        parameters={
            "tasks": tasks,
            "width": width,
            "parents per task": f"{parents} (dag), {2 * parents} (dag-x2)",
            "chain": chain,
            "variants": ",".join(variants),
            "worker processes": WORKERS,
            "slots per worker": slots,
            "handler": f"{TASK_TYPE}, strict_timing",
            "flat submit": (
                f"SubmitBatch of {timing.SUBMIT_BATCH}, {timing.SUBMIT_CONCURRENCY} in flight"
            ),
        },
        columns=list(rows[0]),
        rows=rows,
        targets=[
            Target(f"{r['variant']}: every task ran once", bool(r["none lost or doubled"]), "")
            for r in rows
        ],
        notes=notes,
    )
