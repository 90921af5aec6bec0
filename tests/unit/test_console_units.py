"""The web console's pure parts (chronoshard.console): escaping, sessions and CSRF
tokens, the workflow graph's layout, lateness from cumulative histograms, the task
list's filters. The console in a browser is tests/e2e/test_console.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from chronoshard._cli.admin import NodeMetrics
from chronoshard.console import graph, lateness, views
from chronoshard.console.markup import Html, escape, html
from chronoshard.console.sessions import SessionStore, tokens_match
from chronoshard.types import Priority, RetryPolicy, Task, TaskStatus


def test_values_are_escaped_unless_they_are_markup() -> None:
    made = html("<td>{0}</td><td>{1}</td>", "<script>alert(1)</script>", Html("<b>x</b>"))
    assert made == "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td><b>x</b></td>"
    assert escape('" onload="x') == "&quot; onload=&quot;x"
    assert escape(None) == ""


def test_csrf_tokens_compare_exactly_and_absent_is_refused() -> None:
    assert tokens_match("abc", "abc")
    assert not tokens_match("abc", "abd")
    assert not tokens_match("abc", None)
    assert not tokens_match("abc", "")
    assert not tokens_match("", "")


def test_logging_in_replaces_the_session_and_idle_sessions_expire() -> None:
    store = SessionStore(idle_timeout_s=10)
    anonymous = store.create(now=0)
    session = store.log_in(anonymous, "cs_key", "", now=1)
    assert session.id != anonymous.id and session.csrf_token != anonymous.csrf_token
    assert store.get(anonymous.id, now=2) is None  # no fixation: the old id is gone
    assert store.get(session.id, now=5) is session
    assert "cs_key" not in repr(session)
    assert store.get(session.id, now=16) is None  # idle for 11 s
    assert store.expire(now=16) == [session]
    assert len(store) == 0


def test_a_diamond_is_laid_out_in_three_layers() -> None:
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    placed = graph.layout(["d", "c", "b", "a"], edges)
    assert {ref: p.layer for ref, p in placed.nodes.items()} == {"a": 0, "b": 1, "c": 1, "d": 2}
    assert placed.nodes["b"].x < placed.nodes["c"].x  # same layer: by ref
    assert placed.nodes["a"].centre_x == placed.nodes["d"].centre_x  # centred under the widest
    assert placed.width == 2 * graph.MARGIN + 2 * graph.NODE_WIDTH + graph.GAP_X


def test_a_cycle_or_an_unknown_ref_is_refused() -> None:
    with pytest.raises(ValueError, match="cycle"):
        graph.layers(["a", "b"], [("a", "b"), ("b", "a")])
    with pytest.raises(ValueError, match="unknown"):
        graph.layers(["a"], [("a", "z")])


def _metrics(count: float, total: float, buckets: tuple[tuple[float, float], ...]) -> NodeMetrics:
    return NodeMetrics(
        dispatched=count,
        lateness_mean_s=total / count if count else None,
        lateness_buckets=buckets,
    )


def test_lateness_points_are_differences_and_a_restart_is_skipped() -> None:
    inf = float("inf")
    first = lateness.sample(100.0, _metrics(10, 1.0, ((0.1, 10), (1.0, 10), (inf, 10))))
    second = lateness.sample(102.0, _metrics(30, 11.0, ((0.1, 10), (1.0, 30), (inf, 30))))
    restarted = lateness.sample(104.0, _metrics(2, 0.1, ((0.1, 2), (1.0, 2), (inf, 2))))
    [point] = lateness.points([first, second, restarted])
    assert point.at == 102.0
    assert point.rate_per_s == 10.0  # 20 dispatches in 2 s
    assert point.mean_s == pytest.approx(0.5)  # 10 s of lateness over 20
    assert point.p99_s is not None and 0.1 < point.p99_s <= 1.0  # all 20 in (0.1, 1]


def test_filters_are_read_and_what_cannot_be_read_is_named() -> None:
    filters = views.parse_filters(
        {"status": "dead_letter", "type": " t ", "from": "2026-01-02T03:04", "before": "soon"}
    )
    assert filters.status is TaskStatus.DEAD_LETTER and filters.type == "t"
    assert filters.scheduled_from == datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    assert filters.scheduled_before is None
    assert filters.problems == ("before: not a date and time: 'soon'",)
    assert (
        filters.query(page_token="p1")
        == "status=DEAD_LETTER&type=t&from=2026-01-02T03%3A04&page=p1"
    )


def _task(status: TaskStatus) -> Task:
    now = datetime(2026, 12, 4, tzinfo=UTC)
    return Task(
        id="0193a000-0000-7000-8000-000000000001",
        tenant_id="t",
        type="console.flaky",
        status=status,
        scheduled_at=now,
        due_at=now,
        priority=Priority.STANDARD,
        queue="default",
        payload={},
        result=None,
        last_error=None,
        attempt=1,
        fencing_token=1,
        retry_count=0,
        retry_policy=RetryPolicy(),
        timeout_s=None,
        strict_timing=False,
        idempotent=False,
        idempotency_key=None,
        job_id=None,
        worker_id=None,
        lease_expires_at=None,
        checkpoint=None,
        shard=0,
        trace_context={},
        created_at=now,
        updated_at=now,
        finished_at=None,
        workflow_id=None,
        unresolved_dependencies=0,
        schedule_id=None,
        logical_date=None,
    )


@pytest.mark.parametrize(
    ("status", "actions"),
    [
        (TaskStatus.OUTCOME_UNKNOWN, {"cancel", "retry", "mark-failed"}),
        (TaskStatus.DEAD_LETTER, {"retry"}),
        (TaskStatus.RUNNING, {"cancel"}),
        (TaskStatus.COMPLETED, set()),
    ],
)
def test_a_task_offers_the_actions_its_state_allows(status: TaskStatus, actions: set[str]) -> None:
    shown = str(views.task_fragment(_task(status), "tok", datetime.now(UTC)))
    offered = {
        action
        for action in ("cancel", "retry", "mark-failed")
        if f'action="/tasks/0193a000-0000-7000-8000-000000000001/{action}"' in shown
    }
    assert offered == actions


def test_the_schedule_form_makes_a_spec_or_names_its_first_problem() -> None:
    form, made = views.read_schedule_form(
        {
            "name": " nightly ",
            "cron": "0 3 * * *",
            "timezone": "Europe/Paris",
            "type": "report.build",
            "priority": "bulk",
            "payload": '{"to": "<b>ops</b>"}',
        }
    )
    assert not isinstance(made, str)
    assert made.name == "nightly" and made.cron == "0 3 * * *"
    assert made.timezone == "Europe/Paris" and made.interval_s is None
    assert made.task is not None and made.task.type == "report.build"
    assert made.task.priority is Priority.BULK and made.task.payload == {"to": "<b>ops</b>"}
    # What was typed comes back as typed (escaped when shown), to be corrected.
    shown = str(views.schedule_form_page(form, "tok", "x"))
    assert "&lt;b&gt;ops&lt;/b&gt;" in shown and "<b>ops" not in shown


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"cron": "* * * * *", "type": "t"}, "name:"),
        ({"name": "n", "cron": "* * * * *"}, "task type:"),
        ({"name": "n", "type": "t"}, "rule:"),
        ({"name": "n", "type": "t", "cron": "* * * * *", "interval_s": "60"}, "rule:"),
        ({"name": "n", "type": "t", "interval_s": "often"}, "interval:"),
        ({"name": "n", "type": "t", "interval_s": "60", "payload": "[1]"}, "payload:"),
        ({"name": "n", "type": "t", "interval_s": "60", "payload": "{"}, "payload: not JSON"),
    ],
)
def test_a_schedule_form_that_cannot_make_a_spec_says_why(
    fields: dict[str, str], problem: str
) -> None:
    _, made = views.read_schedule_form(fields)
    assert isinstance(made, str) and made.startswith(problem), made
