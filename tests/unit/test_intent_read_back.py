"""Reading back a dispatch intent whose commit outcome is unknown: which rows are ours."""

from __future__ import annotations

from typing import Any

import pytest

from chronoshard.scheduler.core.runs import intent_committed


def _row(status: str, worker_id: str | None = "w1", attempt_epoch: int | None = 7) -> Any:
    return {"status": status, "worker_id": worker_id, "attempt_epoch": attempt_epoch}


def test_dispatched_to_the_chosen_worker_under_this_epoch_committed() -> None:
    assert intent_committed(_row("DISPATCHED"), "w1", 7) is True


def test_still_preloaded_did_not_commit_and_is_chosen_again() -> None:
    assert intent_committed(_row("PRELOADED", None, None), "w1", 7) is False


@pytest.mark.parametrize(
    "row",
    [
        _row("DISPATCHED", worker_id="w2"),  # another worker: not this intent
        _row("DISPATCHED", attempt_epoch=6),  # an attempt of an earlier owner
        _row("CANCELLED"),
        _row("RUNNING"),
        _row("SCHEDULED", None, None),  # handed off meanwhile
    ],
)
def test_anything_else_moved_on_and_is_dropped(row: Any) -> None:
    assert intent_committed(row, "w1", 7) is None
