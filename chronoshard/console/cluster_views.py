"""The console's cluster pages: the overview and the workers page, as HTML from the
backend's views and the client's types. Pure functions, no I/O, built like every page
(:mod:`.views`: escaped by construction, geometry as SVG attributes, colour as CSS
classes).

What a page shows depends on the key (docs/console.md): the cluster views (the nodes'
shards and epochs, wheel sizes, dispatch lateness, the shard map, every tenant's worker
sessions) are an operator key's. ``GetTopology`` answers another key the nodes only
(``restricted``), and its overview says so and shows what is the tenant's own: the
nodes its workers connect to, its workers' sessions, its watchdog. An operator's
overview lists every tenant's open incidents and the cluster's own.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from chronoshard._cli.admin import NodeMetrics, ranges
from chronoshard.console.backend import ExpectationView, TopologyView
from chronoshard.console.lateness import History, Point
from chronoshard.console.markup import Html, html, join
from chronoshard.console.views import (
    EMPTY,
    incidents_table,
    live_section,
    page,
    paging_links,
    seconds_text,
    when,
)
from chronoshard.types import Incident, WorkerSession, WorkerSessionPage

RESTRICTED_NOTE = (
    "This key is not an operator's: the shard map, epochs, wheel sizes, dispatch lateness "
    "and other tenants' workers are an operator key's (chronoshard tenants create NAME "
    "--operator)."
)

# --- overview -------------------------------------------------------------------------------

PLOT_WIDTH = 720
PLOT_HEIGHT = 180
PLOT_PAD = 36
SHARD_CELL = 34
SHARD_COLUMNS = 16
OWNER_CLASSES = 8


def lateness_svg(history: History, now_s: float) -> Html:
    """p50 and p99 dispatch lateness per node over the kept history, as lines."""
    series: list[tuple[str, list[Point]]] = [
        (node, history.points(node)) for node in history.nodes()
    ]
    values = [v for _, pts in series for p in pts for v in (p.p50_s, p.p99_s) if v is not None]
    if not values:
        return html(
            '<p class="empty">No dispatch yet in the console\'s history (it samples each '
            "node every 2 s while the overview is open).</p>"
        )
    oldest = min(p.at for _, pts in series for p in pts)
    span_s = max(now_s - oldest, 1.0)
    low, high = min(min(values), 0.0), max(max(values), 0.001)

    def xy(point_at: float, value: float) -> str:
        x = PLOT_PAD + (point_at - oldest) / span_s * (PLOT_WIDTH - 2 * PLOT_PAD)
        y = PLOT_HEIGHT - PLOT_PAD - (value - low) / (high - low) * (PLOT_HEIGHT - 2 * PLOT_PAD)
        return f"{x:.1f},{y:.1f}"

    lines = []
    for index, (node, pts) in enumerate(series):
        for kind in ("p50", "p99"):
            coords = [
                xy(p.at, v)
                for p in pts
                if (v := (p.p50_s if kind == "p50" else p.p99_s)) is not None
            ]
            if coords:
                lines.append(
                    html(
                        '<polyline points="{0}" class="line o-{1} {2}"><title>{3} {2}</title>'
                        "</polyline>",
                        " ".join(coords),
                        index % OWNER_CLASSES,
                        kind,
                        node,
                    )
                )
    legend = join(
        html('<span class="key o-{0}">{1}</span>', i % OWNER_CLASSES, node)
        for i, (node, _) in enumerate(series)
    )
    return html(
        '<svg class="plot" viewBox="0 0 {0} {1}" width="{0}" height="{1}" role="img" '
        'aria-label="dispatch lateness over time">'
        '<line x1="{2}" y1="{3}" x2="{4}" y2="{3}" class="axis"></line>'
        '<text x="4" y="{5}" class="tl-axis">{6}</text>'
        '<text x="4" y="{3}" class="tl-axis">{7}</text>'
        '<text x="{2}" y="{8}" class="tl-axis">−{9}</text>'
        '<text x="{4}" y="{8}" class="tl-axis" text-anchor="end">now</text>{10}</svg>'
        '<p class="legend">{11} <span class="hint">solid: p50, dashed: p99 of each '
        "interval</span></p>",
        PLOT_WIDTH,
        PLOT_HEIGHT,
        PLOT_PAD,
        PLOT_HEIGHT - PLOT_PAD,
        PLOT_WIDTH - PLOT_PAD,
        PLOT_PAD,
        seconds_text(high),
        seconds_text(low),
        PLOT_HEIGHT - 8,
        seconds_text(span_s),
        join(lines),
        legend,
    )


def shard_map_svg(topology: TopologyView) -> Html:
    owner_index = {n.node_id: i for i, n in enumerate(topology.nodes)}
    owned = {s.shard: s for s in topology.shards}
    cells = []
    for shard in range(topology.shard_count):
        x = (shard % SHARD_COLUMNS) * SHARD_CELL
        y = (shard // SHARD_COLUMNS) * SHARD_CELL
        owner = owned.get(shard)
        css = "unowned" if owner is None else f"o-{owner_index.get(owner.node_id, 0) % 8}"
        tip = "unowned" if owner is None else f"{owner.node_id}, epoch {owner.epoch}"
        cells.append(
            html(
                '<g><rect x="{0}" y="{1}" width="{2}" height="{2}" class="cell {3}">'
                "<title>shard {4}: {5}</title></rect>"
                '<text x="{6}" y="{7}" class="cell-text">{4}</text>'
                '<text x="{6}" y="{8}" class="cell-epoch">e{9}</text></g>',
                x + 1,
                y + 1,
                SHARD_CELL - 2,
                css,
                shard,
                tip,
                x + SHARD_CELL / 2,
                y + 14,
                y + 27,
                owner.epoch if owner else "-",
            )
        )
    rows = max(1, -(-topology.shard_count // SHARD_COLUMNS))
    width = min(max(topology.shard_count, 1), SHARD_COLUMNS) * SHARD_CELL
    return html(
        '<svg class="shards" viewBox="0 0 {0} {1}" width="{0}" height="{1}" role="img" '
        'aria-label="shard map">{2}</svg>',
        width,
        rows * SHARD_CELL,
        join(cells),
    )


def _count(value: float | None) -> str:
    return EMPTY if value is None else str(int(value))


def _node_state(draining: bool, clock_skewed: bool) -> str:
    state = "draining" if draining else "serving"
    return "CLOCK SKEWED" if clock_skewed else state


def _operator_nodes(
    topology: TopologyView, latest: Mapping[str, NodeMetrics | str], history: History
) -> Html:
    """The nodes table of the cluster view: shards, epochs and each node's metrics."""
    epochs: dict[str, list[int]] = {}
    for shard in topology.shards:
        epochs.setdefault(shard.node_id, []).append(shard.epoch)
    rows = []
    for index, node in enumerate(topology.nodes):
        scraped = latest.get(node.node_id)
        metrics = scraped if isinstance(scraped, NodeMetrics) else NodeMetrics()
        points = history.points(node.node_id)
        rate = points[-1].rate_per_s if points else None
        state = "draining" if node.draining else "serving"
        if metrics.self_fenced:
            state = "SELF-FENCED"
        if node.clock_skewed or metrics.clock_skewed:
            state = "CLOCK SKEWED"
        if isinstance(scraped, str):
            state += f" ({scraped})"
        node_epochs = epochs.get(node.node_id, [])
        rows.append(
            html(
                '<tr><td><span class="key o-{0}">{1}</span></td><td class="mono">{2}</td>'
                "<td>{3} ({4})</td><td>{5}</td><td>{6}</td><td>{7}</td><td>{8}</td><td>{9}</td>"
                "<td>{10}</td><td>{11}</td><td>{12}</td><td>{13}</td></tr>",
                index % OWNER_CLASSES,
                node.node_id,
                node.address,
                len(node.shards),
                ranges(node.shards),
                (
                    f"{min(node_epochs)}–{max(node_epochs)}"
                    if len(set(node_epochs)) > 1
                    else (node_epochs[0] if node_epochs else EMPTY)
                ),
                _count(metrics.wheel_timers),
                _count(metrics.ready_tasks),
                _count(metrics.worker_sessions),
                _count(metrics.dispatched),
                EMPTY if rate is None else f"{rate:.1f}/s",
                seconds_text(metrics.lateness_p50_s),
                seconds_text(metrics.lateness_p99_s),
                state,
            )
        )
    return html(
        '<table class="nodes"><thead><tr><th>node</th><th>address</th><th>shards</th>'
        "<th>epochs</th><th>wheel</th><th>ready</th><th>sessions</th><th>dispatched</th>"
        "<th>rate</th><th>late p50</th><th>late p99</th><th>state</th></tr></thead>"
        "<tbody>{0}</tbody></table>",
        join(rows),
    )


