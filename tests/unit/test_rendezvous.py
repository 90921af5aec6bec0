"""Rendezvous shard assignment: complete, balanced, stable, and minimal under churn."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.rendezvous import assign, preference, shards_of, weight

node_ids = st.lists(
    st.text(alphabet="abcdefghijklmnop0123456789-", min_size=1, max_size=12),
    min_size=1,
    max_size=12,
    unique=True,
)
shard_counts = st.integers(min_value=1, max_value=256)


def test_fixed_vectors_are_stable_across_processes_and_versions() -> None:
    assert weight("node-a", 0) == 0xB3F55725B54886DE
    assert weight("scheduler-1", 63) == 0x05F17E87B06D9246
    assert preference(["node-a", "node-b", "node-c"], 5) == preference(
        ["node-c", "node-b", "node-a"], 5
    )


def test_no_nodes_no_owners() -> None:
    assert assign([], 64) == {}


def test_single_node_owns_everything() -> None:
    owners = assign(["only"], 64)
    assert set(owners) == set(range(64))
    assert shards_of(owners, "only") == set(range(64))


@settings(max_examples=200, deadline=None)
@given(node_ids, shard_counts)
def test_every_shard_has_exactly_one_live_owner_and_load_is_bounded(
    nodes: list[str], shard_count: int
) -> None:
    owners = assign(nodes, shard_count)
    assert set(owners) == set(range(shard_count))
    assert set(owners.values()) <= set(nodes)
    load = Counter(owners.values())
    assert max(load.values()) <= math.ceil(shard_count / len(nodes))


@settings(max_examples=200, deadline=None)
@given(node_ids, shard_counts)
def test_order_of_membership_does_not_matter(nodes: list[str], shard_count: int) -> None:
    assert assign(nodes, shard_count) == assign(list(reversed(nodes)), shard_count)


@settings(max_examples=200, deadline=None)
@given(node_ids, st.integers(min_value=8, max_value=256), st.data())
def test_a_join_moves_few_shards_and_only_to_the_new_node(
    nodes: list[str], shard_count: int, data: st.DataObject
) -> None:
    newcomer = data.draw(st.text(alphabet="qrstuvwxyz", min_size=1, max_size=8))
    if newcomer in nodes:
        return
    before = assign(nodes, shard_count)
    after = assign([*nodes, newcomer], shard_count)
    moved = {s for s in before if before[s] != after[s]}
    # The new node's fair share, plus what the load bound may shuffle: every shard that
    # moves to someone other than the newcomer is one the bound displaced.
    fair = math.ceil(shard_count / (len(nodes) + 1))
    to_newcomer = {s for s in moved if after[s] == newcomer}
    assert len(to_newcomer) <= fair
    assert len(moved) <= 2 * fair + len(nodes) + 1


@settings(max_examples=200, deadline=None)
@given(node_ids.filter(lambda n: len(n) >= 2), st.integers(min_value=8, max_value=256), st.data())
def test_a_leave_moves_mostly_the_leavers_shards(
    nodes: list[str], shard_count: int, data: st.DataObject
) -> None:
    leaver = data.draw(st.sampled_from(nodes))
    before = assign(nodes, shard_count)
    remaining = [n for n in nodes if n != leaver]
    after = assign(remaining, shard_count)
    orphaned = shards_of(before, leaver)
    moved = {s for s in before if before[s] != after[s]}
    assert orphaned <= moved
    fair = math.ceil(shard_count / len(remaining))
    assert len(moved - orphaned) <= fair + len(nodes)


def test_balance_on_a_typical_cluster() -> None:
    owners = assign([f"scheduler-{i}" for i in range(3)], 64)
    load = Counter(owners.values())
    assert sorted(load.values()) in ([21, 21, 22], [20, 22, 22])
