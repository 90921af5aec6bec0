"""The node's metrics shapes that are pure: ready depth with bounded tenant series, and the
labelled gauges and call histograms as Prometheus renders them."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chronoshard.scheduler.core.models import Priority
from chronoshard.scheduler.metrics import (
    OTHER_TENANTS,
    LabelledGauge,
    NodeCollector,
    SchedulerMetrics,
    ready_depth,
)

TENANTS = [uuid.UUID(int=i + 1) for i in range(12)]

depths = st.dictionaries(
    st.tuples(
        st.sampled_from(["q1", "q2"]), st.sampled_from(list(Priority)), st.sampled_from(TENANTS)
    ),
    st.integers(min_value=1, max_value=1000),
)


@given(depths, st.integers(min_value=0, max_value=15))
def test_ready_depth_keeps_every_task_and_names_at_most_the_busiest(
    given_depths: dict[tuple[str, Priority, uuid.UUID], int], max_tenants: int
) -> None:
    bounded = ready_depth(given_depths, max_tenants)
    assert sum(bounded.values()) == sum(given_depths.values())
    named = {tenant for (_q, _p, tenant) in bounded if tenant != OTHER_TENANTS}
    assert len(named) <= max_tenants
    totals: dict[uuid.UUID, int] = {}
    for (_q, _p, tenant), count in given_depths.items():
        totals[tenant] = totals.get(tenant, 0) + count
    # No tenant left out has more waiting than one named.
    folded = set(totals) - {uuid.UUID(t) for t in named}
    if named and folded:
        assert min(totals[uuid.UUID(t)] for t in named) >= max(totals[t] for t in folded)
    # Per (queue, class) the sums are kept too.
    for queue in ("q1", "q2"):
        for priority in Priority:
            assert sum(
                c for (q, p, _t), c in bounded.items() if (q, p) == (queue, priority)
            ) == sum(c for (q, p, _t), c in given_depths.items() if (q, p) == (queue, priority))


def test_the_scrape_carries_node_labels_histograms_and_process_metrics() -> None:
    metrics = SchedulerMetrics("node-a", "1.2.3")
    metrics.observe_dispatch(0.004)
    metrics.database.acquired(0.0002)
    metrics.database.released("transaction", 0.003)
    metrics.etcd.called("claim_shard", 0.002, failed=False)
    metrics.etcd.called("keepalive", 3.0, failed=True)
    metrics.register(
        NodeCollector(
            "node-a",
            [],
            lambda: {"database_up": 1.0},
            lambda: [
                LabelledGauge(
                    "ready_depth",
                    "ready",
                    ("queue", "priority", "tenant"),
                    {("q", "bulk", OTHER_TENANTS): 7.0},
                )
            ],
        )
    )
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
    }

    def sample(family: str, name: str, **labels: str) -> float:
        for s in families[family].samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
        raise AssertionError(f"{name} {labels} not in the scrape")

    assert (
        sample(
            "chronoshard_dispatch_lateness_seconds",
            "chronoshard_dispatch_lateness_seconds_count",
            node="node-a",
        )
        == 1
    )
    assert (
        sample(
            "chronoshard_database_call_seconds",
            "chronoshard_database_call_seconds_count",
            node="node-a",
            kind="transaction",
        )
        == 1
    )
    assert (
        sample(
            "chronoshard_etcd_call_failures",
            "chronoshard_etcd_call_failures_total",
            call="keepalive",
        )
        == 1
    )
    assert sample("chronoshard_build_info", "chronoshard_build_info", version="1.2.3") == 1
    assert sample("chronoshard_database_up", "chronoshard_database_up", node="node-a") == 1
    assert (
        sample(
            "chronoshard_ready_depth",
            "chronoshard_ready_depth",
            queue="q",
            priority="bulk",
            tenant="other",
        )
        == 7
    )
    assert "process_cpu_seconds" in families and "python_info" in families
