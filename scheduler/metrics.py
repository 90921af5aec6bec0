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
readings (credits held, self-fenced) are gauges the node computes; the one other
exception is the dispatch lateness histogram, which needs every observation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENESS_BUCKETS_S = (
    -0.2, -0.1, -0.05, -0.02, -0.01, -0.005, 0.0, 0.005, 0.01, 0.02, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


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


class NodeCollector(Collector):
    """Reads the components' stats and the node's gauges when Prometheus scrapes."""

    def __init__(
        self,
        node_id: str,
        families: Sequence[StatsFamily],
        gauges: Callable[[], Mapping[str, float]],
    ) -> None:
        self._node_id = node_id
        self._families = families
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        for name, value in self._gauges().items():
            gauge = GaugeMetricFamily(
                f"chronoshard_{name}", name.replace("_", " "), labels=["node"]
            )
            gauge.add_metric([self._node_id], value)
            yield gauge
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


class SchedulerMetrics:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.registry = CollectorRegistry()
        self.lateness = Histogram(
            "chronoshard_dispatch_lateness_seconds",
            "Dispatch time minus due time (negative: sent ahead under lead dispatch)",
            buckets=LATENESS_BUCKETS_S,
            registry=self.registry,
        )

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def observe_dispatch(self, lateness_s: float) -> None:
        self.lateness.observe(lateness_s)
