"""Prometheus metrics of the watchdog (STYLE #10: metrics at the edge).

The loops keep plain counters (:class:`~.checker.CheckStats`,
:class:`~.notifier.DeliveryStats`, :class:`~.canary.CanaryStats`) and the collector reads
them at scrape time; only the canary latency histogram needs every observation. The
process and platform collectors of ``prometheus_client`` (CPU, memory, file descriptors,
GC, Python version) are registered beside them, as on a scheduler node: the dashboard
(deploy/grafana) shows the watchdog's CPU and memory the same way.

The full list, with what each metric means, is in ``docs/watchdog.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Histogram,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chronoshard.watchdog.canary import CanaryStats
from chronoshard.watchdog.checker import CheckStats
from chronoshard.watchdog.notifier import DeliveryStats

PREFIX = "chronoshard_watchdog"
CANARY_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


@dataclass(frozen=True)
class Sources:
    """Where the collector reads from at scrape time."""

    checks: CheckStats
    deliveries: DeliveryStats
    canaries: CanaryStats
    is_leader: Callable[[], bool]
    database_up: Callable[[], bool]
    seconds_since_database: Callable[[], float]


class WatchdogCollector(Collector):
    def __init__(self, sources: Sources) -> None:
        self._s = sources

    def collect(self) -> Iterator[Metric]:
        s = self._s
        checks = s.checks
        yield _gauge("leader", "1 on the active replica", 1 if s.is_leader() else 0)
        yield _gauge("database_up", "1 while the database answers", 1 if s.database_up() else 0)
        yield _gauge(
            "seconds_since_database_contact",
            "seconds since the last successful statement",
            s.seconds_since_database(),
        )
        yield _gauge("expectations", "enabled expectations checked", checks.expectations)
        yield _gauge("overdue_jobs", "expectations overdue at the last check", checks.overdue)
        yield _gauge("schedules", "watched schedules (watch, not paused) checked", checks.schedules)
        yield _gauge(
            "missed_schedules",
            "watched schedules missing an occurrence at the last check",
            checks.missed_schedules,
        )
        since = GaugeMetricFamily(
            f"{PREFIX}_seconds_since_last_completion",
            "seconds since the job last completed (since registration if never)",
            labels=["tenant_id", "job_id"],
        )
        for (tenant_id, job_id), seconds in sorted(checks.seconds_since.items()):
            since.add_metric([tenant_id, job_id], seconds)
        yield since
        yield _gauge("open_alerts", "open job, schedule and canary alerts", checks.open_alerts)
        yield _counter("checks", "checks run", checks.checks)
        yield _counter("check_failures", "checks that failed", checks.failures)
        if checks.last_check_unix is not None:
            yield _gauge(
                "last_check_timestamp_seconds",
                "unix time of the last check",
                checks.last_check_unix,
            )
        yield _labelled_counter("alerts_opened", "alerts opened", ["kind"], checks.opened)
        yield _labelled_counter("alerts_resolved", "alerts resolved", ["kind"], checks.resolved)
        yield _labelled_counter(
            "alerts_sent", "notifications delivered", ["sink", "event"], s.deliveries.sent
        )
        yield _labelled_counter(
            "alerts_failed",
            "notifications that failed after every retry",
            ["sink", "event"],
            s.deliveries.failed,
        )
        yield _labelled_counter(
            "delivery_retries", "delivery attempts retried", ["sink"], s.deliveries.retries
        )
        c = s.canaries
        yield _counter("canaries_submitted", "canaries submitted", c.submitted)
        yield _counter("canary_submit_failures", "canary submits that failed", c.submit_failures)
        yield _counter("canaries_completed", "canaries completed on time", c.completed_on_time)
        yield _counter("canaries_late", "canaries that were late", c.late)
        yield _counter("canary_worker_restarts", "canary worker restarts", c.worker_restarts)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _labelled_counter(
    name: str, doc: str, labels: list[str], values: Mapping[Any, int]
) -> CounterMetricFamily:
    """``values`` keyed by the label value, or by a tuple of them for several labels."""
    family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
    for key, value in sorted(values.items()):
        label_values = [str(k) for k in key] if isinstance(key, tuple) else [str(key)]
        family.add_metric(label_values, value)
    return family


class WatchdogMetrics:
    def __init__(self, sources: Sources) -> None:
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.registry.register(WatchdogCollector(sources))
        self.canary_latency = Histogram(
            f"{PREFIX}_canary_latency_seconds",
            "canary end-to-end latency: completion time minus scheduled time",
            buckets=CANARY_LATENCY_BUCKETS_S,
            registry=self.registry,
        )

    def observe_canary_latency(self, seconds: float) -> None:
        self.canary_latency.observe(max(0.0, seconds))