def _tenant_nodes(topology: TopologyView) -> Html:
    """The nodes a tenant's key is shown: where its workers connect, and in what state."""
    rows = join(
        html(
            '<tr><td class="mono">{0}</td><td class="mono">{1}</td><td>{2}</td><td>{3}</td></tr>',
            node.node_id,
            node.address,
            when(node.started_at),
            _node_state(node.draining, node.clock_skewed),
        )
        for node in topology.nodes
    )
    return html(
        '<table class="nodes"><thead><tr><th>node</th><th>address</th><th>started</th>'
        "<th>state</th></tr></thead><tbody>{0}</tbody></table>",
        rows,
    )


def sessions_summary(sessions: Sequence[WorkerSession] | None, restricted: bool) -> Html:
    """One line about the worker sessions listed (the tenant's own, or every one)."""
    if sessions is None:
        return html('<p class="empty">The worker sessions could not be read.</p>')
    whose = "of this tenant's workers" if restricted else "in the cluster"
    if not sessions:
        return html('<p class="empty" id="sessions-summary">No worker session {0}.</p>', whose)
    # A worker has a session with every node, each with its slots: count them once.
    slots_of = {s.worker_id: s.slots for s in sessions}
    return html(
        '<p id="sessions-summary">{0} session(s) {1}, of {2} worker(s) with {3} slot(s): '
        "{4} task(s) running, {5} credit(s) granted and unused. "
        '<a href="/workers">See them</a>.</p>',
        len(sessions),
        whose,
        len(slots_of),
        sum(slots_of.values()),
        sum(s.running for s in sessions),
        sum(s.credits for s in sessions),
    )


