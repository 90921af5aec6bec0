"""``chronoshard workflows``' pure parts: a workflow file (JSON or YAML) read into the
client's types, every problem named by its place in the file, and the layered drawing
of a DAG (its layout property-tested). No server: values in, values or strings out."""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard import cli
from chronoshard._cli import workflows
from chronoshard._cli.common import UsageError
from chronoshard._cli.workflows import (
    WorkflowFile,
    draw_dag,
    layers,
    load_document,
    parse_workflow_document,
    read_workflow_file,
)
from chronoshard.types import (
    JitterMode,
    Priority,
    RetryPolicy,
    Task,
    TaskSpec,
    TaskStatus,
    TriggerRule,
    Workflow,
    WorkflowCreateResult,
    WorkflowDetail,
    WorkflowEdge,
    WorkflowState,
    WorkflowTask,
    WorkflowTaskState,
)

T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

DOCUMENTED_YAML = """\
# Every task option once (docs/client.md#workflow-files has a shorter example).
name: nightly-etl
delay: 30s
idempotency_key: etl-2030-01-02
tasks:
  - ref: fetch
    type: records.fetch
    payload: {day: 2030-01-02, n: 12}
    timeout: 10m
    queue: etl
  - {ref: invoice, type: billing.invoice, after: fetch, max_retries: 5, priority: critical}
  - ref: ship
    type: shipping.label
    after: [fetch]
    strict: true
    idempotent: true
    jitter: delay_only
    jitter_window: 90
    job_id: labels
  - {ref: report, type: report.build, after: [invoice, ship], trigger_rule: all_done}
edges:
  - [fetch, report]
"""


def _parse(document: Any) -> WorkflowFile:
    return parse_workflow_document(document, "wf.json")


def _problems(document: Any) -> str:
    with pytest.raises(UsageError) as refused:
        _parse(document)
    return str(refused.value)


def _minimal(**top: Any) -> dict[str, Any]:
    return {"name": "wf", "tasks": [{"ref": "a", "type": "t.a"}], **top}


# --- reading a file ------------------------------------------------------------------------------


def test_the_documented_yaml_file_reads_into_the_clients_types(tmp_path: Path) -> None:
    path = tmp_path / "etl.yaml"
    path.write_text(DOCUMENTED_YAML, encoding="utf-8")
    read = read_workflow_file(str(path))
    assert read == WorkflowFile(
        name="nightly-etl",
        tasks=(
            WorkflowTask(
                "fetch",
                TaskSpec(
                    type="records.fetch",
                    # YAML's timestamps are not read: the day stays the string it is in JSON.
                    payload={"day": "2030-01-02", "n": 12},
                    timeout_s=600.0,
                    queue="etl",
                ),
            ),
            WorkflowTask(
                "invoice",
                TaskSpec(type="billing.invoice", max_retries=5, priority=Priority.CRITICAL),
            ),
            WorkflowTask(
                "ship",
                TaskSpec(
                    type="shipping.label",
                    strict_timing=True,
                    idempotent=True,
                    jitter=JitterMode.DELAY_ONLY,
                    jitter_window_s=90.0,
                    job_id="labels",
                ),
            ),
            WorkflowTask("report", TaskSpec(type="report.build"), TriggerRule.ALL_DONE),
        ),
        # The listed edges first (their indices are the file's), then each task's `after`.
        edges=(
            WorkflowEdge("fetch", "report"),
            WorkflowEdge("fetch", "invoice"),
            WorkflowEdge("fetch", "ship"),
            WorkflowEdge("invoice", "report"),
            WorkflowEdge("ship", "report"),
        ),
        delay_s=30.0,
        idempotency_key="etl-2030-01-02",
    )


