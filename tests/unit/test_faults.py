"""Crash points are armed only in test builds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from chronoshard.scheduler.dispatch.faults import CRASH_EXIT_CODE, CrashPoint, armed_point


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
        "from chronoshard.scheduler.dispatch import faults\n"
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
