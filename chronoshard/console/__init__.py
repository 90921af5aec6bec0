"""The web console: ``chronoshard console``, a process of its own serving HTML pages
about one cluster, which it talks to only through the public gRPC API with the key of
whoever logged in (issue 19).

The story of a request: the browser holds a random session id in an HttpOnly,
SameSite=Strict cookie and nothing else; the console finds the session
(:mod:`.sessions`), which holds the user's API key and a :class:`chronoshard.Client`
made with it; the page's handler (:mod:`.server`) makes its calls through
:mod:`.backend` — the client for tasks, schedules and workflows, the generated stubs
for the topology (``AdminService``) and the watchdog's expectations
(``WatchdogService``) — so what a tenant sees is exactly what the API lets its key see
(another tenant's task is "not found"). The answer becomes HTML in :mod:`.views`, where
every value is escaped by construction (:mod:`.markup`): a payload with ``<script>`` in
it renders as text. Workflow graphs are laid out by :mod:`.graph`; dispatch lateness
over time is kept in memory by :mod:`.lateness`, from each node's /metrics scraped every
2 s while someone watches the overview.

Security in one place: no key in a URL or a log line (the login form posts it once);
a CSRF token per session in every form, checked on every POST; a strict content security
policy (no inline script or style, nothing from another origin, no framing); pages are
``no-store``. A static script (``static/console.js``) refreshes the overview and an
unfinished task every 2 s from the page's JSON endpoint; every page works without it.

Pure parts (``markup``, ``sessions``, ``graph``, ``lateness``, ``views``) do no I/O and
are tested as units; ``backend`` and ``server`` are the I/O. docs/console.md shows the
pages.
"""

from __future__ import annotations

__all__: list[str] = []