def test_the_example_in_the_docs_reads() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "client.md"
    section = docs.read_text(encoding="utf-8").split("### Workflow files", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    read = parse_workflow_document(load_document(example, "etl.yaml"), "etl.yaml")
    assert [t.ref for t in read.tasks] == ["fetch", "invoice", "ship", "report"]
    assert len(read.edges) == 5 and read.delay_s == 30.0


def test_json_and_yaml_of_the_same_document_read_the_same(tmp_path: Path) -> None:
    document = load_document(DOCUMENTED_YAML, "etl.yml")
    as_json = tmp_path / "etl.json"
    as_json.write_text(json.dumps(document), encoding="utf-8")
    assert read_workflow_file(str(as_json)) == _parse(document)


@pytest.mark.parametrize(
    ("source", "text", "expected"),
    [
        ("wf.json", '{"name": "a", "n": 1.10}', {"name": "a", "n": 1.1}),
        ("wf.yaml", "name: a\nn: 3\n", {"name": "a", "n": 3}),
        ("wf.yml", '{"name": "a"}', {"name": "a"}),
        ("<stdin>", '  {"name": "a"}', {"name": "a"}),  # by content: JSON
        ("<stdin>", "name: a\n", {"name": "a"}),  # by content: YAML
        ("wf.txt", "# a comment\nname: a\n", {"name": "a"}),
    ],
)
def test_the_format_is_chosen_by_the_name_then_the_content(
    source: str, text: str, expected: dict[str, Any]
) -> None:
    assert load_document(text, source) == expected


def test_json_numbers_stay_exact() -> None:
    document = load_document('{"n": 12345678901234567890.5}', "wf.json")
    assert str(document["n"]) == "12345678901234567890.5"


@pytest.mark.parametrize(
    ("source", "text", "words"),
    [
        ("wf.json", '{"name": ', "wf.json: not JSON: "),
        ("wf.yaml", "name: [a\n", "wf.yaml: not YAML: "),
        ("<stdin>", "{name: a", "<stdin>: not JSON: "),
    ],
)
def test_a_file_that_does_not_parse_names_itself(source: str, text: str, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        load_document(text, source)


def test_yaml_tags_that_would_run_code_are_refused() -> None:
    with pytest.raises(UsageError, match="not YAML"):
        load_document("name: !!python/object/apply:os.system ['true']\n", "wf.yaml")


def test_stdin_and_a_missing_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(_minimal(delay=5))))
    assert read_workflow_file("-").delay_s == 5.0
    monkeypatch.setattr("sys.stdin", io.StringIO('{"name": "wf", "tasks": [{"ref": "a"}]}'))
    with pytest.raises(UsageError, match=r"^<stdin>: tasks\[0\]\.type: is required$"):
        read_workflow_file("-")
    with pytest.raises(UsageError, match=r"nope\.yaml: No such file"):
        read_workflow_file(str(tmp_path / "nope.yaml"))


def test_when_the_run_starts() -> None:
    assert _parse(_minimal()).at is None and _parse(_minimal()).delay_s is None
    assert _parse(_minimal(delay="1.5m")).delay_s == 90.0
    assert _parse(_minimal(delay=0)).delay_s == 0.0
    at = _parse(_minimal(scheduled_at="2030-01-02T04:04:05+01:00")).at
    assert at == T0 and at is not None and at.tzinfo is UTC


def test_edges_in_both_forms_and_after_as_one_ref() -> None:
    read = _parse(
        {
            "name": "wf",
            "tasks": [
                {"ref": "a", "type": "t"},
                {"ref": "b", "type": "t", "after": "a"},
                {"ref": "c", "type": "t"},
            ],
            "edges": [["a", "c"], {"parent": "b", "child": "c"}],
        }
    )
    assert read.edges == (WorkflowEdge("a", "c"), WorkflowEdge("b", "c"), WorkflowEdge("a", "b"))


# --- problems, each named by its place -------------------------------------------------------

