"""The console's HTTP server (aiohttp): routes, the session and CSRF checks, the
security headers, and the calls each page makes through
:mod:`chronoshard.console.backend`.

Every response carries a strict content security policy (:data:`CSP`: scripts and styles
from this origin only, no inline ones, no framing, forms posting only here), and
``Cache-Control: no-store`` on pages: they hold a tenant's data. Every POST must carry
the session's CSRF token (a 403 otherwise, before any handler runs). A session whose key
the API stops accepting (revoked, rotated) is ended and the browser sent to the login
page. Nothing here logs a key: the access log shows the request line, and URLs never
hold one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from chronoshard.client import Client
from chronoshard.console import cluster_views, views
from chronoshard.console.backend import Cluster, ExpectationView, MetricsPoller
from chronoshard.console.markup import Html
from chronoshard.console.sessions import Session, SessionStore, tokens_match
from chronoshard.errors import (
    AlreadyExistsError,
    ChronoshardError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from chronoshard.types import Incident, Resolution, WorkerSession

log = logging.getLogger(__name__)
T = TypeVar("T")

STATIC_DIR = Path(__file__).resolve().parent / "static"
COOKIE = "chronoshard_console"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
PUBLIC_PATHS = ("/login",)
UNSESSIONED_PATHS = ("/static/", "/healthz")
TASK_PAGE_SIZE = 50
SESSION_SWEEP_S = 60.0

SESSIONS = web.AppKey("sessions", SessionStore)
CLUSTER = web.AppKey("cluster", Cluster)
POLLER = web.AppKey("poller", MetricsPoller)
SECURE_COOKIE = web.AppKey("secure_cookie", bool)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _now() -> float:
    return time.monotonic()


def _page(body: Html, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


def _set_cookie(request: web.Request, response: web.StreamResponse, session: Session) -> None:
    response.set_cookie(
        COOKIE,
        session.id,
        httponly=True,
        samesite="Strict",
        secure=request.app[SECURE_COOKIE],
        path="/",
    )


def session_of(request: web.Request) -> Session:
    session: Session = request["session"]
    return session


def client_of(request: web.Request) -> Any:
    return session_of(request).client


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = exc
    response.headers.update(SECURITY_HEADERS)
    if not request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"
    if isinstance(response, web.HTTPException) and response.status >= 300:
        raise response
    return response


@web.middleware
async def sessions_and_csrf(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Find the session; send the unauthenticated to /login; refuse a POST whose CSRF
    token is not the session's."""
    if request.path.startswith(UNSESSIONED_PATHS) and request.method == "GET":
        return await handler(request)
    store = request.app[SESSIONS]
    session = store.get(request.cookies.get(COOKIE), _now())
    public = request.path.startswith(PUBLIC_PATHS)
    if request.method == "POST":
        form = await request.post()
        presented = form.get("csrf")
        if session is None or not tokens_match(
            session.csrf_token, presented if isinstance(presented, str) else None
        ):
            return web.Response(
                status=403, text="403: missing or wrong CSRF token (reload the page)"
            )
    if session is None or not (session.logged_in or public):
        if public:
            session = store.create(_now())
            request["session"] = session
            response = await handler(request)
            _set_cookie(request, response, session)
            return response
        if request.path.endswith("/live"):
            return web.json_response({"login": True}, status=401)
        raise web.HTTPSeeOther("/login")
    request["session"] = session
    try:
        return await handler(request)
    except Refused as refused:
        if request.path.endswith("/live"):
            # The page's script keeps what it shows and says why it stopped refreshing.
            status = 404 if isinstance(refused.error, NotFoundError) else 502
            return web.json_response({"error": str(refused.error)}, status=status)
        return _failure(request, refused.error, refused.what)
    except UnauthenticatedError:
        # The key stopped working (revoked, rotated): this session is over.
        await _end(request, session)
        raise web.HTTPSeeOther("/login") from None


async def _end(request: web.Request, session: Session) -> None:
    request.app[SESSIONS].remove(session.id)
    if session.client is not None:
        await session.client.close()


