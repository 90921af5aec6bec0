"""The web console's pure parts (chronoshard.console): escaping, sessions and CSRF
tokens, the workflow graph's layout, lateness from cumulative histograms, the task
list's filters, the workers page and a tenant's overview (and the CLI's rows of worker
sessions). The console in a browser is tests/e2e/test_console.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from chronoshard._cli.admin import NodeMetrics, parse_node_metrics
from chronoshard._cli.workers import session_rows
from chronoshard.console import cluster_views, graph, lateness, views
from chronoshard.console.backend import NodeView, TopologyView
from chronoshard.console.markup import Html, escape, html
from chronoshard.console.sessions import SessionStore, tokens_match
from chronoshard.scheduler.metrics import LATENESS_BUCKETS_S
from chronoshard.types import (
    Priority,
    RetryPolicy,
    Task,
    TaskStatus,
    WorkerSession,
    WorkerSessionPage,
)


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


def _metrics(count: float, buckets: tuple[tuple[float, float], ...]) -> NodeMetrics:
    return NodeMetrics(dispatched=count, lateness_buckets=buckets)


def test_lateness_points_are_differences_and_a_restart_is_skipped() -> None:
    inf = float("inf")
    first = lateness.sample(100.0, _metrics(10, ((0.1, 10), (1.0, 10), (inf, 10))))
    second = lateness.sample(102.0, _metrics(30, ((0.1, 10), (1.0, 30), (inf, 30))))
    restarted = lateness.sample(104.0, _metrics(2, ((0.1, 2), (1.0, 2), (inf, 2))))
    [point] = lateness.points([first, second, restarted])
    assert point.at == 102.0
    assert point.rate_per_s == 10.0  # 20 dispatches in 2 s
    # All 20 in (0.1, 1]: the 10 before them do not count.
    assert point.p50_s == pytest.approx(0.55)
    assert point.p99_s == pytest.approx(0.991)


def test_lateness_from_a_real_exposition_with_early_dispatches() -> None:
    # The node's histogram has negative buckets (sent ahead: early), for which
    # prometheus_client writes no _sum: p50 and p99 come from the buckets, no mean.
    registry = CollectorRegistry()
    histogram = Histogram(
        "chronoshard_dispatch_lateness_seconds",
        "lateness",
        ["node"],
        buckets=LATENESS_BUCKETS_S,
        registry=registry,
    ).labels("n1")
    histogram.observe(0.003)
    before = parse_node_metrics(generate_latest(registry).decode())
    for _ in range(10):
        histogram.observe(-0.06)  # lead dispatch: 60 ms early
    after = parse_node_metrics(generate_latest(registry).decode())
    assert after.dispatched == 11 and after.lateness_mean_s is None
    [point] = lateness.points([lateness.sample(0.0, before), lateness.sample(2.0, after)])
    assert point.rate_per_s == 5.0
    assert point.p50_s is not None and -0.1 < point.p50_s <= -0.05
    assert point.p99_s is not None and -0.1 < point.p99_s <= -0.05


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


def _session(worker_id: str, node_id: str, **fields: object) -> WorkerSession:
    values: dict[str, object] = {
        "worker_id": worker_id,
        "node_id": node_id,
        "session_id": f"{node_id}/1",
        "tenant_id": "7b7c5d4e-0000-4000-8000-000000000001",
        "tenant_name": "acme",
        "queues": ("default",),
        "task_types": ("a.t", "b.t"),
        "slots": 4,
        "credits": 1,
        "running": 2,
        "draining": False,
        "connected_at": NOW - timedelta(seconds=90),
        "reported_at": NOW - timedelta(seconds=3),
    }
    values.update(fields)
    return WorkerSession(**values)  # type: ignore[arg-type]


NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_the_workers_page_escapes_names_and_shows_the_tenant_to_an_operator_only() -> None:
    sessions = (
        _session("<b>w1</b>", "node-1"),
        _session("<b>w1</b>", "node-2", draining=True, tenant_name="<i>evil</i>"),
    )
    filters = cluster_views.parse_worker_filters({"worker": " <b>w1</b> ", "page": "tok"})
    everyone = WorkerSessionPage(sessions, "next", restricted=False, answered_by="node-1")
    made = cluster_views.workers_fragment(filters, everyone, NOW)
    assert "<b>w1</b>" not in made and "&lt;b&gt;w1&lt;/b&gt;" in made
    assert "<th>tenant</th>" in made and "&lt;i&gt;evil&lt;/i&gt;" in made
    assert made.count('class="session"') == 2 and "draining" in made and "90.0 s ago" in made
    # The next page keeps the filter; the first page is offered from a later one.
    assert "/workers?worker=%3Cb%3Ew1%3C%2Fb%3E&amp;page=next" in made
    assert '/workers?worker=%3Cb%3Ew1%3C%2Fb%3E">← First page' in made
    own = cluster_views.workers_fragment(
        filters, WorkerSessionPage(sessions[:1], None, restricted=True, answered_by="n"), NOW
    )
    assert "<th>tenant</th>" not in own and "Your tenant" in own and "Next page" not in own
    page = cluster_views.workers_page(filters, own, "csrf")
    assert 'data-live="/workers/live?worker=%3Cb%3Ew1%3C%2Fb%3E&amp;page=tok"' in page


def test_a_tenants_overview_says_why_it_has_no_cluster_view() -> None:
    topology = TopologyView(
        answered_by="n1",
        shard_count=0,
        nodes=(NodeView("n1", "10.0.0.1:7070", "", NOW, (), False, True),),
        shards=(),
        restricted=True,
    )
    sessions = [_session("w1", "n1"), _session("w1", "n2"), _session("w2", "n1", slots=2)]
    made = cluster_views.overview_fragment(
        topology, {}, lateness.History(), sessions, [], [], NOW.timestamp()
    )
    assert "not an operator&#x27;s" in made and "CLOCK SKEWED" in made
    assert 'class="shards"' not in made and 'class="plot"' not in made
    # Two workers (one with a session on each node): their slots counted once each.
    assert "3 session(s) of this tenant&#x27;s workers, of 2 worker(s) with 6 slot(s)" in made
    unread = cluster_views.overview_fragment(
        topology, {}, lateness.History(), None, None, None, NOW.timestamp()
    )
    assert "worker sessions could not be read" in unread


def test_the_cli_lists_one_row_per_session() -> None:
    [row] = session_rows([_session("w1", "n1", tenant_name="")], NOW)
    assert row == [
        "w1",
        "n1",
        "7b7c5d4e-0000-4000-8000-000000000001",
        "default",
        "a.t,b.t",
        4,
        1,
        2,
        "1m30s ago",
        "serving",
    ]
