"""When the watchdog submits a canary again after no node took it (pure part)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronoshard.watchdog.canary import RESUBMIT, resubmit_after_s

units = st.floats(0.0, 1.0, exclude_max=True)


@given(st.integers(1, 50), st.floats(0.0, 100.0), units)
def test_an_attempt_is_only_made_while_it_can_start_before_the_deadline(
    failures: int, left_s: float, u: float
) -> None:
    pause = resubmit_after_s(failures, left_s, u)
    assert pause is None or 0 < pause < left_s


@given(st.integers(1, 50), units)
def test_pauses_grow_to_the_cap_and_are_jittered_in_their_upper_half(
    failures: int, u: float
) -> None:
    step = min(RESUBMIT.max_backoff_s, RESUBMIT.initial_backoff_s * 2 ** (failures - 1))
    pause = resubmit_after_s(failures, 1e9, u)
    assert pause is not None and step / 2 <= pause <= step


def test_a_canary_is_tried_again_until_its_tolerance_runs_out() -> None:
    # Every submit fails at once (every node down): attempts go on for the tolerance.
    tolerance_s, elapsed, attempts = 10.0, 0.0, 1
    while (pause := resubmit_after_s(attempts, tolerance_s - elapsed, 0.5)) is not None:
        elapsed += pause
        attempts += 1
    assert tolerance_s - RESUBMIT.max_backoff_s <= elapsed < tolerance_s
    assert attempts >= 6
