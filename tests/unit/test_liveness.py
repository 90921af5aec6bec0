"""Worker session records (``scheduler/cluster/liveness.py``): which workers each node has a
session of, and what each session is, kept in ``worker_sessions`` for a node warming up
shards to wait on and for ``AdminService.ListWorkerSessions`` to list."""

from __future__ import annotations

from collections.abc import Collection

from fixtures.rows import session_report

from chronoshard.scheduler.cluster.liveness import WorkerLiveness
from chronoshard.scheduler.core.worker_sessions import SessionReport


class Sessions:
    def __init__(self) -> None:
        self.live: list[SessionReport] = []

    def reports(self) -> list[SessionReport]:
        return list(self.live)


class Store:
    def __init__(self) -> None:
        self.touched: list[tuple[str, list[SessionReport], set[str]]] = []

    async def touch_worker_sessions(
        self, node_id: str, live: Collection[SessionReport], closed: Collection[str] = ()
    ) -> None:
        self.touched.append((node_id, list(live), set(closed)))


async def test_liveness_reports_live_sessions_and_closed_ones_one_last_time() -> None:
    sessions, store = Sessions(), Store()
    liveness = WorkerLiveness("node-a", 15.0, sessions, store)
    w1, w2, w3 = (session_report(w) for w in ("w1", "w2", "w3"))
    sessions.live = [w1, w2]
    await liveness.report_once()
    sessions.live = [w2, w3]  # w1 closed, w3 connected
    await liveness.report_once()
    await liveness.report_once()
    assert store.touched == [
        ("node-a", [w1, w2], set()),
        # w1's row now says when it was last seen, and that its session closed
        ("node-a", [w2, w3], {"w1"}),
        ("node-a", [w2, w3], set()),
    ]
