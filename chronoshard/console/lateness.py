"""Dispatch lateness and rates over time, from the nodes' cumulative histograms: pure.

A node's /metrics has ``chronoshard_dispatch_lateness_seconds`` as a cumulative
histogram since it started. The console scrapes every node every few seconds and keeps
the last samples here (a bounded ring per node, in memory: the console keeps no store);
the difference between two samples is what happened in between: how many tasks were
dispatched (a rate), and the median and 99th percentile of the bucket differences
(estimated as Prometheus does). No mean: the histogram has negative buckets (a task sent
ahead is early), for which prometheus_client exposes no ``_sum``. A counter that went
down means the node restarted: that interval is skipped, not drawn as a negative rate.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from chronoshard._cli.admin import NodeMetrics, histogram_quantile

DEFAULT_KEEP = 150
"""Samples kept per node: 5 minutes at one every 2 s."""


@dataclass(frozen=True)
class Sample:
    at: float
    """Wall-clock seconds (UNIX time) of the scrape."""
    dispatched: float
    buckets: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Point:
    """One interval between two scrapes."""

    at: float
    rate_per_s: float
    p50_s: float | None
    p99_s: float | None


def sample(at: float, metrics: NodeMetrics) -> Sample:
    return Sample(at, metrics.dispatched, metrics.lateness_buckets)


def points(samples: Sequence[Sample]) -> list[Point]:
    """The intervals between consecutive samples (restarts skipped)."""
    found: list[Point] = []
    for before, after in itertools.pairwise(samples):
        elapsed = after.at - before.at
        count = after.dispatched - before.dispatched
        if elapsed <= 0 or count < 0:
            continue
        earlier = dict(before.buckets)
        deltas = [(bound, n - earlier.get(bound, 0.0)) for bound, n in after.buckets]
        p50 = histogram_quantile(0.5, deltas) if count else None
        p99 = histogram_quantile(0.99, deltas) if count else None
        found.append(Point(after.at, count / elapsed, p50, p99))
    return found


class History:
    """The last ``keep`` samples of each node."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        if keep < 2:
            raise ValueError(f"keep must be at least 2, got {keep}")
        self.keep = keep
        self._samples: dict[str, deque[Sample]] = {}

    def add(self, node_id: str, value: Sample) -> None:
        ring = self._samples.setdefault(node_id, deque(maxlen=self.keep))
        ring.append(value)

    def forget_except(self, node_ids: set[str]) -> None:
        """Drop the nodes no longer in the topology."""
        for node_id in list(self._samples):
            if node_id not in node_ids:
                del self._samples[node_id]

    def nodes(self) -> list[str]:
        return sorted(self._samples)

    def points(self, node_id: str) -> list[Point]:
        return points(list(self._samples.get(node_id, ())))
