"""Water-filling of credits, computed by levels, hands out exactly what the one-at-a-time
rule would (each credit to the node holding fewest that may take more, ties by name)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.worker._credits import allocate, water_fill

_names = st.text(alphabet="abcdef", min_size=1, max_size=2)


def one_at_a_time(
    base: dict[str, int], caps: dict[str, int] | None, avail: int
) -> tuple[dict[str, int], int]:
    held = dict(base)
    for left in range(avail, 0, -1):
        open_ = [n for n in held if caps is None or held[n] - base[n] < caps.get(n, 0)]
        if not open_:
            return held, left
        name = min(open_, key=lambda n: (held[n], n))
        held[name] += 1
    return held, 0


@settings(max_examples=200)
@given(
    st.dictionaries(_names, st.integers(0, 50), min_size=1, max_size=8),
    st.one_of(st.none(), st.dictionaries(_names, st.integers(0, 40), max_size=8)),
    st.integers(0, 500),
)
def test_levels_match_the_one_at_a_time_rule(
    base: dict[str, int], caps: dict[str, int] | None, avail: int
) -> None:
    filled, left = water_fill(base, caps, avail)
    assert (filled, left) == one_at_a_time(base, caps, avail)
    assert sum(filled.values()) + left == sum(base.values()) + avail


def test_a_lone_node_takes_everything_at_once() -> None:
    assert water_fill({"a": 3}, None, 10_000) == ({"a": 10_003}, 0)


@settings(max_examples=200)
@given(st.integers(0, 300), st.dictionaries(_names, st.integers(0, 200), min_size=1, max_size=6))
def test_allocation_uses_every_credit_and_serves_backlog_first(
    avail: int, backlogs: dict[str, int]
) -> None:
    alloc = allocate(avail, backlogs)
    assert sum(alloc.desired.values()) == avail
    total = sum(backlogs.values())
    for name, backlog in backlogs.items():
        assert alloc.backlog[name] <= backlog
        assert alloc.backlog[name] <= alloc.needed[name] <= alloc.desired[name]
        if total <= avail:
            assert alloc.backlog[name] == backlog  # every reported task has a credit
    if total >= avail:
        assert alloc.backlog == alloc.desired  # nothing for idle nodes while work waits
    # Max-min fair: no node short of its backlog holds fewer than another holds + 1.
    for name, held in alloc.backlog.items():
        if held < backlogs[name]:
            assert all(held >= other - 1 for other in alloc.backlog.values())
