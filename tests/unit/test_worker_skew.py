"""When a worker warns that its wall clock looks off (``worker/_skew.py``): pure, time
passed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from chronoshard.worker._skew import (
    SKEW_LOG_INTERVAL_S,
    SKEW_WARNING_S,
    WarningThrottle,
    skew_warning,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


@pytest.mark.parametrize(("offset_s", "side"), [(SKEW_WARNING_S + 1, "ahead of"), (-9.0, "behind")])
def test_a_node_that_sends_its_clock_shows_the_offset(offset_s: float, side: str) -> None:
    warning = skew_warning(NOW - _s(offset_s), NOW, NOW)
    assert warning is not None
    message = warning.template % warning.args
    assert f"{abs(offset_s):.1f} s {side}" in message


def test_an_offset_within_the_threshold_is_no_warning() -> None:
    assert skew_warning(NOW - _s(SKEW_WARNING_S), NOW, NOW) is None
    assert skew_warning(NOW + _s(SKEW_WARNING_S), NOW, NOW) is None
    # The node's clock answers: a task due far ahead is then simply due far ahead.
    assert skew_warning(NOW, NOW + _s(3600), NOW) is None


def test_from_an_older_node_only_a_task_due_far_ahead_hints_at_a_clock_behind() -> None:
    warning = skew_warning(None, NOW + _s(SKEW_WARNING_S + 2), NOW)
    assert warning is not None
    assert "is the clock behind?" in warning.template % warning.args
    assert skew_warning(None, NOW + _s(SKEW_WARNING_S), NOW) is None
    assert skew_warning(None, NOW - _s(60), NOW) is None


def test_the_throttle_says_yes_once_per_interval() -> None:
    throttle = WarningThrottle(SKEW_LOG_INTERVAL_S)
    assert throttle.due(100.0)
    assert not throttle.due(100.0 + SKEW_LOG_INTERVAL_S - 0.001)
    assert throttle.due(100.0 + SKEW_LOG_INTERVAL_S)
    assert not throttle.due(100.0 + SKEW_LOG_INTERVAL_S + 1)
