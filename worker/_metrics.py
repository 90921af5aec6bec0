"""The worker's own Prometheus endpoint (``Worker(metrics_listen=...)``, ``chronoshard
worker --metrics-listen``): what one worker process is doing, beside what the nodes see.

The nodes export their side of every session (credits, ready depth, lateness); a worker
is the only one that knows how busy its slots are, how its attempts ended and what waits
in its settlement outbox, so it exports those, read from :meth:`Worker.stats` at scrape
time (no per-task metrics call on the hot path), under ``chronoshard_sdk_*`` with its
``worker`` id as a label, plus the process collectors (CPU, memory, GC).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chronoshard.http_endpoint import HttpServer

SLOT_GAUGES = {
    "slots": "handler slots (plus prefetch) this worker offers",
    "occupied": "slots held by tasks (waiting for due_at, running, or stopping)",
    "outstanding": "credits granted to nodes and not yet used",
}


class WorkerCollector(Collector):
    """``Worker.stats()`` as Prometheus families, read at scrape time."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        worker = str(stats["worker_id"])
        credits: Mapping[str, int] = stats["credits"]
        for key, help_text in SLOT_GAUGES.items():
            name = "chronoshard_sdk_slots" if key == "slots" else f"chronoshard_sdk_slots_{key}"
            gauge = GaugeMetricFamily(name, help_text, labels=["worker"])
            gauge.add_metric([worker], credits[key])
            yield gauge
        sessions = GaugeMetricFamily(
            "chronoshard_sdk_sessions", "live streams to scheduler nodes", labels=["worker"]
        )
        sessions.add_metric([worker], sum(1 for live in stats["sessions"].values() if live))
        yield sessions
        attempts = CounterMetricFamily(
            "chronoshard_sdk_attempts",
            "attempts this worker ended, by outcome",
            labels=["worker", "outcome"],
        )
        for outcome, count in sorted(stats["outcomes"].items()):
            attempts.add_metric([worker, outcome], count)
        yield attempts
        outbox = GaugeMetricFamily(
            "chronoshard_sdk_outbox",
            "settlements not yet confirmed by a node, by route",
            labels=["worker", "route"],
        )
        for route, count in sorted(stats["outbox"].items()):
            outbox.add_metric([worker, route], count)
        yield outbox


def metrics_server(listen: str, stats: Callable[[], Mapping[str, Any]]) -> HttpServer:
    """An endpoint serving ``/metrics`` for one worker (not yet started)."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    registry.register(WorkerCollector(stats))
    return HttpServer(
        listen, {"/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry))}
    )
