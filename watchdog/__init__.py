"""The Chronoshard watchdog: a dead man's switch for jobs that never ran, and canaries
through the whole path (docs/architecture.md#d10; operator guide: ``docs/watchdog.md``).

A separate process (``chronoshard-watchdog``) that imports nothing from
``chronoshard.scheduler``: it must keep working when every scheduler node is dead.

- :mod:`.incidents` — the pure core: overdue, late canary, lost database; the planner
  that keeps one alert per incident (open, re-notify, resolve).
- :mod:`.store` — its SQL, on the leader's own database session.
- :mod:`.election` — which replica is active: a PostgreSQL advisory lock.
- :mod:`.checker` — one check: read, decide, record, notify.
- :mod:`.canary` — canary tasks through the public API, served by a built-in handler.
- :mod:`.sinks`, :mod:`.notifier` — webhook, PagerDuty, Slack, log; retries off the loop.
- :mod:`.service`, :mod:`.metrics`, :mod:`.config` — the process around it (its HTTP
  endpoint is :mod:`chronoshard.http_endpoint`, shared with the scheduler node).
"""
