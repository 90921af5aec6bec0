"""Prometheus metrics of a scheduler node (STYLE #10: metrics at the edge).

Every component keeps plain counters and offers them in one shape,
``get_stats() -> dict[str, int]`` (:class:`StatsSource`); :class:`NodeCollector` reads
them at scrape time, so the hot path pays for a dict increment, not a metrics library
call. A key is a total that only grows (exported as the counter
``chronoshard_<family>_<key>_total``) unless the component names it in ``STATS_GAUGES``,
a level (the gauge ``chronoshard_<family>_<key>``). Several components may share a family
(the worker edge's sessions, gateway and settlements are ``chronoshard_gateway_*``) as
long as their keys differ, or tell themselves apart by a label (each group committer has
its ``committer``). The node's few float readings (clock offset) and cross-component
readings (credits held, self-fenced) are gauges the node computes, and its labelled
levels (ready depth by queue, class and tenant; health by service) are
:class:`LabelledGauge` readings it computes at scrape time, and its labelled totals (how
often each tenant was throttled, by which quota) :class:`LabelledCounter` readings.
Histograms are the exception, as they need every observation: dispatch lateness, and the
latency of every database and etcd call (:class:`DatabaseCallMetrics` and
:class:`EtcdCallMetrics`, given to the store and the coordinator). The process and
platform collectors of ``prometheus_client`` (CPU, memory, file descriptors, GC, Python
version) are registered beside them.

Every ``chronoshard_*`` series carries the ``node`` label, so a dashboard can tell nodes
apart whether Prometheus adds an ``instance`` label or not.
"""

from __future__ import annotations

import uuid
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chronoshard.scheduler.core.models import Priority

