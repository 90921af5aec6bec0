"""Which node should own which shard: rendezvous (highest-random-weight) hashing.

Every node computes the same map from the same membership, with no coordination: shard
``s`` goes to the live node with the highest ``blake2b(node_id, s)``. When a node joins,
it takes exactly the shards for which it now has the highest weight (about S/N of them);
when a node leaves, only its shards move. Plain HRW spreads S shards over N nodes with
the variance of a multinomial, so :func:`assign` adds a bounded-load pass: no node gets
more than ``ceil(S/N)`` shards, overflow going to each shard's next-highest node. The pass
is deterministic, so the map is still the same on every node, and a join or leave still
moves few shards (tested as a property).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping


def weight(node_id: str, shard: int) -> int:
    """The node's weight for the shard; stable across processes and Python versions."""
    digest = hashlib.blake2b(
        node_id.encode() + b"\x00" + shard.to_bytes(4, "big"), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big")


def preference(nodes: Iterable[str], shard: int) -> list[str]:
    """Nodes in the order the shard prefers them (highest weight first, ties by id)."""
    return sorted(nodes, key=lambda node: (-weight(node, shard), node))


def assign(nodes: Iterable[str], shard_count: int) -> dict[int, str]:
    """Map every shard to one of ``nodes``; empty if there are no nodes."""
    members = sorted(set(nodes))
    if not members or shard_count <= 0:
        return {}
    capacity = math.ceil(shard_count / len(members))
    load = dict.fromkeys(members, 0)
    owners: dict[int, str] = {}
    # Shards whose top choice is strongest are placed first, so the bounded-load pass
    # displaces the shards that care least about their first choice.
    order = sorted(
        range(shard_count),
        key=lambda s: (-max(weight(n, s) for n in members), s),
    )
    for shard in order:
        for node in preference(members, shard):
            if load[node] < capacity:
                owners[shard] = node
                load[node] += 1
                break
    return owners


def shards_of(owners: Mapping[int, str], node_id: str) -> set[int]:
    return {shard for shard, owner in owners.items() if owner == node_id}