BAD_DOCUMENTS = [
    # (the document, the one problem reported, as printed after the file's name)
    (_minimal(nmae="x"), "nmae: unknown key (did you mean name?)"),
    (_minimal(colour="x"), "colour: unknown key (known: name, tasks, edges, delay, "
     "scheduled_at, idempotency_key)"),
    ({"tasks": [{"ref": "a", "type": "t"}]}, "name: is required"),
    ({"name": "wf"}, "tasks: is required"),
    (_minimal(name=3), "name: must be a string, got a number"),
    (_minimal(tasks={"a": {}}), "tasks: must be a list, got a mapping"),
    (_minimal(tasks=["a"]), "tasks[0]: must be a mapping (ref, type, ...), got a string"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "tpye": "u"}]),
     "tasks[0].tpye: unknown key (did you mean type?)"),
    (_minimal(tasks=[{"type": "t"}]), "tasks[0].ref: is required"),
    (_minimal(tasks=[{"ref": 1, "type": "t"}]), "tasks[0].ref: must be a string, got a number"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "payload": [1]}]),
     "tasks[0].payload: must be a mapping (a JSON object), got a list"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "priority": "urgent"}]),
     "tasks[0].priority: must be one of critical, standard, bulk, got 'urgent'"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "trigger_rule": "any"}]),
     "tasks[0].trigger_rule: must be one of all_success, all_done, got 'any'"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "max_retries": -1}]),
     "tasks[0].max_retries: must be >= 0, got -1"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "max_retries": True}]),
     "tasks[0].max_retries: must be an integer, got a boolean"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "timeout": "0s"}]),
     "tasks[0].timeout: must be positive, got '0s'"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "timeout": "soon"}]),
     "tasks[0].timeout: not a duration: 'soon' (e.g. 90s, 5m, 1h, 1d)"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "jitter_window": -5}]),
     "tasks[0].jitter_window: must be non-negative, got -5"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "strict": "yes"}]),
     "tasks[0].strict: must be true or false, got a string"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "after": [1]}]),
     "tasks[0].after: must be a ref or a list of refs, got [1]"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "after": ["b"]}]),
     "tasks[0].after[0]: no task has the ref 'b'"),
    (_minimal(tasks=[{"ref": "a", "type": "t", "after": "a"}]),
     "tasks[0].after[0]: a -> a: a task cannot depend on itself"),
    (_minimal(edges={"a": "b"}), "edges: must be a list, got a mapping"),
    (_minimal(edges=[["a"]]), "edges[0]: must be [parent, child] or {parent: ..., child: ...}, "
     "got ['a']"),
    (_minimal(edges=[{"parent": "a", "child": 2}]), "edges[0].child: must be a task's ref, "
     "got a number"),
    (_minimal(edges=[{"parent": "a"}]), "edges[0].child: is required"),
    (_minimal(edges=[["a", "zz"]]), "edges[0]: no task has the ref 'zz'"),
    (_minimal(delay="30s", scheduled_at="2030-01-01T00:00:00Z"),
     "delay: give at most one of delay and scheduled_at"),
    (_minimal(delay="-1s"), "delay: must be non-negative, got '-1s'"),
    (_minimal(delay=float("inf")), "delay: must be finite, got inf"),
    (_minimal(scheduled_at="2030-01-01T00:00:00"),
     "scheduled_at: '2030-01-01T00:00:00' has no UTC offset: add Z (UTC) or +HH:MM, or use "
     "delay"),
    (_minimal(scheduled_at=5), "scheduled_at: must be a string, got a number"),
    (_minimal(idempotency_key=5), "idempotency_key: must be a string, got a number"),
    ([1, 2], "must be a mapping (name, tasks, edges, ...), got a list"),
]  # fmt: skip


@pytest.mark.parametrize(("document", "problem"), BAD_DOCUMENTS)
def test_each_problem_is_named_by_its_place_in_the_file(document: Any, problem: str) -> None:
    assert _problems(document) == f"wf.json: {problem}"


def test_a_repeated_edge_names_the_first_one() -> None:
    document = {
        "name": "wf",
        "tasks": [{"ref": "a", "type": "t"}, {"ref": "b", "type": "t", "after": ["a"]}],
        "edges": [["a", "b"]],
    }
    assert _problems(document) == "wf.json: tasks[1].after[0]: a -> b repeats edges[0]"


def test_every_problem_is_reported_at_once_in_the_files_order() -> None:
    document = {
        "name": "wf",
        "tasks": [
            {"ref": "a", "type": "t"},
            {"ref": "b", "tpye": "t", "after": ["x"]},
            {"ref": "c", "type": "t", "paylod": {}},
        ],
        "edges": [{"parent": "a", "chld": "b"}],
        "extra": 1,
    }
    assert _problems(document).splitlines() == [
        "wf.json: 7 problems:",
        "  extra: unknown key (known: name, tasks, edges, delay, scheduled_at, idempotency_key)",
        "  tasks[1].tpye: unknown key (did you mean type?)",
        "  tasks[1].type: is required",
        "  tasks[2].paylod: unknown key (did you mean payload?)",
        "  edges[0].chld: unknown key (did you mean child?)",
        "  edges[0].child: is required",
        "  tasks[1].after[0]: no task has the ref 'x'",
    ]


def test_the_problems_reported_are_bounded() -> None:
    document = {"name": "wf", "tasks": [{"ref": f"t{i}", "tpye": "x"} for i in range(5000)]}
    lines = _problems(document).splitlines()
    assert lines[0] == "wf.json: 10000 problems:"
    assert len(lines) == 1 + workflows.PROBLEMS_SHOWN + 1
    assert lines[-1] == f"  ... and {10000 - workflows.PROBLEMS_SHOWN} more"


def test_the_server_judges_what_the_file_cannot_point_at() -> None:
    # Spelling of refs, repeated refs and cycles: the server names them (tasks[i].ref is
    # the file's index; a cycle is named by its refs).
    read = _parse(
        {
            "name": "wf",
            "tasks": [
                {"ref": "a b", "type": "t"},
                {"ref": "a b", "type": "t"},
                {"ref": "c", "type": "t", "after": ["d"]},
                {"ref": "d", "type": "t", "after": ["c"]},
                {"ref": "e", "type": ""},
            ],
        }
    )
    assert [t.ref for t in read.tasks] == ["a b", "a b", "c", "d", "e"]


