"""The worker's /metrics families, from the shape ``Worker.stats()`` returns."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chronoshard.worker import Worker
from chronoshard.worker._metrics import WorkerCollector


def test_a_fresh_workers_stats_become_labelled_families() -> None:
    worker = Worker(["127.0.0.1:1"], slots=7, prefetch=2, worker_id="w-1")

    @worker.task("noop")
    async def noop(ctx: object) -> None:
        return None

    stats = worker.stats()
    stats["outcomes"]["succeeded"] = 3  # what a run's end adds to the live counter
    registry = CollectorRegistry()
    registry.register(WorkerCollector(lambda: stats))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    worker_label = (("worker", "w-1"),)
    assert samples[("chronoshard_sdk_slots", worker_label)] == 9  # slots + prefetch
    assert samples[("chronoshard_sdk_slots_occupied", worker_label)] == 0
    assert samples[("chronoshard_sdk_sessions", worker_label)] == 0
    assert (
        samples[("chronoshard_sdk_attempts_total", (("outcome", "succeeded"), ("worker", "w-1")))]
        == 3
    )