LATENESS_BUCKETS_S = (
    -0.2, -0.1, -0.05, -0.02, -0.01, -0.005, 0.0, 0.005, 0.01, 0.02, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

CALL_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Database and etcd calls: sub-millisecond on loopback, seconds when something is wrong."""

OTHER_TENANTS = "other"
"""The ``tenant`` label of ready depth (and throttling) for every tenant beyond the
busiest (first) few."""


class StatsSource(Protocol):
    """What every component of the node offers the metrics endpoint."""

    STATS_GAUGES: ClassVar[frozenset[str]]
    """Keys of ``get_stats()`` that are levels; every other key only grows."""

    def get_stats(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class StatsFamily:
    """One component's stats under the metric prefix ``chronoshard_<name>_``."""

    name: str
    source: StatsSource
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LabelledGauge:
    """One gauge ``chronoshard_<name>`` with labels beyond ``node``, read at scrape time."""

    name: str
    help: str
    labels: tuple[str, ...]
    samples: Mapping[tuple[str, ...], float]


@dataclass(frozen=True)
class LabelledCounter:
    """One counter ``chronoshard_<name>_total`` with labels beyond ``node``, read at
    scrape time; every sample only grows."""

    name: str
    help: str
    labels: tuple[str, ...]
    samples: Mapping[tuple[str, ...], float]


class TenantLabels:
    """The ``tenant`` label of a per-tenant total: the first ``max_tenants`` tenants to
    appear keep their id for the process's life, every later one is
    :data:`OTHER_TENANTS`. Unlike a gauge's (the busiest now), a counter's label must
    never move from one series to another, or both would stop only growing."""

    def __init__(self, max_tenants: int) -> None:
        self._max_tenants = max_tenants
        self._named: set[uuid.UUID] = set()

    def label(self, tenant_id: uuid.UUID) -> str:
        if tenant_id in self._named:
            return str(tenant_id)
        if len(self._named) < self._max_tenants:
            self._named.add(tenant_id)
            return str(tenant_id)
        return OTHER_TENANTS


def tenant_totals(
    counts: Mapping[tuple[uuid.UUID, str], int], labels: TenantLabels
) -> dict[tuple[str, ...], float]:
    """Per-(tenant, reason) totals under their :class:`TenantLabels` label, tenants
    taken in id order the first time (so which ones are named does not depend on a
    dict's order), the rest summed as :data:`OTHER_TENANTS`."""
    out: dict[tuple[str, ...], float] = {}
    for (tenant, reason), count in sorted(counts.items(), key=lambda kv: str(kv[0])):
        key = (labels.label(tenant), reason)
        out[key] = out.get(key, 0.0) + count
    return out


class NodeCollector(Collector):
    """Reads the components' stats and the node's gauges when Prometheus scrapes."""

    def __init__(
        self,
        node_id: str,
        families: Sequence[StatsFamily],
        gauges: Callable[[], Mapping[str, float]],
        labelled: Callable[[], Sequence[LabelledGauge]] = lambda: (),
        labelled_counters: Callable[[], Sequence[LabelledCounter]] = lambda: (),
    ) -> None:
        self._node_id = node_id
        self._families = families
        self._gauges = gauges
        self._labelled = labelled
        self._labelled_counters = labelled_counters

    def collect(self) -> Iterator[Metric]:
        for name, value in self._gauges().items():
            gauge = GaugeMetricFamily(
                f"chronoshard_{name}", name.replace("_", " "), labels=["node"]
            )
            gauge.add_metric([self._node_id], value)
            yield gauge
        for reading in self._labelled():
            labelled = GaugeMetricFamily(
                f"chronoshard_{reading.name}", reading.help, labels=["node", *reading.labels]
            )
            for values, value in reading.samples.items():
                labelled.add_metric([self._node_id, *values], value)
            yield labelled
        for total in self._labelled_counters():
            counter = CounterMetricFamily(
                f"chronoshard_{total.name}", total.help, labels=["node", *total.labels]
            )
            for values, value in total.samples.items():
                counter.add_metric([self._node_id, *values], value)
            yield counter
        yield from self._component_metrics()

    def _component_metrics(self) -> Iterator[Metric]:
        # One metric per name: families that share a name add their samples to it.
        metrics: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for family in self._families:
            label_names = ["node", *family.labels]
            label_values = [self._node_id, *family.labels.values()]
            levels = family.source.STATS_GAUGES
            for key, value in family.source.get_stats().items():
                name = f"chronoshard_{family.name}_{key}"
                metric = metrics.get(name)
                if metric is None:
                    help_text = f"{family.name}: {key.replace('_', ' ')}"
                    kind = GaugeMetricFamily if key in levels else CounterMetricFamily
                    metric = metrics[name] = kind(name, help_text, labels=label_names)
                metric.add_metric(label_values, value)
        yield from metrics.values()


def ready_depth(
    depths: Mapping[tuple[str, Priority, uuid.UUID], int], max_tenants: int
) -> dict[tuple[str, str, str], int]:
    """Ready depth by (queue, priority, tenant label): the ``max_tenants`` tenants with
    the most tasks waiting keep their id, the rest are summed as :data:`OTHER_TENANTS`
    (ties broken by id, so the set is stable between scrapes), so a flood of tenants
    cannot flood Prometheus with series."""
    per_tenant: Tally[uuid.UUID] = Tally()
    for (_queue, _priority, tenant), count in depths.items():
        per_tenant[tenant] += count
    ranked = sorted(per_tenant, key=lambda tenant: (-per_tenant[tenant], str(tenant)))
    named = set(ranked[:max_tenants])
    out: dict[tuple[str, str, str], int] = {}
    for (queue, priority, tenant), count in depths.items():
        label = str(tenant) if tenant in named else OTHER_TENANTS
        key = (queue, str(priority), label)
        out[key] = out.get(key, 0) + count
    return out


class DatabaseCallMetrics:
    """The store's call latencies (the store's ``DatabaseTimings``)."""

    def __init__(self, node_id: str, registry: CollectorRegistry) -> None:
        self._acquire = Histogram(
            "chronoshard_database_acquire_seconds",
            "Wait for a pooled PostgreSQL connection",
            ["node"],
            buckets=CALL_BUCKETS_S,
            registry=registry,
        ).labels(node_id)
        self._calls = Histogram(
            "chronoshard_database_call_seconds",
            "Time a database call held its connection, by kind (transaction, statement, "
            "connection)",
            ["node", "kind"],
            buckets=CALL_BUCKETS_S,
            registry=registry,
        )
        self._node_id = node_id
        self._by_kind: dict[str, Histogram] = {}

    def acquired(self, wait_s: float) -> None:
        self._acquire.observe(wait_s)

    def released(self, kind: str, held_s: float) -> None:
        child = self._by_kind.get(kind)
        if child is None:
            child = self._by_kind[kind] = self._calls.labels(self._node_id, kind)
        child.observe(held_s)


class EtcdCallMetrics:
    """The coordinator's etcd call latencies and failures (its ``EtcdTimings``)."""

    def __init__(self, node_id: str, registry: CollectorRegistry) -> None:
        self._node_id = node_id
        self._seconds = Histogram(
            "chronoshard_etcd_call_seconds",
            "Latency of an etcd call, by call",
            ["node", "call"],
            buckets=CALL_BUCKETS_S,
            registry=registry,
        )
        self._failures = Counter(
            "chronoshard_etcd_call_failures",
            "etcd calls that failed or timed out, by call",
            ["node", "call"],
            registry=registry,
        )

    def called(self, name: str, seconds: float, *, failed: bool) -> None:
        self._seconds.labels(self._node_id, name).observe(seconds)
        if failed:
            self._failures.labels(self._node_id, name).inc()


class SchedulerMetrics:
    def __init__(self, node_id: str, version: str) -> None:
        self.node_id = node_id
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.lateness = Histogram(
            "chronoshard_dispatch_lateness_seconds",
            "Dispatch time minus due time (negative: sent ahead under lead dispatch)",
            ["node"],
            buckets=LATENESS_BUCKETS_S,
            registry=self.registry,
        ).labels(node_id)
        Gauge(
            "chronoshard_build_info",
            "Always 1; the version this node runs",
            ["node", "version"],
            registry=self.registry,
        ).labels(node_id, version).set(1)
        self.database = DatabaseCallMetrics(node_id, self.registry)
        self.etcd = EtcdCallMetrics(node_id, self.registry)

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def observe_dispatch(self, lateness_s: float) -> None:
        self.lateness.observe(lateness_s)