class Refused(Exception):
    """An API call of a page refused: :func:`sessions_and_csrf` shows it as the page."""

    def __init__(self, error: ChronoshardError, what: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.what = what


async def asked(request: web.Request, what: str, call: Callable[[Client], Awaitable[T]]) -> T:
    """``call`` with the session's client. A refusal raises :class:`Refused`, shown as
    the error page about ``what``; an unauthenticated one ends the session (the
    middleware's), whatever page asked."""
    try:
        return await call(client_of(request))
    except UnauthenticatedError:
        raise
    except ChronoshardError as exc:
        raise Refused(exc, what) from exc


def _failure(request: web.Request, exc: ChronoshardError, what: str) -> web.Response:
    """A refused call as a page: not found is 404; what the caller may not do, 403;
    a refusal of the request, 409/400; the cluster failing, 502. The API's message is
    shown (escaped), which names the cause."""
    status = 502
    if isinstance(exc, NotFoundError):
        status = 404
    elif isinstance(exc, PermissionDeniedError):
        status = 403
    elif isinstance(exc, FailedPreconditionError):
        status = 409
    elif isinstance(exc, InvalidArgumentError):
        status = 400
    title = f"{what}: not found" if status == 404 else f"{what}: refused"
    return _page(views.error_page(title, str(exc), session_of(request).csrf_token), status)


# --- login ----------------------------------------------------------------------------------


async def login_form(request: web.Request) -> web.StreamResponse:
    session = session_of(request)
    if session.logged_in:
        raise web.HTTPSeeOther("/")
    return _page(views.login_page(session.csrf_token))


async def login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    key = form.get("api_key")
    old = session_of(request)
    if not isinstance(key, str) or not key.strip():
        return _page(views.login_page(old.csrf_token, "Enter an API key."), 400)
    key = key.strip()
    cluster = request.app[CLUSTER]
    client = cluster.client(key)
    try:
        # Any call that needs a valid key tells whether this one is: the tenant's tasks.
        await client.list(page_size=1)
    except ChronoshardError as exc:
        await client.close()
        status = 401 if isinstance(exc, UnauthenticatedError) else 502
        return _page(
            views.login_page(old.csrf_token, f"The cluster refused the key: {exc}"), status
        )
    store = request.app[SESSIONS]
    if old.client is not None:
        await old.client.close()
    session = store.log_in(old, key, "", _now())
    session.client = client
    response = web.HTTPSeeOther("/")
    _set_cookie(request, response, session)
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    await _end(request, session_of(request))
    response = web.HTTPSeeOther("/login")
    response.del_cookie(COOKIE, path="/")
    raise response


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


# --- overview -------------------------------------------------------------------------------


OVERVIEW_SESSIONS = 1000
"""Worker sessions the overview sums up at most (one page): enough for its one line."""


async def _overview(request: web.Request) -> Html:
    session = session_of(request)
    cluster = request.app[CLUSTER]
    poller = request.app[POLLER]
    assert session.api_key is not None
    topology = await cluster.topology(session.api_key)
    if not topology.restricted:
        # Only an operator's topology names the nodes' metrics endpoints.
        first_time = not poller.latest
        poller.watch(topology)
        if first_time:
            await poller.scrape_once()
        poller.start()
    sessions: list[WorkerSession] | None
    try:
        sessions = list(
            (await client_of(request).list_worker_sessions(page_size=OVERVIEW_SESSIONS)).sessions
        )
    except ChronoshardError:
        sessions = None
    expectations: list[ExpectationView] | None
    try:
        expectations = await cluster.expectations(session.api_key)
    except ChronoshardError:
        expectations = None
    incidents: list[Incident] | None
    try:
        # An operator's overview: every tenant's incidents and the cluster's own.
        incidents = await client_of(request).list_incidents(all_tenants=not topology.restricted)
    except ChronoshardError:
        incidents = None
    return cluster_views.overview_fragment(
        topology, poller.latest, poller.history, sessions, expectations, incidents, time.time()
    )


async def overview(request: web.Request) -> web.StreamResponse:
    fragment = await asked(request, "Overview", lambda _: _overview(request))
    return _page(cluster_views.overview_page(fragment, session_of(request).csrf_token))


async def overview_live(request: web.Request) -> web.StreamResponse:
    fragment = await asked(request, "Overview", lambda _: _overview(request))
    return web.json_response({"html": str(fragment), "live": True})


# --- workers --------------------------------------------------------------------------------

WORKERS_PAGE_SIZE = 100


async def _workers(request: web.Request, filters: cluster_views.WorkerFilters) -> Html:
    found = await asked(
        request,
        "Workers",
        lambda client: client.list_worker_sessions(
            worker_id=filters.worker or None,
            node_id=filters.node or None,
            page_size=WORKERS_PAGE_SIZE,
            page_token=filters.page_token or None,
        ),
    )
    return cluster_views.workers_fragment(filters, found, datetime.now(UTC))


async def workers(request: web.Request) -> web.StreamResponse:
    filters = cluster_views.parse_worker_filters(request.query)
    fragment = await _workers(request, filters)
    return _page(cluster_views.workers_page(filters, fragment, session_of(request).csrf_token))


async def workers_live(request: web.Request) -> web.StreamResponse:
    fragment = await _workers(request, cluster_views.parse_worker_filters(request.query))
    return web.json_response({"html": str(fragment), "live": True})


# --- tasks ----------------------------------------------------------------------------------


async def tasks(request: web.Request) -> web.StreamResponse:
    filters = views.parse_filters(request.query)
    found = await asked(
        request,
        "Tasks",
        lambda client: client.list(
            statuses=filters.status,
            type=filters.type or None,
            queue=filters.queue or None,
            job_id=filters.job or None,
            scheduled_from=filters.scheduled_from,
            scheduled_before=filters.scheduled_before,
            page_size=TASK_PAGE_SIZE,
            page_token=filters.page_token or None,
        ),
    )
    return _page(views.tasks_page(filters, found, session_of(request).csrf_token))


async def task_search(request: web.Request) -> web.StreamResponse:
    wanted = request.query.get("id", "").strip()
    try:
        task_id = str(uuid.UUID(wanted))
    except ValueError:
        csrf = session_of(request).csrf_token
        message = f"{wanted!r} is not a task id (a UUID)."
        return _page(views.error_page("Find a task", message, csrf), 400)
    raise web.HTTPSeeOther(views.task_href(task_id))


async def task(request: web.Request) -> web.StreamResponse:
    task_id = request.match_info["task_id"]
    notice = {
        "retried": "Sent back for a new attempt.",
        "cancelled": "Cancel requested.",
        "marked-failed": "Marked failed: dead-lettered.",
    }.get(request.query.get("done", ""))
    found = await asked(request, f"Task {task_id}", lambda c: c.get(task_id, attempts=True))
    csrf = session_of(request).csrf_token
    return _page(views.task_page(found, csrf, datetime.now(UTC), notice))


async def task_live(request: web.Request) -> web.StreamResponse:
    task_id = request.match_info["task_id"]
    found = await asked(request, f"Task {task_id}", lambda c: c.get(task_id, attempts=True))
    fragment = views.task_fragment(found, session_of(request).csrf_token, datetime.now(UTC))
    return web.json_response(
        {"html": str(fragment), "live": views.task_is_live(found), "status": found.status.value}
    )


async def task_action(request: web.Request) -> web.StreamResponse:
    task_id, action = request.match_info["task_id"], request.match_info["action"]
    calls: dict[str, tuple[str, Callable[[Client], Awaitable[object]]]] = {
        "retry": ("retried", lambda c: c.retry(task_id)),
        "cancel": ("cancelled", lambda c: c.cancel(task_id, reason="cancelled from the console")),
        "mark-failed": (
            "marked-failed",
            lambda c: c.resolve(
                task_id, Resolution.MARK_FAILED, reason="marked failed from the console"
            ),
        ),
    }
    if action not in calls:
        raise web.HTTPNotFound()
    done, call = calls[action]
    await asked(request, f"{action.capitalize()} {task_id}", call)
    raise web.HTTPSeeOther(f"{views.task_href(task_id)}?done={done}")


# --- schedules ------------------------------------------------------------------------------


async def schedules(request: web.Request) -> web.StreamResponse:
    found = await asked(request, "Schedules", lambda c: _all(c.iter_schedules()))
    return _page(views.schedules_page(found, session_of(request).csrf_token))


async def schedule_form(request: web.Request) -> web.StreamResponse:
    return _page(views.schedule_form_page(views.ScheduleForm(), session_of(request).csrf_token))


async def schedule_create(request: web.Request) -> web.StreamResponse:
    form, made = views.read_schedule_form(await request.post())
    csrf = session_of(request).csrf_token
    if isinstance(made, str):
        return _page(views.schedule_form_page(form, csrf, made), 400)
    spec = made
    try:
        created = await client_of(request).create_schedule(spec)
    except UnauthenticatedError:
        raise
    except ChronoshardError as exc:
        # Refused as a request (a cron it cannot read, a name in use): on the form, with
        # what was typed, so it can be corrected; the cluster failing is the error page.
        if isinstance(exc, InvalidArgumentError | AlreadyExistsError):
            return _page(views.schedule_form_page(form, csrf, str(exc)), 400)
        raise Refused(exc, "New schedule") from exc
    raise web.HTTPSeeOther(f"{views.schedule_href(created.id)}?done=created")


async def schedule(request: web.Request) -> web.StreamResponse:
    name = request.match_info["schedule"]
    notice = {
        "paused": "Paused.",
        "resumed": "Resumed.",
        "triggered": "One occurrence started now.",
        "created": "Created.",
    }.get(request.query.get("done", ""))
    details = await asked(
        request,
        f"Schedule {name}",
        lambda c: c.get_schedule(name, next_count=5, runs_count=10),
    )
    return _page(views.schedule_page(details, session_of(request).csrf_token, notice))


async def schedule_action(request: web.Request) -> web.StreamResponse:
    name, action = request.match_info["schedule"], request.match_info["action"]
    calls: dict[str, tuple[str, Callable[[Client], Awaitable[object]]]] = {
        "pause": ("paused", lambda c: c.pause_schedule(name)),
        "resume": ("resumed", lambda c: c.resume_schedule(name)),
        "trigger": ("triggered", lambda c: c.trigger_schedule(name)),
    }
    if action not in calls:
        raise web.HTTPNotFound()
    done, call = calls[action]
    await asked(request, f"{action.capitalize()} {name}", call)
    raise web.HTTPSeeOther(f"{views.schedule_href(name)}?done={done}")


# --- workflows and expectations ------------------------------------------------------------


async def workflows(request: web.Request) -> web.StreamResponse:
    page = await asked(request, "Workflows", lambda c: c.list_workflows(page_size=100))
    return _page(views.workflows_page(page.workflows, session_of(request).csrf_token))


async def workflow(request: web.Request) -> web.StreamResponse:
    workflow_id = request.match_info["workflow_id"]
    notice = {
        "cancelled": "Cancelled: waiting tasks at once, running ones asked to stop.",
        "retried": "Its failed and cancelled tasks were sent back; what completed is kept.",
    }.get(request.query.get("done", ""))
    detail = await asked(request, f"Workflow {workflow_id}", lambda c: c.get_workflow(workflow_id))
    return _page(views.workflow_page(detail, session_of(request).csrf_token, notice))


async def workflow_live(request: web.Request) -> web.StreamResponse:
    workflow_id = request.match_info["workflow_id"]
    detail = await asked(request, f"Workflow {workflow_id}", lambda c: c.get_workflow(workflow_id))
    fragment = views.workflow_fragment(detail, session_of(request).csrf_token)
    return web.json_response({"html": str(fragment), "live": views.workflow_is_live(detail)})


async def workflow_action(request: web.Request) -> web.StreamResponse:
    workflow_id, action = request.match_info["workflow_id"], request.match_info["action"]
    calls: dict[str, tuple[str, Callable[[Client], Awaitable[object]]]] = {
        "cancel": (
            "cancelled",
            lambda c: c.cancel_workflow(workflow_id, reason="cancelled from the console"),
        ),
        "retry": ("retried", lambda c: c.retry_workflow(workflow_id)),
    }
    if action not in calls:
        raise web.HTTPNotFound()
    done, call = calls[action]
    await asked(request, f"{action.capitalize()} workflow {workflow_id}", call)
    raise web.HTTPSeeOther(f"{views.workflow_href(workflow_id)}?done={done}")


async def expectations(request: web.Request) -> web.StreamResponse:
    session = session_of(request)
    assert session.api_key is not None
    api_key = session.api_key
    incidents = await asked(request, "Incidents", lambda c: c.list_incidents(include_resolved=True))
    found = await asked(
        request, "Expectations", lambda _: request.app[CLUSTER].expectations(api_key)
    )
    return _page(views.expectations_page(found, incidents, session.csrf_token))


async def _all(items: AsyncIterator[T]) -> list[T]:
    return [item async for item in items]


# --- the application -----------------------------------------------------------------------


async def _sweep_sessions(app: web.Application) -> None:
    while True:
        await asyncio.sleep(SESSION_SWEEP_S)
        for session in app[SESSIONS].expire(_now()):
            if session.client is not None:
                await session.client.close()


async def _lifecycle(app: web.Application) -> Any:
    sweeper = asyncio.get_running_loop().create_task(_sweep_sessions(app))
    yield
    sweeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sweeper
    await app[POLLER].close()
    for session in app[SESSIONS].expire(float("inf")):
        if session.client is not None:
            await session.client.close()
    await app[CLUSTER].close()


def make_app(
    cluster: Cluster,
    *,
    secure_cookie: bool = False,
    poll_interval_s: float = 2.0,
    idle_timeout_s: float | None = None,
) -> web.Application:
    app = web.Application(middlewares=[security_headers, sessions_and_csrf])
    app[SESSIONS] = SessionStore() if idle_timeout_s is None else SessionStore(idle_timeout_s)
    app[CLUSTER] = cluster
    app[POLLER] = MetricsPoller(poll_interval_s)
    app[SECURE_COOKIE] = secure_cookie
    app.cleanup_ctx.append(_lifecycle)
    app.add_routes(
        [
            web.get("/login", login_form),
            web.post("/login", login),
            web.post("/logout", logout),
            web.get("/healthz", healthz),
            web.get("/", overview),
            web.get("/overview/live", overview_live),
            web.get("/tasks", tasks),
            web.get("/tasks/search", task_search),
            web.get("/tasks/{task_id}", task),
            web.get("/tasks/{task_id}/live", task_live),
            web.post("/tasks/{task_id}/{action}", task_action),
            web.get("/schedules", schedules),
            web.get("/schedules/new", schedule_form),
            web.post("/schedules/new", schedule_create),
            web.get("/schedules/{schedule}", schedule),
            web.post("/schedules/{schedule}/{action}", schedule_action),
            web.get("/workflows", workflows),
            web.get("/workflows/{workflow_id}", workflow),
            web.get("/workflows/{workflow_id}/live", workflow_live),
            web.post("/workflows/{workflow_id}/{action}", workflow_action),
            web.get("/expectations", expectations),
            web.get("/workers", workers),
            web.get("/workers/live", workers_live),
            web.static("/static", STATIC_DIR, append_version=False),
        ]
    )
    return app


def server_ssl(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """TLS for the console's own listener (a certificate and its key), or None."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("the console's TLS needs both a certificate and its key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


SHUTDOWN_GRACE_S = 5.0
"""At a stop, how long requests in flight get to finish (a page's calls to the cluster
are bounded by the call timeout; a live refresh is one such page)."""


class ConsoleServer:
    """The console as a long-lived service (:class:`chronoshard.daemon.Service`): start
    listening, then wait until asked to stop (SIGTERM, SIGINT), then stop in this order:
    stop accepting connections, let the requests in flight finish (up to
    :data:`SHUTDOWN_GRACE_S`), stop the metrics poller and the session sweeper, close
    every session's client, close the shared channels (the application's cleanup)."""

    def __init__(
        self,
        cluster: Cluster,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        ready: Callable[[str], None] | None = None,
    ) -> None:
        app = make_app(cluster, secure_cookie=ssl_context is not None)
        self._runner = web.AppRunner(
            app,
            access_log=log if log.isEnabledFor(logging.INFO) else None,
            shutdown_timeout=SHUTDOWN_GRACE_S,
        )
        self._host = host
        self._port = port
        self._ssl_context = ssl_context
        self._ready = ready
        self._stopped = asyncio.Event()

    async def start(self) -> str:
        """Listen; the URL (``ready`` is told it too).

        Raises:
            OSError: the address cannot be listened on.
        """
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=self._ssl_context)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        scheme = "https" if self._ssl_context else "http"
        url = f"{scheme}://{self._host}:{self._port}"
        if self._ready is not None:
            self._ready(url)
        return url

    async def wait(self) -> None:
        """Return once stopped: the console supervises no loop that could fail on its
        own (the poller and the sweeper log their failures and go on)."""
        await self._stopped.wait()

    async def stop(self) -> None:
        await self._runner.cleanup()
        self._stopped.set()
