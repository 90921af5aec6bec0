"""The even spread of spare credits over nodes, computed by levels, hands out exactly
what the one-at-a-time rule would (each credit to the node holding fewest, ties by name)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.worker._credits import _fill_evenly


def one_at_a_time(want: dict[str, int], avail: int) -> dict[str, int]:
    want = dict(want)
    for _ in range(avail):
        name = min(want, key=lambda n: (want[n], n))
        want[name] += 1
    return want


@settings(max_examples=100)
@given(
    st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 50), min_size=1, max_size=8),
    st.integers(0, 500),
)
def test_levels_match_the_one_at_a_time_rule(want: dict[str, int], avail: int) -> None:
    filled = dict(want)
    _fill_evenly(filled, avail)
    assert filled == one_at_a_time(want, avail)
    assert sum(filled.values()) == sum(want.values()) + avail


def test_a_lone_node_takes_everything_at_once() -> None:
    want = {"a": 3}
    _fill_evenly(want, 10_000)
    assert want == {"a": 10_003}
