"""The watchdog process: election, the leader's loops, the outage alarm, HTTP.

Every replica runs three supervised loops:

- **lead** — wait for the leader lock (:class:`~.election.Election`), then, for as long as
  the session that holds it lives: write the config file's expectations, and run the
  check loop (every ``check_interval_s``), the canary runner (if enabled) and a session
  check (every ``election.retry_interval_s``). The first of them to fail on the database
  ends the term: the loops are cancelled, deliveries in flight get a moment to finish and
  be recorded, the session is closed (releasing the lock for a standby), and the replica
  competes again.
- **outage** — every second, whether this replica has gone longer than
  ``database.outage_tolerance_s`` without a successful statement. That alert cannot be
  recorded in the database it is about, so it lives in memory (:class:`MemoryAlerts`)
  and goes straight to the sinks. Every replica raises it for itself: a standby cut off
  from the database could not take over either.
- **http** — ``/metrics`` and ``/healthz``.

A supervised loop that crashes stops the process loudly (its supervisor restarts it);
one check that fails on a bug is logged and counted, and the next one runs on time.

Shutdown (SIGTERM), in order: stop the outage loop; end the leader term (its loops stop,
deliveries in flight finish or are cancelled after a grace period, the session closes and
the standby takes over within one retry interval); stop the HTTP server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Awaitable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chronoshard.clock import Clock, SystemClock
from chronoshard.http_endpoint import HttpServer, Response
from chronoshard.watchdog.canary import CanaryRunner, CanaryStats, canary_tls
from chronoshard.watchdog.checker import Checker, CheckStats, last_check_age_s
from chronoshard.watchdog.config import WatchdogConfig
from chronoshard.watchdog.election import Contact, Election, close_quietly
from chronoshard.watchdog.errors import DatabaseUnavailable
from chronoshard.watchdog.incidents import (
    AlertRecord,
    Event,
    MemoryAlerts,
    Notify,
    Open,
    Resolve,
    outage_condition,
    plan,
)
from chronoshard.watchdog.metrics import Sources, WatchdogMetrics
from chronoshard.watchdog.notifier import DeliveryStats, Notifier, RetryPolicy
from chronoshard.watchdog.sinks import (
    LogSink,
    Notice,
    PagerDutySink,
    Sink,
    SlackSink,
    WebhookSink,
)
from chronoshard.watchdog.store import WatchdogStore

log = logging.getLogger("chronoshard.watchdog")

OUTAGE_POLL_S = 1.0
DELIVERY_GRACE_S = 5.0
"""At the end of a term, deliveries in flight get this long to finish and be recorded."""
STALE_CHECK_FACTOR = 3
"""/healthz fails on a leader whose last check is older than this many check intervals."""


def build_sinks(config: WatchdogConfig) -> list[Sink]:
    sinks_config = config.sinks
    sinks: list[Sink] = []
    for i, url in enumerate(sinks_config.webhook_urls):
        name = "webhook" if len(sinks_config.webhook_urls) == 1 else f"webhook-{i + 1}"
        sinks.append(WebhookSink(url, sinks_config.timeout_s, name=name))
    if sinks_config.pagerduty_routing_key:
        sinks.append(
            PagerDutySink(
                sinks_config.pagerduty_routing_key,
                sinks_config.pagerduty_events_url,
                sinks_config.timeout_s,
            )
        )
    if sinks_config.slack_webhook_url:
        sinks.append(SlackSink(sinks_config.slack_webhook_url, sinks_config.timeout_s))
    if sinks_config.log:
        sinks.append(LogSink())
    return sinks


class Watchdog:
    def __init__(self, config: WatchdogConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.contact = Contact(self.clock)
        self.election = Election(config, self.contact)
        self.check_stats = CheckStats()
        self.delivery_stats = DeliveryStats()
        self.canary_stats = CanaryStats()
        self.metrics = WatchdogMetrics(
            Sources(
                checks=self.check_stats,
                deliveries=self.delivery_stats,
                canaries=self.canary_stats,
                is_leader=lambda: self.leader,
                database_up=lambda: self.contact.up,
                seconds_since_database=self.contact.seconds_since,
            )
        )
        self._sinks = build_sinks(config)
        self._policy = RetryPolicy(
            max_attempts=config.sinks.max_attempts,
            initial_backoff_s=config.sinks.initial_backoff_s,
            max_backoff_s=config.sinks.max_backoff_s,
        )
        self._rng = random.Random()
        self._outage_alerts = MemoryAlerts()
        self._outage_notifier = Notifier(
            self._sinks, self._policy, self.delivery_stats, rng=self._rng
        )
        self._http = HttpServer(
            config.http_listen, {"/metrics": self._metrics_page, "/healthz": self._health_page}
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.leader = False
        self.http_address = ""
        self.stopped = asyncio.Event()

    # ---- start and supervise ---------------------------------------------------------------

    async def start(self) -> str:
        """Start serving HTTP and the loops; the HTTP address.

        Raises:
            ConfigError: the canary's TLS files cannot be read.
        """
        if self.config.canary.enabled:
            canary_tls(self.config.canary)  # now, not at the first term: refuse to start
        self.http_address = await self._http.start()
        self._supervise("outage", self._watch_database())
        self._supervise("lead", self._lead_forever())
        log.info(
            "watchdog started",
            extra={
                "node_id": self.config.node_id,
                "http": self.http_address,
                "sinks": [s.name for s in self._sinks],
                "election": self.config.election.mechanism,
            },
        )
        return self.http_address

    def _supervise(self, name: str, coro: Awaitable[None]) -> None:
        async def run() -> None:
            await coro

        self._tasks.append(asyncio.create_task(run(), name=name))

    async def wait(self) -> None:
        """Until a supervised loop fails (raises its error) or :meth:`stop` is called."""
        stop = asyncio.create_task(self.stopped.wait(), name="stop-signal")
        done, _ = await asyncio.wait([*self._tasks, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        for task in done:
            if task is not stop and not task.cancelled() and task.exception() is not None:
                log.error("supervised loop failed", extra={"loop": task.get_name()})
                raise task.exception()  # type: ignore[misc]

    async def stop(self) -> None:
        log.info("watchdog stopping", extra={"node_id": self.config.node_id})
        # Outage first (nothing new to send), then the term (the lock goes to a standby),
        # then HTTP (scrapes work until the end).
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._outage_notifier.close()
        await self._http.close()
        self.stopped.set()
        log.info("watchdog stopped", extra={"node_id": self.config.node_id})

    # ---- leading ------------------------------------------------------------------------------

    async def _lead_forever(self) -> None:
        while True:
            conn = await self.election.acquire()
            self.leader = True
            log.info("leading", extra={"node_id": self.config.node_id})
            try:
                await self._lead(
                    WatchdogStore(
                        conn,
                        timeout_s=self.config.database.statement_timeout_s + 1,
                        on_contact=self.contact.touch,
                    )
                )
            except DatabaseUnavailable as exc:
                self.contact.lost()
                log.warning("leader term ended: database session lost", extra={"error": str(exc)})
            except Exception:
                # A bug in a leader loop: end the term (a standby may take over) and
                # compete again, rather than leave the jobs unwatched.
                log.exception("leader term ended by an unexpected error")
            finally:
                self.leader = False
                # What the last check saw is the new leader's to report now.
                self.check_stats.clear_gauges()
                await close_quietly(conn)
            await asyncio.sleep(self.election.interval_s)

    async def _lead(self, store: WatchdogStore) -> None:
        """One leader term, until the session fails (DatabaseUnavailable) or cancelled."""
        synced = await store.sync_config(self.config.expectations)
        if synced.unknown_tenants:
            log.error(
                "config expectations name unknown tenants; they are not watched",
                extra={"tenants": list(synced.unknown_tenants)},
            )
        log.info(
            "config expectations written",
            extra={"written": synced.written, "removed": synced.removed},
        )
        notifier = Notifier(self._sinks, self._policy, self.delivery_stats, rng=self._rng)
        checker = Checker(
            self.config,
            store,
            notifier,
            self.clock,
            self.check_stats,
            self.canary_stats,
            self.metrics.observe_canary_latency,
        )
        loops = [
            asyncio.create_task(self._hold(store), name="session-check"),
            asyncio.create_task(self._check_loop(checker), name="check"),
        ]
        if self.config.canary.enabled:
            canary = CanaryRunner(
                self.config.canary,
                store,
                self.clock,
                self.canary_stats,
                node_id=self.config.node_id,
            )
            loops.append(asyncio.create_task(canary.run(), name="canary"))
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises what ended the term
            raise DatabaseUnavailable("a leader loop ended")  # pragma: no cover - loops never end
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            # Let deliveries already under way finish and be recorded through the session
            # while it still holds the lock; cancel what is still running after the grace.
            await notifier.drain(DELIVERY_GRACE_S)
            await notifier.close()

    async def _hold(self, store: WatchdogStore) -> None:
        """Check the leader's session every retry interval; raise when it is gone."""
        while True:
            await asyncio.sleep(self.election.interval_s)
            await store.ping()

    async def _check_loop(self, checker: Checker) -> None:
        interval = self.config.check_interval_s
        next_at = self.clock.monotonic()
        while True:
            try:
                await checker.check()
            except DatabaseUnavailable:
                raise
            except Exception:
                # A bug in one check must not silence the next: log, count, carry on.
                self.check_stats.failures += 1
                log.exception("check failed")
            next_at += interval
            now = self.clock.monotonic()
            if next_at < now:  # a check longer than the interval: skip, do not bunch up
                next_at = now + interval
            await asyncio.sleep(next_at - now)

    # ---- the watchdog's own database ----------------------------------------------------------

    async def _watch_database(self) -> None:
        tolerance_s = self.config.database.outage_tolerance_s
        while True:
            now = self.clock.now()
            condition = outage_condition(
                self.contact.seconds_since(), tolerance_s, self.config.node_id
            )
            actions = plan(
                [condition] if condition is not None else [],
                self._outage_alerts.records(),
                now=now,
                renotify_interval_s=self.config.renotify_interval_s,
                busy=self._outage_notifier.busy(),
            )
            for action in actions:
                if isinstance(action, Open):
                    alert = self._outage_alerts.open(action.condition, now)
                    log.error(
                        "watchdog database unreachable", extra={"node_id": self.config.node_id}
                    )
                    self._send_outage(alert, Event.TRIGGER)
                elif isinstance(action, Resolve):
                    self._send_outage(self._outage_alerts.resolve(action.alert, now), Event.RESOLVE)
                elif isinstance(action, Notify):
                    self._send_outage(action.alert, action.event)
            await asyncio.sleep(OUTAGE_POLL_S)

    def _send_outage(self, alert: AlertRecord, event: Event) -> None:
        async def record(_: Notice) -> None:
            self._outage_alerts.notified(alert, event, self.clock.now())

        self._outage_notifier.submit(
            Notice(event, alert, self.config.node_id, self.clock.now()), record
        )

    # ---- HTTP ------------------------------------------------------------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy: the database answered within the outage tolerance and, on the leader,
        the last check is recent. A standby is healthy: it is ready to take over."""
        since_db = self.contact.seconds_since()
        database_ok = since_db <= self.config.database.outage_tolerance_s
        check_age = last_check_age_s(self.check_stats, self.clock.monotonic())
        check_ok = True
        if self.leader and check_age is not None:
            check_ok = check_age <= STALE_CHECK_FACTOR * self.config.check_interval_s + 5
        healthy = database_ok and check_ok
        return healthy, {
            "status": "ok" if healthy else "failing",
            "node_id": self.config.node_id,
            "role": "leader" if self.leader else "standby",
            "database_up": self.contact.up,
            "seconds_since_database_contact": round(since_db, 3),
            "last_check_age_s": None if check_age is None else round(check_age, 3),
            "checks": self.check_stats.checks,
            "open_alerts": self.check_stats.open_alerts,
            "overdue_jobs": self.check_stats.overdue,
            "missed_schedules": self.check_stats.missed_schedules,
        }

    def _health_page(self) -> Response:
        healthy, body = self.health()
        return 200 if healthy else 503, "application/json", json.dumps(body).encode() + b"\n"

    def _metrics_page(self) -> Response:
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
