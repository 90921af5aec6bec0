"""shard_of is stable across processes and versions, in range, and spreads ids evenly."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.ids import UUIDv7Generator
from chronoshard.scheduler.core.sharding import MAX_SHARD_COUNT, shard_of
from chronoshard.scheduler.errors import InvalidArgument

# Computed once from the documented recipe (BLAKE2b, 8-byte digest, big-endian, mod S)
# and frozen: a change here reassigns every stored task to another shard.
FIXED_VECTORS = [
    ("00000000-0000-0000-0000-000000000000", {1: 0, 2: 0, 64: 14, 1000: 166, 32768: 29710}),
    ("00000000-0000-0000-0000-000000000001", {1: 0, 2: 0, 64: 2, 1000: 402, 32768: 16258}),
    ("0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f", {1: 0, 2: 1, 64: 43, 1000: 683, 32768: 10219}),
    ("ffffffff-ffff-ffff-ffff-ffffffffffff", {1: 0, 2: 1, 64: 39, 1000: 695, 32768: 1831}),
    ("123e4567-e89b-42d3-a456-426614174000", {1: 0, 2: 0, 64: 24, 1000: 864, 32768: 11736}),
]


@pytest.mark.parametrize(("task_id", "expected"), FIXED_VECTORS)
def test_fixed_vectors(task_id: str, expected: dict[int, int]) -> None:
    assert {n: shard_of(uuid.UUID(task_id), n) for n in expected} == expected


def test_same_shard_in_a_process_with_another_hash_seed() -> None:
    task_id = "0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f"
    code = (
        "import uuid\n"
        "from chronoshard.scheduler.core.sharding import shard_of\n"
        f"print(shard_of(uuid.UUID({task_id!r}), 1000), hash('salted?'))\n"
    )
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.split())
    (shard_1, salted_1), (shard_2, salted_2) = outputs
    assert salted_1 != salted_2, "the two processes did not get different hash seeds"
    assert shard_1 == shard_2 == "683"


@pytest.mark.parametrize("bad", [0, -1, MAX_SHARD_COUNT + 1, True])
def test_rejects_shard_counts_outside_the_column(bad: int) -> None:
    with pytest.raises(InvalidArgument) as raised:
        shard_of(uuid.UUID(int=1), bad)
    assert raised.value.field == "shard_count"


@settings(max_examples=200, deadline=None)
@given(st.uuids(), st.integers(min_value=1, max_value=MAX_SHARD_COUNT))
def test_shard_is_in_range(task_id: uuid.UUID, shard_count: int) -> None:
    assert 0 <= shard_of(task_id, shard_count) < shard_count


def _chi_square(counts: list[int], total: int) -> float:
    expected = total / len(counts)
    return sum((c - expected) ** 2 / expected for c in counts)


@pytest.mark.parametrize("burst", [1, 1000], ids=["one-per-ms", "1000-per-ms"])
def test_uuid7_ids_spread_evenly_over_64_shards(burst: int) -> None:
    # Realistic ids: UUIDv7s whose timestamps barely differ and, in a burst, whose random
    # parts are consecutive integers. Seeded, so the result is fixed and never flaky; the
    # bound is what a fair hash passes with a wide margin: chi-square with 63 degrees of
    # freedom has mean 63 and sd ~11.2, and P(X > 120) is about 2e-5.
    rng = random.Random(20260301)
    generator = UUIDv7Generator(randbytes=rng.randbytes)
    start_ms = 1_767_225_600_000
    total, shards = 10_000, 64
    counts = [0] * shards
    for i in range(total):
        # Within a burst the millisecond repeats, so the generator increments rand.
        task_id = generator.new(start_ms + i // burst)
        counts[shard_of(task_id, shards)] += 1
    assert _chi_square(counts, total) < 120
    assert min(counts) > 0


def test_chi_square_bound_catches_a_skewed_hash() -> None:
    # The same bound rejects a "hash" that looks only at the timestamp's low bits, which
    # in a burst puts everything in one shard: the test above can fail.
    counts = [0] * 64
    for i in range(10_000):
        counts[(i // 1000) % 64] += 1
    assert _chi_square(counts, 10_000) > 120