def test_a_bad_file_exits_2_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text("name: wf\ntasks:\n  - {ref: a, type: t}\n  - {ref: b, tpye: t}\n")
    # No node listens there, and no API key is given: the file is refused first.
    code = cli.main(["workflows", "submit", str(path), "--target", "127.0.0.1:1"])
    assert code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"chronoshard workflows submit: {path}: 2 problems:" in err
    assert "  tasks[1].tpye: unknown key (did you mean type?)" in err


def test_ls_state_is_read_in_any_case() -> None:
    args = cli.build_parser().parse_args(["workflows", "ls", "--state", "Failed"])
    assert args.state is WorkflowState.FAILED
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["workflows", "ls", "--state", "done"])


# --- the layout ----------------------------------------------------------------------------------


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, str]]]:
    """Refs in some order and acyclic edges between them (each edge goes forward in a
    hidden topological order, which need not be the order of the refs)."""
    count = draw(st.integers(0, 40))
    topo = [f"t{i}" for i in range(count)]
    pairs = st.tuples(st.integers(0, max(count - 1, 0)), st.integers(0, max(count - 1, 0)))
    edges = [(topo[i], topo[j]) for i, j in draw(st.lists(pairs, max_size=120)) if i < j < count]
    refs = draw(st.permutations(topo))
    return refs, edges


@settings(max_examples=300, deadline=None)
@given(dags())
def test_layers_put_every_task_once_and_children_after_their_parents(
    dag: tuple[list[str], list[tuple[str, str]]],
) -> None:
    refs, edges = dag
    drawn = layers(refs, edges)
    layer_of = {ref: n for n, layer in enumerate(drawn) for ref in layer}
    assert sorted(ref for layer in drawn for ref in layer) == sorted(refs)
    assert all(drawn), "no empty layer"
    for parent, child in edges:
        assert layer_of[child] > layer_of[parent]
    # The layer is the longest path from a root: one more than the deepest parent.
    parents: dict[str, set[str]] = {ref: set() for ref in refs}
    for parent, child in edges:
        parents[child].add(parent)
    for ref in refs:
        expected = max((layer_of[p] + 1 for p in parents[ref]), default=0)
        assert layer_of[ref] == expected
    # Within a layer, the order of refs.
    for layer in drawn:
        assert layer == sorted(layer, key=refs.index)


def test_layers_end_on_a_cycle_and_ignore_unknown_refs() -> None:
    drawn = layers(["a", "b", "c", "d", "a"], [("a", "b"), ("b", "c"), ("c", "b"), ("x", "a")])
    assert drawn == [["a", "d"], ["b", "c"]]


def test_layers_of_a_big_dag_take_linear_time() -> None:
    refs = [f"t{i}" for i in range(10_000)]
    edges = [
        (refs[i], refs[i + d]) for i in range(10_000) for d in (1, 2, 3, 5, 8) if i + d < 10_000
    ]
    started = time.monotonic()
    drawn = layers(refs, edges)
    assert time.monotonic() - started < 2.0
    assert len(drawn) == 10_000  # a chain: one task a layer


# --- the drawing ---------------------------------------------------------------------------------


def _task_state(
    ref: str, status: TaskStatus, *, cause: str | None = None, rule: str = "all_success",
    waits: int = 0,
) -> WorkflowTaskState:  # fmt: skip
    task = Task(
        id=f"id-{ref}", tenant_id="tenant", type=f"t.{ref}", status=status, scheduled_at=T0,
        due_at=T0, priority=Priority.STANDARD, queue="", payload=None, result=None,
        last_error=None, attempt=1, fencing_token=1, retry_count=0,
        retry_policy=RetryPolicy(max_retries=3), timeout_s=None, strict_timing=False,
        idempotent=False, idempotency_key=None, job_id=None, worker_id=None,
        lease_expires_at=None, checkpoint=None, shard=0, trace_context={}, created_at=T0,
        updated_at=T0, finished_at=None, workflow_id="wf-1", unresolved_dependencies=waits,
        schedule_id=None, logical_date=None,
    )  # fmt: skip
    return WorkflowTaskState(ref, task, TriggerRule(rule), cause)


