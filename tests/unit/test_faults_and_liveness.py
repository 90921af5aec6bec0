"""Crash points are armed only in test builds; worker liveness reports what the node saw."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Collection

import pytest

from chronoshard.scheduler.faults import CRASH_EXIT_CODE, CrashPoint, armed_point
from chronoshard.scheduler.liveness import WorkerLiveness


def test_a_crash_point_needs_the_testing_flag() -> None:
    assert armed_point({"CHRONOSHARD_CRASH_AT": "after_intent"}) is None
    assert armed_point({"CHRONOSHARD_CRASH_AT": "after_intent", "CHRONOSHARD_TESTING": "0"}) is None
    armed = armed_point({"CHRONOSHARD_CRASH_AT": "after_send", "CHRONOSHARD_TESTING": "1"})
    assert armed is CrashPoint.AFTER_SEND
    assert armed_point({"CHRONOSHARD_TESTING": "1"}) is None


def test_an_unknown_crash_point_in_a_test_build_is_an_error() -> None:
    with pytest.raises(ValueError, match="after_intnet"):
        armed_point({"CHRONOSHARD_CRASH_AT": "after_intnet", "CHRONOSHARD_TESTING": "1"})


def _reach(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = (
        "from chronoshard.scheduler import faults\n"
        "faults.reached(faults.CrashPoint.AFTER_SEND)\n"
        "faults.reached(faults.CrashPoint.INSIDE_BATCH)\n"
        "print('survived')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_armed_point_kills_the_process_like_sigkill() -> None:
    crashed = _reach({"CHRONOSHARD_CRASH_AT": "inside_batch", "CHRONOSHARD_TESTING": "1"})
    assert crashed.returncode == CRASH_EXIT_CODE and "survived" not in crashed.stdout
    production = _reach({"CHRONOSHARD_CRASH_AT": "inside_batch"})
    assert production.returncode == 0 and "survived" in production.stdout


class Sessions:
    def __init__(self) -> None:
        self.live: set[str] = set()

    def worker_ids(self) -> set[str]:
        return set(self.live)


class Store:
    def __init__(self) -> None:
        self.touched: list[tuple[str, set[str], set[str]]] = []

    async def touch_worker_sessions(
        self, node_id: str, worker_ids: Collection[str], closed: Collection[str] = ()
    ) -> None:
        self.touched.append((node_id, set(worker_ids), set(closed)))


async def test_liveness_reports_live_sessions_and_closed_ones_one_last_time() -> None:
    sessions, store = Sessions(), Store()
    liveness = WorkerLiveness("node-a", 15.0, sessions, store)
    sessions.live = {"w1", "w2"}
    await liveness.report_once()
    sessions.live = {"w2", "w3"}  # w1 closed, w3 connected
    await liveness.report_once()
    await liveness.report_once()
    assert store.touched == [
        ("node-a", {"w1", "w2"}, set()),
        # w1's row now says when it was last seen, and that its session closed
        ("node-a", {"w2", "w3"}, {"w1"}),
        ("node-a", {"w2", "w3"}, set()),
    ]
