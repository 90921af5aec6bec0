"""Prometheus metrics of a scheduler node (STYLE #10: metrics at the edge).

Core objects keep plain counters (``stats`` dicts); :class:`NodeCollector` reads them at
scrape time, so the hot path pays for a dict increment, not a metrics library call. The
one exception is the dispatch lateness histogram, which needs every observation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENESS_BUCKETS_S = (
    -0.2, -0.1, -0.05, -0.02, -0.01, -0.005, 0.0, 0.005, 0.01, 0.02, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class NodeCollector(Collector):
    """Reads the node's counters and gauges when Prometheus scrapes."""

    def __init__(
        self,
        node_id: str,
        counters: Callable[[], Mapping[str, Mapping[str, int]]],
        gauges: Callable[[], Mapping[str, float]],
    ) -> None:
        self._node_id = node_id
        self._counters = counters
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        for name, value in self._gauges().items():
            gauge = GaugeMetricFamily(
                f"chronoshard_{name}", name.replace("_", " "), labels=["node"]
            )
            gauge.add_metric([self._node_id], value)
            yield gauge
        for component, stats in self._counters().items():
            for name, value in stats.items():
                counter = CounterMetricFamily(
                    f"chronoshard_{component}_{name}",
                    f"{component}: {name.replace('_', ' ')}",
                    labels=["node"],
                )
                counter.add_metric([self._node_id], value)
                yield counter


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