def _workflow(state: WorkflowState, tasks: int, edges: int) -> Workflow:
    return Workflow(
        id="wf-1", tenant_id="tenant", name="diamond", state=state, scheduled_at=T0,
        created_at=T0, finished_at=None, task_count=tasks, edge_count=edges,
        idempotency_key=None,
    )  # fmt: skip


DIAMOND = WorkflowDetail(
    workflow=_workflow(WorkflowState.FAILED, 5, 5),
    tasks=(
        _task_state("fetch", TaskStatus.COMPLETED),
        _task_state("invoice", TaskStatus.DEAD_LETTER),
        _task_state("ship", TaskStatus.COMPLETED),
        _task_state("report", TaskStatus.UPSTREAM_FAILED, cause="invoice"),
        _task_state("notify", TaskStatus.SCHEDULED, rule="all_done", waits=1),
    ),
    edges=tuple(
        WorkflowEdge(p, c)
        for p, c in [
            ("fetch", "invoice"),
            ("fetch", "ship"),
            ("invoice", "report"),
            ("ship", "report"),
            ("report", "notify"),
        ]
    ),
)


def test_the_drawing_shows_layers_states_parents_and_causes() -> None:
    assert draw_dag(DIAMOND, limit=200).splitlines() == [
        "layer 0",
        "  fetch    COMPLETED        id-fetch",
        "layer 1",
        "  invoice  DEAD_LETTER      id-invoice  <- fetch",
        "  ship     COMPLETED        id-ship  <- fetch",
        "layer 2",
        "  report   UPSTREAM_FAILED  id-report  <- invoice, ship  (cause: invoice)",
        "layer 3",
        "  notify   SCHEDULED        id-notify  <- report  [all_done] (waits for 1)",
    ]


def test_get_prints_the_run_and_its_counts_before_the_drawing() -> None:
    text = workflows.workflow_details(DIAMOND, 200)
    head, drawing = text.split("\n\n")
    assert "state:           FAILED" in head
    assert "tasks:           5 (SCHEDULED 1, COMPLETED 2, DEAD_LETTER 1, UPSTREAM_FAILED 1)" in (
        head
    )
    assert drawing == draw_dag(DIAMOND, 200)


def test_the_drawing_is_bounded_for_ten_thousand_tasks() -> None:
    count = 10_000
    tasks = tuple(_task_state(f"t{i}", TaskStatus.SCHEDULED) for i in range(count))
    # Every task after the first 2,000 has all of those as parents: long parent lists too.
    edges = tuple(WorkflowEdge("t0", f"t{i}") for i in range(1, count)) + tuple(
        WorkflowEdge(f"t{i}", f"t{count - 1}") for i in range(1, count - 1)
    )
    detail = WorkflowDetail(_workflow(WorkflowState.RUNNING, count, len(edges)), tasks, edges)
    started = time.monotonic()
    lines = draw_dag(detail, limit=200).splitlines()
    assert time.monotonic() - started < 2.0
    assert len([line for line in lines if line.startswith("  ")]) == 200
    assert lines[-1] == f"... {count - 200} more tasks (raise --limit, or -o json for all)"
    every = draw_dag(detail, limit=count).splitlines()
    last = every[-1]
    assert last.startswith(f"  t{count - 1} ") and last.endswith(
        f"<- t0, t1, t2, t3, t4 (+{count - 1 - 5} more)"
    )


def test_submit_prints_each_refs_task_id_in_the_files_order() -> None:
    result = WorkflowCreateResult(
        _workflow(WorkflowState.RUNNING, 3, 2), {"b": "id-b", "a": "id-a", "c": "id-c"}, True
    )
    lines = workflows.created_text(result, ["a", "b", "c"], limit=2).splitlines()
    assert lines[0] == (
        "created workflow wf-1 (diamond): 3 tasks, 2 edges, RUNNING, "
        "starts 2030-01-02 03:04:05.000 UTC"
    )
    assert [line.split() for line in lines[1:4]] == [["REF", "TASK"], ["a", "id-a"], ["b", "id-b"]]
    assert lines[4] == "... 1 more (raise --limit, or -o json for all)"
    again = WorkflowCreateResult(result.workflow, result.task_ids, False)
    assert workflows.created_text(again, [], 10).startswith("already created (idempotency key)")


def test_the_list_table() -> None:
    finished = _workflow(WorkflowState.SUCCEEDED, 3, 2)
    lines = workflows.workflow_table([finished]).splitlines()
    assert lines[0].split()[:4] == ["ID", "NAME", "STATE", "TASKS"]
    assert lines[1].split()[:4] == ["wf-1", "diamond", "SUCCEEDED", "3"]
    assert (T0 + timedelta(0)).strftime("%Y-%m-%d") in lines[1]