def _watchdog(
    expectations: Sequence[ExpectationView] | None,
    incidents: Sequence[Incident] | None,
    *,
    every_tenant: bool,
) -> Html:
    """The key's tenant's expectations in one line, and the open incidents: for an
    operator (``every_tenant``) every tenant's and the cluster's own, with whose."""
    if expectations is None:
        watched = html(
            '<p class="empty">The watchdog\'s expectations could not be read with this key.</p>'
        )
    else:
        watched = html(
            "<p>{0} expectation(s) registered by this key's tenant, {1} enabled: "
            '<a href="/expectations">see them</a>.</p>',
            len(expectations),
            sum(1 for e in expectations if e.enabled),
        )
    if incidents is None:
        watched = html(
            '{0}<p class="empty">The watchdog\'s incidents could not be read.</p>', watched
        )
    else:
        heading = (
            "Open incidents (every tenant's, and the cluster's own)"
            if every_tenant
            else "Open incidents"
        )
        watched = html(
            "{0}<h3>{1}</h3>{2}", watched, heading, incidents_table(incidents, whose=every_tenant)
        )
    return watched


def overview_fragment(
    topology: TopologyView,
    latest: Mapping[str, NodeMetrics | str],
    history: History,
    sessions: Sequence[WorkerSession] | None,
    expectations: Sequence[ExpectationView] | None,
    incidents: Sequence[Incident] | None,
    now_s: float,
) -> Html:
    """The overview's live part: the cluster view for an operator's key; for another, the
    nodes, its own workers and watchdog, and why there is no more."""
    as_of = when(datetime.fromtimestamp(now_s, UTC))
    workers = sessions_summary(sessions, topology.restricted)
    watchdog = _watchdog(expectations, incidents, every_tenant=not topology.restricted)
    if topology.restricted:
        return html(
            '<p class="summary">{0} node(s) (answered by {1}); as of {2}.</p>'
            '<p class="notice restricted">{3}</p>{4}'
            "<h2>Workers</h2>{5}<h2>Watchdog</h2>{6}",
            len(topology.nodes),
            topology.answered_by,
            as_of,
            RESTRICTED_NOTE,
            _tenant_nodes(topology),
            workers,
            watchdog,
        )
    owned = len(topology.shards)
    unowned = topology.shard_count - owned
    return html(
        '<p class="summary">{0} node(s), {1}/{2} shards owned{3} (answered by {4}); as of '
        "{5}.</p>{6}"
        "<h2>Shard map</h2>{7}<h2>Dispatch lateness</h2>{8}<h2>Workers</h2>{9}"
        "<h2>Watchdog</h2>{10}",
        len(topology.nodes),
        owned,
        topology.shard_count,
        f", {unowned} UNOWNED" if unowned else "",
        topology.answered_by,
        as_of,
        _operator_nodes(topology, latest, history),
        shard_map_svg(topology),
        lateness_svg(history, now_s),
        workers,
        watchdog,
    )


