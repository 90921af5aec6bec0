"""The watchdog service in-process on a real PostgreSQL, with a real HTTP receiver.

Completions are written into the ledger with SQL, as the scheduler would: these tests
are about the watchdog's loop, its sinks, its HTTP endpoints, its own database outage
and two replicas sharing the work. (tests/e2e/test_watchdog.py does the same with real
scheduler, worker and watchdog processes.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, LiteralString

import psycopg
import pytest
from e2e.watchdog_receiver import Receiver, running_receiver
from fixtures.waiting import eventually

from chronoshard._dev.processes import free_ports
from chronoshard.scheduler.core.api_keys import hash_api_key, new_api_key
from chronoshard.watchdog.config import (
    DatabaseConfig,
    ElectionConfig,
    SinksConfig,
    WatchdogConfig,
)
from chronoshard.watchdog.service import Watchdog

INTERVAL_S = 1.0
TOLERANCE_S = 0.5
CHECK_S = 0.25
# An overdue job is reported within interval + tolerance + one check interval, plus this
# for the query, the delivery and a loaded test machine.
ALERT_SLACK_S = 1.0
ALERT_BOUND_S = INTERVAL_S + TOLERANCE_S + CHECK_S + ALERT_SLACK_S


async def sql(dsn: str, query: LiteralString, params: Any = None) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def watched_job(dsn: str, job_id: str = "heartbeat") -> uuid.UUID:
    [(tenant_id,)] = await sql(
        dsn,
        "INSERT INTO tenants (name, tier, rate_limit_rps, max_concurrent_workers, home_region,"
        " api_key_hash) VALUES (%s, 'standard', 100, 10, 'local', %s) RETURNING id",
        (f"t-{uuid.uuid4().hex[:8]}", hash_api_key(new_api_key())),
    )
    await sql(
        dsn,
        "INSERT INTO expectations (tenant_id, job_id, interval_s, tolerance_s)"
        " VALUES (%s, %s, %s, %s)",
        (tenant_id, job_id, INTERVAL_S, TOLERANCE_S),
    )
    return uuid.UUID(str(tenant_id))


async def complete(dsn: str, tenant_id: uuid.UUID, job_id: str = "heartbeat") -> float:
    """A completion now; the monotonic time it was written."""
    await sql(
        dsn,
        "INSERT INTO task_completions (job_id, task_id, tenant_id, completed_at)"
        " VALUES (%s, %s, %s, now())",
        (job_id, uuid.uuid4(), tenant_id),
    )
    return time.monotonic()


def config(dsn: str, urls: list[str], *, node_id: str = "wd-1", **extra: Any) -> WatchdogConfig:
    return WatchdogConfig(
        node_id=node_id,
        log_format="text",
        check_interval_s=CHECK_S,
        renotify_interval_s=0,
        http_listen="127.0.0.1:0",
        database=DatabaseConfig(
            dsn=dsn,
            connect_timeout_s=2,
            statement_timeout_s=5,
            outage_tolerance_s=extra.pop("outage_tolerance_s", 30.0),
        ),
        election=ElectionConfig(lock_name=extra.pop("lock_name", "test"), retry_interval_s=0.1),
        sinks=SinksConfig(
            webhook_urls=tuple(urls), max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.2
        ),
        **extra,
    )


def http_get(address: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        if series == name and not labels:
            return float(value)
        if all(f'{k}="{v}"' in series for k, v in labels.items()) and series.startswith(name + "{"):
            return float(value)
    return None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture
async def started(caplog: pytest.LogCaptureFixture) -> AsyncIterator[list[Watchdog]]:
    """Watchdogs a test starts; stopped at the end whatever happened."""
    caplog.set_level(logging.INFO)  # every log line of the service runs
    watchdogs: list[Watchdog] = []
    yield watchdogs
    for watchdog in watchdogs:
        await watchdog.stop()


async def start(watchdogs: list[Watchdog], cfg: WatchdogConfig) -> Watchdog:
    watchdog = Watchdog(cfg)
    await watchdog.start()
    watchdogs.append(watchdog)
    return watchdog


async def test_a_silent_job_alerts_once_within_the_bound_and_resolves_once(
    fresh_db_dsn: str, receiver: Receiver, started: list[Watchdog]
) -> None:
    tenant_id = await watched_job(fresh_db_dsn)
    (dead_port,) = free_ports(1)
    unreachable = f"http://127.0.0.1:{dead_port}/nobody-listens"
    watchdog = await start(started, config(fresh_db_dsn, [receiver.url(), unreachable]))
    last = await complete(fresh_db_dsn, tenant_id)

    await receiver.wait_for(
        "trigger", lambda: bool(receiver.received(event="trigger")), timeout_s=ALERT_BOUND_S + 5
    )
    [trigger] = receiver.received(event="trigger")
    latency_s = trigger.at - last
    print(f"alert latency after the last completion: {latency_s:.3f} s")
    assert INTERVAL_S + TOLERANCE_S <= latency_s <= ALERT_BOUND_S, f"{latency_s:.2f} s"
    alert = trigger.body["alert"]
    assert alert["kind"] == "job_overdue" and alert["job_id"] == "heartbeat"
    assert alert["tenant_id"] == str(tenant_id)

    # Still silent for several more checks: no second trigger (renotify is off).
    checks = watchdog.check_stats.checks
    await eventually(lambda: watchdog.check_stats.checks >= checks + 4, timeout_s=5, what="checks")
    assert len(receiver.received(event="trigger")) == 1

    done = await complete(fresh_db_dsn, tenant_id)
    await receiver.wait_for(
        "resolve", lambda: bool(receiver.received(event="resolve")), timeout_s=CHECK_S + 5
    )
    [resolve] = receiver.received(event="resolve")
    assert resolve.at - done <= CHECK_S + ALERT_SLACK_S
    assert resolve.body["alert"]["id"] == alert["id"]
    assert resolve.body["alert"]["details"]["resolution"] == "a completion arrived"

    # The unreachable webhook was retried, counted, and never stopped the loop.
    await eventually(
        lambda: watchdog.delivery_stats.failed[("webhook-2", "resolve")] == 1,
        timeout_s=5,
        what="the failed resolve counted",
    )
    status, text = await asyncio.to_thread(http_get, watchdog.http_address, "/metrics")
    assert status == 200
    assert metric(text, "chronoshard_watchdog_alerts_failed_total", sink="webhook-2") == 1.0
    assert metric(text, "chronoshard_watchdog_alerts_sent_total", sink="webhook-1") == 1.0
    assert (metric(text, "chronoshard_watchdog_delivery_retries_total", sink="webhook-2") or 0) >= 2
    assert metric(text, "chronoshard_watchdog_leader") == 1.0
    assert metric(text, "chronoshard_watchdog_expectations") == 1.0
    since = metric(text, "chronoshard_watchdog_seconds_since_last_completion", job_id="heartbeat")
    assert since is not None and since < INTERVAL_S + TOLERANCE_S
    assert watchdog.check_stats.failures == 0
    status, body = await asyncio.to_thread(http_get, watchdog.http_address, "/healthz")
    assert status == 200 and json.loads(body)["role"] == "leader"

    [(notified, resolve_notified, notifications)] = await sql(
        fresh_db_dsn,
        "SELECT last_notified_at IS NOT NULL, resolve_notified_at IS NOT NULL, notifications"
        " FROM alerts",
    )
    assert notified and resolve_notified and notifications == 2


async def test_removing_the_expectation_resolves_its_open_alert(
    fresh_db_dsn: str, receiver: Receiver, started: list[Watchdog]
) -> None:
    tenant_id = await watched_job(fresh_db_dsn)  # never completed: overdue from registration
    await start(started, config(fresh_db_dsn, [receiver.url()]))
    await receiver.wait_for(
        "trigger", lambda: bool(receiver.received(event="trigger")), timeout_s=ALERT_BOUND_S + 5
    )
    assert (
        receiver.received(event="trigger")[0].body["alert"]["details"]["last_completed_at"] is None
    )
    await sql(fresh_db_dsn, "DELETE FROM expectations WHERE tenant_id = %s", (tenant_id,))
    await receiver.wait_for(
        "resolve", lambda: bool(receiver.received(event="resolve")), timeout_s=CHECK_S + 5
    )
    [resolve] = receiver.received(event="resolve")
    assert (
        resolve.body["alert"]["details"]["resolution"] == "the expectation was removed or disabled"
    )


async def test_losing_the_database_is_itself_an_incident(
    receiver: Receiver, started: list[Watchdog]
) -> None:
    (port,) = free_ports(1)
    cfg = config(
        f"postgresql://postgres@127.0.0.1:{port}/gone", [receiver.url()], outage_tolerance_s=1.0
    )
    begun = time.monotonic()
    watchdog = await start(started, cfg)

    await receiver.wait_for(
        "outage trigger",
        lambda: bool(receiver.received(kind="watchdog_database_unreachable")),
        timeout_s=10,
    )
    [outage] = receiver.received(kind="watchdog_database_unreachable")
    assert outage.event == "trigger"
    assert 1.0 <= outage.at - begun <= 1.0 + 2.0
    assert outage.body["alert"]["id"] is None  # not recorded: the database is what is gone
    status, body = await asyncio.to_thread(http_get, watchdog.http_address, "/healthz")
    assert status == 503
    health = json.loads(body)
    assert health["status"] == "failing" and not health["database_up"]
    assert not watchdog.leader


async def test_two_replicas_one_leads_and_the_other_takes_over_without_duplicates(
    fresh_db_dsn: str, receiver: Receiver, started: list[Watchdog]
) -> None:
    tenant_id = await watched_job(fresh_db_dsn)
    first = await start(started, config(fresh_db_dsn, [receiver.url()], node_id="wd-a"))
    second = await start(started, config(fresh_db_dsn, [receiver.url()], node_id="wd-b"))
    await eventually(lambda: first.leader or second.leader, timeout_s=5, what="a leader")
    await asyncio.sleep(0.3)
    assert first.leader != second.leader, "both replicas lead"
    leader, standby = (first, second) if first.leader else (second, first)

    await complete(fresh_db_dsn, tenant_id)
    await receiver.wait_for(
        "trigger", lambda: bool(receiver.received(event="trigger")), timeout_s=ALERT_BOUND_S + 5
    )
    [trigger] = receiver.received(event="trigger")
    assert trigger.node_id == leader.config.node_id

    await leader.stop()  # a graceful stop releases the lock at once
    started.remove(leader)
    await eventually(lambda: standby.leader, timeout_s=2, what="the standby leads")
    checks = standby.check_stats.checks
    await eventually(lambda: standby.check_stats.checks >= checks + 3, timeout_s=5, what="checks")
    assert len(receiver.received(event="trigger")) == 1, "the successor re-sent the trigger"

    await complete(fresh_db_dsn, tenant_id)
    await receiver.wait_for(
        "resolve", lambda: bool(receiver.received(event="resolve")), timeout_s=5
    )
    [resolve] = receiver.received(event="resolve")
    assert resolve.node_id == standby.config.node_id
    assert resolve.body["alert"]["id"] == trigger.body["alert"]["id"]
