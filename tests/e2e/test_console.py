"""The web console (``chronoshard console``, issue 19) in a real browser against a real
cluster: Debian's headless chromium driven by Playwright (its own browser downloads are
never used: ``executable_path`` is the system's, :func:`fixtures.system.chromium`).

One scheduler node process, one worker process (``console_workers.py``: ``console.flaky``
fails its first attempt with a traceback and succeeds on a retry; it connects with tenant
A's key, so it is A's worker) and the console process itself (``python -m chronoshard.cli
console``) are shared by the module, as is one browser. Tenant A has a dead-lettered task
whose payload holds a ``<script>``, a schedule, a diamond workflow and an open incident;
tenant B has nothing; an operator tenant sees the cluster views. The tests, in order, as
a user: log in (a wrong key first: the API's refusal is shown), see the cluster overview
as the operator and the restricted one as tenant A (its nodes, workers and incidents, and
why no more), the workers page (A's own worker; every worker with its tenant for the
operator; none for B), find the failed task, read its traceback, retry it and see it
complete without reloading (the live update), pause the schedule, create one from the
form, open the workflow's graph, retry a failed workflow; as tenant B, see A's task as
"not found"; and the security checks: the payload renders as text (the script never
ran), the session cookie is HttpOnly and SameSite=Strict, no URL the browser asked for
holds the key, every page carries the CSP, a POST without (or with a wrong) CSRF token is
refused with 403. Last, a console of its own is stopped with SIGTERM: it exits 0 at once.

The screenshots go to a temporary folder, or with
CHRONOSHARD_UPDATE_SCREENSHOTS=1 to docs/console/, where docs/console.md shows them (a
suite run leaves the checkout as it found it).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from console_workers import WORKER_ID
from fixtures.system import chromium
from harness.cluster import Cluster, running_cluster
from harness.processes import ManagedProcess

from chronoshard import ScheduleSpec, TaskSpec, WorkflowEdge, WorkflowTask
from chronoshard._dev.processes import free_ports
from chronoshard.services import EtcdProcess
from chronoshard.sync_client import SyncClient

playwright_sync = pytest.importorskip("playwright.sync_api")

DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
UPDATE_SCREENSHOTS_ENV = "CHRONOSHARD_UPDATE_SCREENSHOTS"
SCREENSHOTS = (
    DOCS_SCREENSHOTS
    if os.environ.get(UPDATE_SCREENSHOTS_ENV) == "1"
    # One fixed folder, overwritten by every run: nothing piles up.
    else Path(tempfile.gettempdir()) / "chronoshard-console-screenshots"
)
WORKER = "console_workers:worker"
ENV = {"CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1"}
SCRIPT_PAYLOAD = "<script>window.__pwned = 1</script><b>bold?</b>"
SCHEDULE = "nightly-ledger"
# The watchdog's alert about the schedule's job, as its checker writes one (the watchdog's
# own tests open such alerts for real; here only their display is at stake).
INCIDENT_SUMMARY = "nightly-ledger has not completed for 26 h <em>(expected daily)</em>"
CLUSTER_INCIDENT = "the canary has not run for 45 s"
WAIT_S = 20.0
TERMINAL = {"COMPLETED", "DEAD_LETTER", "CANCELLED", "UPSTREAM_FAILED"}


def until(check: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy, with a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@dataclass
class Setup:
    cluster: Cluster
    url: str
    console: ManagedProcess
    key_a: str
    key_b: str
    key_operator: str
    failed_task: str
    workflow_id: str
    failed_workflow_id: str


def _console(cluster: Cluster, log_dir: Path, name: str = "console") -> tuple[ManagedProcess, str]:
    """A ``chronoshard console`` process for the cluster on a free port, and its URL."""
    port = free_ports(1)[0]
    console = ManagedProcess(
        name=name,
        argv=[
            sys.executable,
            "-m",
            "chronoshard.cli",
            "console",
            "--target",
            ",".join(cluster.targets()),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        env={**os.environ},
        log_path=log_dir / f"{name}.log",
    )
    console.start()
    url = f"http://127.0.0.1:{port}"
    until(lambda: _http_ok(url + "/healthz"), timeout_s=WAIT_S, what=f"the {name}")
    return console, url


def _http_ok(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=1) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def setup(
    db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    chromium()  # skip (or fail, where CI promised the tools) before starting anything
    log_dir = tmp_path_factory.mktemp("console")
    with running_cluster(
        db_dsn, etcd.endpoint, log_dir, nodes=1, workers=0, shard_count=8, scheduler_env=ENV
    ) as cluster:
        cluster.start_worker("worker-1", WORKER)
        console, url = _console(cluster, log_dir)
        try:
            tenant_b = cluster.new_tenant(f"b-{uuid.uuid4().hex[:8]}")
            operator = cluster.new_tenant(f"ops-{uuid.uuid4().hex[:8]}", operator=True)
            with psycopg.connect(cluster.dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO alerts (kind, dedup_key, tenant_id, job_id, severity, summary)"
                    " VALUES ('job_overdue', 'job/nightly-ledger', %s, 'nightly-ledger',"
                    " 'critical', %s)",
                    (cluster.tenant.tenant.id, INCIDENT_SUMMARY),
                )
                # And one of the cluster's own (no tenant): the operator's overview only.
                conn.execute(
                    "INSERT INTO alerts (kind, dedup_key, severity, summary) VALUES"
                    " ('canary_late', 'canary/late', 'critical', %s)",
                    (CLUSTER_INCIDENT,),
                )
            with SyncClient(cluster.targets(), api_key=cluster.api_key) as client:
                failed = client.submit(
                    "console.flaky", {"note": SCRIPT_PAYLOAD}, max_retries=0, strict_timing=True
                ).task.id
                client.create_schedule(
                    ScheduleSpec(name=SCHEDULE, task=TaskSpec(type="console.ok"), cron="0 3 * * *")
                )
                refs = ["extract", "clean", "enrich", "load"]
                edges = [
                    ("extract", "clean"),
                    ("extract", "enrich"),
                    ("clean", "load"),
                    ("enrich", "load"),
                ]
                workflow = client.create_workflow(
                    "ledger-etl",
                    [
                        WorkflowTask(ref, TaskSpec(type="console.ok", strict_timing=True))
                        for ref in refs
                    ],
                    [WorkflowEdge(p, c) for p, c in edges],
                ).workflow.id
                # A workflow whose last task fails (no retries): FAILED until retried.
                failed_workflow = client.create_workflow(
                    "ledger-reload",
                    [
                        WorkflowTask("fetch", TaskSpec(type="console.ok", strict_timing=True)),
                        WorkflowTask(
                            "apply",
                            TaskSpec(type="console.flaky", max_retries=0, strict_timing=True),
                        ),
                    ],
                    [WorkflowEdge("fetch", "apply")],
                ).workflow.id
                until(
                    lambda: client.get_workflow(failed_workflow).workflow.state.value == "FAILED",
                    timeout_s=WAIT_S,
                    what="the second workflow to fail",
                )
                until(
                    lambda: client.get(failed).status.value == "DEAD_LETTER",
                    timeout_s=WAIT_S,
                    what="the flaky task to dead-letter",
                )
                until(
                    lambda: client.get_workflow(workflow).workflow.state.value == "SUCCEEDED",
                    timeout_s=WAIT_S,
                    what="the workflow to succeed",
                )
            yield Setup(
                cluster,
                url,
                console,
                cluster.api_key,
                tenant_b.api_key,
                operator.api_key,
                failed,
                workflow,
                failed_workflow,
            )
        except BaseException:
            print(cluster.logs())
            print("==== console\n" + console.log())
            raise
        finally:
            if console.alive():
                console.stop(timeout_s=10)


@pytest.fixture(scope="module")
def browser(setup: Setup) -> Iterator[Any]:
    with playwright_sync.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium(), headless=True)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Visit:
    """A logged-in browser context and every URL it requested."""

    context: Any
    page: Any
    urls: list[str]
    csp: list[str]


def _visit(browser: Any, setup: Setup, key: str) -> Visit:
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    urls: list[str] = []
    csp: list[str] = []
    page.on("request", lambda request: urls.append(request.url))

    def on_response(response: Any) -> None:
        if response.url.startswith(setup.url) and "/static/" not in response.url:
            csp.append(response.headers.get("content-security-policy", ""))

    page.on("response", on_response)
    page.goto(setup.url + "/")
    assert page.url.endswith("/login")
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    page.wait_for_url(setup.url + "/")
    return Visit(context, page, urls, csp)


@pytest.fixture(scope="module")
def tenant_a(browser: Any, setup: Setup) -> Iterator[Visit]:
    visit = _visit(browser, setup, setup.key_a)
    yield visit
    visit.context.close()


@pytest.fixture(scope="module")
def operator(browser: Any, setup: Setup) -> Iterator[Visit]:
    visit = _visit(browser, setup, setup.key_operator)
    yield visit
    visit.context.close()


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_a_wrong_key_is_refused_with_the_apis_reason(browser: Any, setup: Setup) -> None:
    context = browser.new_context(viewport={"width": 1200, "height": 600})
    try:
        page = context.new_page()
        page.goto(setup.url + "/tasks")
        assert page.url == setup.url + "/login"  # not logged in: sent to the login page
        page.fill("#api_key", "cs_not-a-real-key")
        page.click("button[type=submit]")
        alert = page.locator(".error")
        assert "refused the key" in alert.inner_text()
        assert "UNAUTHENTICATED" in alert.inner_text()
        shot(page, "login")
    finally:
        context.close()


def test_the_operator_overview_shows_the_node_its_shards_and_the_workers(
    operator: Visit, setup: Setup
) -> None:
    page = operator.page
    page.goto(setup.url + "/")
    assert "node-1" in page.locator("table.nodes").inner_text()
    assert page.locator("svg.shards rect.cell").count() == 8
    assert page.locator("svg.shards rect.unowned").count() == 0
    assert page.locator(".restricted").count() == 0
    # Every tenant's workers: tenant A's one worker, one session with the one node.
    summary = page.locator("#sessions-summary").inner_text()
    assert "1 session(s) in the cluster, of 1 worker(s) with 8 slot(s)" in summary
    # Every tenant's open incidents and the cluster's own, each with whose it is.
    incidents = page.locator("table.incidents tr.incident.open")
    tenants = {
        incidents.nth(i).locator("td.tenant").inner_text(): incidents.nth(i).inner_text()
        for i in range(incidents.count())
    }
    assert INCIDENT_SUMMARY in tenants[setup.cluster.tenant.tenant.name]
    assert CLUSTER_INCIDENT in tenants["cluster"]
    # The live section refreshes itself from /overview/live (a stamp after each swap).
    playwright_sync.expect(page.locator("#live")).to_have_attribute(
        "data-updated", re.compile(".+"), timeout=10_000
    )
    # Tasks dispatched while the page is open are plotted, without a reload: the console
    # samples the node's lateness histogram every 2 s (a point per interval, per node).
    with SyncClient(setup.cluster.targets(), api_key=setup.key_a) as client:
        for i in range(24):
            client.submit("console.ok", {"i": i}, delay_s=0.25 * i, strict_timing=True)
    plotted = page.locator("svg.plot polyline.p50")
    playwright_sync.expect(plotted).to_have_count(1, timeout=WAIT_S * 1000)
    assert page.locator("svg.plot polyline.p99").count() == 1
    until(
        lambda: len((plotted.get_attribute("points") or "").split()) >= 2,
        timeout_s=WAIT_S,
        what="two points of dispatch lateness",
    )
    shot(page, "overview")


def test_a_tenants_overview_has_its_own_views_and_says_why_no_more(
    tenant_a: Visit, setup: Setup
) -> None:
    page = tenant_a.page
    page.goto(setup.url + "/")
    # The nodes its workers connect to, no shard map, no lateness, and why.
    assert "node-1" in page.locator("table.nodes").inner_text()
    assert page.locator("svg.shards").count() == 0
    assert page.locator("svg.plot").count() == 0
    assert "not an operator's" in page.locator(".notice.restricted").inner_text()
    summary = page.locator("#sessions-summary").inner_text()
    assert "1 session(s) of this tenant's workers" in summary
    # The tenant's open incident, its HTML as text (not the cluster's own).
    incident = page.locator("table.incidents tr.incident.open")
    assert incident.count() == 1 and page.locator("table.incidents td.tenant").count() == 0
    assert INCIDENT_SUMMARY in incident.inner_text()
    assert page.locator("table.incidents em").count() == 0
    shot(page, "overview-tenant")
    page.click("nav a[href='/expectations']")
    page.wait_for_url(setup.url + "/expectations")
    assert INCIDENT_SUMMARY in page.locator("table.incidents").inner_text()
    shot(page, "incidents")


def test_the_workers_page_lists_each_tenants_own_workers_and_every_one_for_an_operator(
    tenant_a: Visit, operator: Visit, browser: Any, setup: Setup
) -> None:
    page = tenant_a.page
    page.goto(setup.url + "/")
    page.click("nav a[href='/workers']")
    page.wait_for_url(setup.url + "/workers")
    [row] = page.locator("table.workers tr.session").all()
    assert (row.get_attribute("data-worker"), row.get_attribute("data-node")) == (
        WORKER_ID,
        "node-1",
    )
    cells = row.inner_text()
    assert "console.flaky, console.ok" in cells and "default" in cells and "serving" in cells
    assert page.locator("table.workers th", has_text="tenant").count() == 0
    assert "Your tenant's workers only" in page.locator(".notice.restricted").inner_text()
    # The figures refresh without a reload.
    playwright_sync.expect(page.locator("#live")).to_have_attribute(
        "data-updated", re.compile(".+"), timeout=10_000
    )

    # The operator sees every tenant's workers, and whose each is.
    page = operator.page
    page.goto(setup.url + "/workers")
    [row] = page.locator("table.workers tr.session").all()
    assert setup.cluster.tenant.tenant.name in row.inner_text()
    assert page.locator("table.workers th", has_text="tenant").count() == 1
    assert page.locator(".restricted").count() == 0
    # Filtered to a worker nobody has: none, and the filter stays in the form.
    page.fill("form.filters input[name=worker]", "<b>nobody</b>")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r".*/workers\?worker=.*"))
    assert "No worker session matches." in page.inner_text("main")
    assert page.locator("form.filters input[name=worker]").input_value() == "<b>nobody</b>"
    page.goto(setup.url + "/workers")
    shot(page, "workers")

    # Tenant B has no worker of its own: A's is not listed to it.
    visit = _visit(browser, setup, setup.key_b)
    try:
        visit.page.goto(setup.url + "/workers")
        assert visit.page.locator("table.workers").count() == 0
        assert "No worker session matches." in visit.page.inner_text("main")
    finally:
        visit.context.close()


def test_find_the_failed_task_read_its_traceback_retry_it_and_see_it_complete(
    tenant_a: Visit, setup: Setup
) -> None:
    page = tenant_a.page
    page.goto(setup.url + "/tasks")
    page.select_option("select[name=status]", "DEAD_LETTER")
    page.click("form.filters button[type=submit]")
    assert "status=DEAD_LETTER" in page.url
    row = page.locator("table.tasks tbody tr", has_text=setup.failed_task)
    assert row.count() == 1
    assert "DEAD_LETTER" in row.inner_text()
    shot(page, "tasks")
    row.locator("a").click()
    page.wait_for_url(f"{setup.url}/tasks/{setup.failed_task}")
    traceback = page.locator("pre.traceback").first.inner_text()
    assert "Traceback (most recent call last)" in traceback
    assert "_load_ledger" in traceback
    assert "ValueError: the first attempt of a console test task fails on purpose" in traceback
    # The payload's HTML is text on the page, and its script never ran.
    assert SCRIPT_PAYLOAD in page.locator("#payload").inner_text()
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#payload b").count() == 0
    shot(page, "task-failed")
    page.click("form[action$='/retry'] button")
    page.wait_for_url(f"{setup.url}/tasks/{setup.failed_task}?done=retried")
    # No reload from here: the live update swaps the section in when the task completes.
    badge = page.locator("#live dl.fields .badge").first
    playwright_sync.expect(badge).to_have_text("COMPLETED", timeout=WAIT_S * 1000)
    assert page.locator("svg.timeline rect.a-succeeded").count() == 1
    assert page.locator("svg.timeline rect.a-failed").count() == 1
    assert '"attempt": 2' in page.locator("#result").inner_text()
    shot(page, "task-retried")


def test_pause_a_schedule(tenant_a: Visit, setup: Setup) -> None:
    page = tenant_a.page
    page.goto(setup.url + "/schedules")
    row = page.locator("table.schedules tbody tr", has_text=SCHEDULE)
    assert "active" in row.inner_text()
    row.locator("form[action$='/pause'] button").click()
    page.wait_for_url(re.compile(r".*done=paused$"))
    assert "paused" in page.locator("dl.fields").inner_text()
    assert page.locator("form[action$='/resume']").count() == 1
    assert page.locator("h2", has_text="Next occurrences").count() == 1
    shot(page, "schedule-paused")


def test_create_a_schedule_from_the_form(tenant_a: Visit, setup: Setup) -> None:
    page = tenant_a.page
    page.goto(setup.url + "/schedules")
    page.click("a[href='/schedules/new']")
    page.fill("#name", "hourly-digest")
    page.fill("#cron", "0 * * * * * *")  # seven fields: the API refuses it
    page.fill("#type", "console.ok")
    page.fill("#payload", '{"title": "<i>digest</i>"}')
    page.click("form.schedule-form button[type=submit]")
    # Refused by the API, on the form, with what was typed kept (and not run as HTML).
    error = page.locator("form.schedule-form .error").inner_text()
    assert "INVALID_ARGUMENT" in error and "cron" in error
    assert page.locator("#name").input_value() == "hourly-digest"
    assert page.locator("#payload").input_value() == '{"title": "<i>digest</i>"}'
    assert page.locator("form.schedule-form i").count() == 0
    shot(page, "schedule-form-refused")
    page.fill("#cron", "0 * * * *")
    page.click("form.schedule-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/schedules/[0-9a-f-]+\?done=created$"))
    assert "Created." in page.locator(".notice").inner_text()
    occurrences = page.locator("h2:has-text('Next occurrences') + ul > li")
    assert occurrences.count() == 5  # the console asks for the next five
    with SyncClient(setup.cluster.targets(), api_key=setup.key_a) as client:
        made = client.get_schedule("hourly-digest")
    assert made.schedule.spec.cron == "0 * * * *"
    assert made.schedule.spec.task is not None
    assert made.schedule.spec.task.payload == {"title": "<i>digest</i>"}


def test_open_a_workflow_graph(tenant_a: Visit, setup: Setup) -> None:
    page = tenant_a.page
    page.goto(setup.url + "/workflows")
    page.locator("a", has_text="ledger-etl").click()
    page.wait_for_url(f"{setup.url}/workflows/{setup.workflow_id}")
    nodes = page.locator("svg.dag g[data-ref]")
    assert nodes.count() == 4
    assert page.locator("svg.dag path.edge").count() == 4
    states = {
        nodes.nth(i).get_attribute("data-ref"): nodes.nth(i).get_attribute("data-status")
        for i in range(4)
    }
    assert states == dict.fromkeys(["extract", "clean", "enrich", "load"], "COMPLETED")

    # Layered: the root above its children, the sink below them.
    def top(ref: str) -> float:
        return float(page.locator(f"svg.dag g[data-ref={ref}] rect").get_attribute("y") or "nan")

    assert top("extract") < top("clean") == top("enrich") < top("load")
    shot(page, "workflow")


def test_retry_a_failed_workflow_and_see_it_succeed(tenant_a: Visit, setup: Setup) -> None:
    page = tenant_a.page
    page.goto(f"{setup.url}/workflows/{setup.failed_workflow_id}")
    graph = page.locator("svg.dag g[data-ref=apply]")
    assert graph.get_attribute("data-status") == "DEAD_LETTER"
    # A finished run has no Cancel; a failed one offers the retry.
    assert page.locator("form[action$='/cancel']").count() == 0
    page.click("form[action$='/retry'] button")
    page.wait_for_url(f"{setup.url}/workflows/{setup.failed_workflow_id}?done=retried")
    assert "what completed is kept" in page.locator(".notice").inner_text()
    # The page follows the run without a reload: the retried task completes (its second
    # attempt succeeds), the one that had completed was not run again.
    page.wait_for_selector(
        "svg.dag g[data-ref=apply][data-status=COMPLETED]", timeout=WAIT_S * 1000
    )
    assert page.locator("svg.dag g[data-ref=fetch]").get_attribute("data-status") == "COMPLETED"
    shot(page, "workflow-retried")
    with SyncClient(setup.cluster.targets(), api_key=setup.key_a) as client:
        detail = client.get_workflow(setup.failed_workflow_id)
    assert detail.workflow.state.value == "SUCCEEDED"
    fetch = next(t for t in detail.tasks if t.ref == "fetch")
    assert fetch.task.attempt == 1


def test_tenant_b_cannot_see_tenant_as_task(browser: Any, setup: Setup) -> None:
    visit = _visit(browser, setup, setup.key_b)
    try:
        page = visit.page
        reply = page.goto(f"{setup.url}/tasks/{setup.failed_task}")
        assert reply is not None and reply.status == 404
        assert "not found" in page.locator("h1").inner_text()
        page.goto(setup.url + "/tasks")
        assert page.locator("table.tasks").count() == 0
        assert "No task matches" in page.inner_text("main")
        # Nor A's incidents.
        page.goto(setup.url + "/expectations")
        assert page.locator("table.incidents").count() == 0
        assert "No incident." in page.inner_text("main")
        page.goto(f"{setup.url}/tasks/{setup.failed_task}")
        shot(page, "tenant-b-not-found")
    finally:
        visit.context.close()


def test_the_session_cookie_the_urls_and_the_headers(tenant_a: Visit, setup: Setup) -> None:
    [cookie] = [c for c in tenant_a.context.cookies() if c["name"] == "chronoshard_console"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert setup.key_a not in cookie["value"]
    assert tenant_a.urls, "the browser made requests"
    assert [u for u in tenant_a.urls if setup.key_a in u] == []
    assert set(tenant_a.csp) == {
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    }
    assert setup.key_a not in setup.console.log()


def test_a_post_without_the_csrf_token_is_refused(tenant_a: Visit, setup: Setup) -> None:
    request = tenant_a.context.request  # the session's cookie goes along
    target = f"{setup.url}/schedules/{SCHEDULE}/resume"
    assert request.post(target, form={}).status == 403
    assert request.post(target, form={"csrf": "forged"}).status == 403
    # Nothing happened: the schedule is still paused.
    page = tenant_a.page
    page.goto(f"{setup.url}/schedules/{SCHEDULE}")
    assert "paused" in page.locator("dl.fields").inner_text()


def test_sigterm_stops_the_console_gracefully(browser: Any, setup: Setup, tmp_path: Path) -> None:
    console, url = _console(setup.cluster, tmp_path, "console-stopped")
    try:
        context = browser.new_context()
        page = context.new_page()
        page.goto(url + "/login")
        page.fill("#api_key", setup.key_a)
        page.click("button[type=submit]")
        page.wait_for_url(url + "/")  # a session, with its client's channels open
        context.close()
        started = time.monotonic()
        code = console.stop(timeout_s=10)
        took_s = time.monotonic() - started
    finally:
        if console.alive():
            console.kill()
    # Not killed by the signal (-15): it stopped its server and closed its sessions.
    assert code == 0, console.log()
    assert took_s < 6.0, took_s
    assert console.logged("chronoshard console: stopped")
    assert "Traceback" not in console.log()