def overview_page(fragment: Html, csrf: str) -> Html:
    return page("Overview", live_section("/overview/live", fragment), active="overview", csrf=csrf)


# --- workers --------------------------------------------------------------------------------

WORKER_FILTER_KEYS = ("worker", "node")


@dataclass(frozen=True)
class WorkerFilters:
    """The workers page's filters and page, as the query string gives them."""

    worker: str = ""
    node: str = ""
    page_token: str = ""

    def query(self, *, page_token: str = "") -> str:
        pairs = [("worker", self.worker), ("node", self.node), ("page", page_token)]
        return urllib.parse.urlencode([(k, v) for k, v in pairs if v])


def parse_worker_filters(query: Mapping[str, str]) -> WorkerFilters:
    """Filters from a query string; the API judges them (a refusal is the error page)."""
    return WorkerFilters(
        worker=query.get("worker", "").strip(),
        node=query.get("node", "").strip(),
        page_token=query.get("page", ""),
    )


def _worker_filter_form(filters: WorkerFilters) -> Html:
    return html(
        '<form method="get" action="/workers" class="filters">'
        '<label>worker <input type="text" name="worker" value="{0}"></label>'
        '<label>node <input type="text" name="node" value="{1}"></label>'
        '<button type="submit">Filter</button> <a href="/workers">clear</a></form>',
        filters.worker,
        filters.node,
    )


def _age(value: datetime | None, now: datetime) -> str:
    if value is None:
        return EMPTY
    return seconds_text(max((now - value).total_seconds(), 0.0)) + " ago"


def workers_fragment(filters: WorkerFilters, found: WorkerSessionPage, now: datetime) -> Html:
    """What the workers page shows and refreshes: one row per worker and node it has a
    stream with (the tenant column for an operator, who sees every tenant's)."""
    tenant_column = not found.restricted
    rows = join(
        html(
            '<tr class="session" data-worker="{0}" data-node="{1}"><td class="mono">{0}</td>'
            '<td class="mono">{1}</td>{2}<td>{3}</td><td>{4}</td><td class="num">{5}</td>'
            '<td class="num">{6}</td><td class="num">{7}</td><td title="{8}">{9}</td>'
            '<td title="{10}">{11}</td><td>{12}</td></tr>',
            s.worker_id,
            s.node_id,
            html("<td>{0}</td>", s.tenant_name or s.tenant_id or EMPTY)
            if tenant_column
            else Html(""),
            ", ".join(s.queues) or EMPTY,
            ", ".join(s.task_types) or EMPTY,
            s.slots,
            s.credits,
            s.running,
            when(s.connected_at),
            _age(s.connected_at, now),
            when(s.reported_at),
            _age(s.reported_at, now),
            html('<span class="badge s-paused">draining</span>')
            if s.draining
            else html('<span class="badge s-active">serving</span>'),
        )
        for s in found.sessions
    )
    whose = (
        html(
            '<p class="notice restricted">Your tenant\'s workers only (those that connect '
            "with its key): {0}</p>",
            RESTRICTED_NOTE,
        )
        if found.restricted
        else Html("")
    )
    table = (
        html(
            '<table class="workers"><thead><tr><th>worker</th><th>node</th>{0}<th>queues</th>'
            "<th>task types</th><th>slots</th><th>credits</th><th>running</th>"
            "<th>connected</th><th>figures as of</th><th>state</th></tr></thead>"
            "<tbody>{1}</tbody></table>",
            Html("<th>tenant</th>") if tenant_column else Html(""),
            rows,
        )
        if found.sessions
        else html('<p class="empty">No worker session matches.</p>')
    )
    paging = paging_links("/workers", filters, found.next_page_token)
    return html(
        '{0}<p class="summary">{1} session(s) on this page (answered by {2}); as of {3}. '
        "A worker holds one stream with every node: it is listed once per node. Credits "
        "and running are as of each node's last record of its sessions; the answering "
        "node's are live.</p>{4}{5}",
        whose,
        len(found.sessions),
        found.answered_by,
        when(now),
        table,
        paging,
    )


def workers_page(filters: WorkerFilters, fragment: Html, csrf: str) -> Html:
    query = filters.query(page_token=filters.page_token)
    live = "/workers/live" + (f"?{query}" if query else "")
    return page(
        "Workers and sessions",
        html("{0}{1}", _worker_filter_form(filters), live_section(live, fragment)),
        active="workers",
        csrf=csrf,
    )
