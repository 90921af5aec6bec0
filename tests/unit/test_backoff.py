"""Retry backoff: exponential, capped, with jitter fixed by (seed, attempt)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.backoff import (
    MAX_ATTEMPT,
    base_delay_s,
    jitter_unit,
    retry_delay_s,
)
from chronoshard.scheduler.errors import InvalidArgument

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
SEED = uuid.UUID("0190a7d2-6a3b-7c4d-8e5f-6a7b8c9d0e1f").bytes
POLICY = {"initial_s": 1.0, "max_s": 60.0, "multiplier": 2.0}

# Computed once from the documented recipe and frozen. The arithmetic is exact in binary
# floating point (powers of two, a 53-bit fraction over 2**53), so == is the right test.
FIXED_VECTORS = [
    # attempt, u, delay with equal jitter (f = 0.5)
    (1, 0.9557437089518335, 0.9778718544759167),
    (2, 0.016443607447123032, 1.016443607447123),
    (3, 0.10777651043184067, 2.2155530208636813),
    (4, 0.5852310282954373, 6.3409241131817495),
    (5, 0.8414128631173923, 14.731302904939138),
]


@pytest.mark.parametrize(("attempt", "unit", "delay"), FIXED_VECTORS)
def test_fixed_vectors(attempt: int, unit: float, delay: float) -> None:
    assert jitter_unit(SEED, attempt) == unit
    assert retry_delay_s(attempt, **POLICY, jitter_fraction=0.5, seed=SEED) == delay


def test_fixed_vector_full_jitter_at_the_cap() -> None:
    # Attempt 10 would be 512 s; capped at 60, then anywhere in [0, 60).
    delay = retry_delay_s(10, **POLICY, jitter_fraction=1.0, seed=b"seed")
    assert delay == 28.802512911196253


def test_base_delay_grows_then_caps() -> None:
    assert [base_delay_s(a, **POLICY) for a in range(1, 9)] == [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0,
    ]  # fmt: skip


def test_no_jitter_is_the_base_delay() -> None:
    assert retry_delay_s(3, **POLICY, jitter_fraction=0.0, seed=SEED) == 4.0


def test_huge_attempts_stay_at_the_cap() -> None:
    # 2.0 ** (MAX_ATTEMPT - 1) overflows a float; the cap must still apply.
    assert base_delay_s(MAX_ATTEMPT, **POLICY) == 60.0
    assert retry_delay_s(MAX_ATTEMPT, **POLICY, jitter_fraction=1.0, seed=SEED) <= 60.0


def test_the_seed_and_the_attempt_both_move_the_jitter() -> None:
    other_seed = uuid.UUID(int=uuid.UUID(bytes=SEED).int + 1).bytes
    assert jitter_unit(SEED, 1) != jitter_unit(other_seed, 1)
    assert jitter_unit(SEED, 1) != jitter_unit(SEED, 2)


def test_jitter_units_are_spread_over_the_unit_interval() -> None:
    # Deterministic inputs, so this cannot flake: 2,000 seeds into 10 bins, each bin
    # expected 200 (sd ~13.4). A stuck or biased unit would fail.
    bins = [0] * 10
    for i in range(2_000):
        bins[int(jitter_unit(i.to_bytes(16, "big"), 1) * 10)] += 1
    assert all(140 < count < 260 for count in bins)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"attempt": 0}, "attempt"),
        ({"attempt": MAX_ATTEMPT + 1}, "attempt"),
        ({"attempt": True}, "attempt"),
        ({"initial_s": 0.0}, "initial_s"),
        ({"initial_s": float("nan")}, "initial_s"),
        ({"max_s": 0.5}, "max_s"),
        ({"max_s": float("inf")}, "max_s"),
        ({"multiplier": 0.9}, "multiplier"),
        ({"jitter_fraction": -0.1}, "jitter_fraction"),
        ({"jitter_fraction": 1.5}, "jitter_fraction"),
        ({"jitter_fraction": float("nan")}, "jitter_fraction"),
    ],
)
def test_rejects_invalid_inputs(overrides: dict[str, object], field: str) -> None:
    args: dict[str, object] = {**POLICY, "attempt": 1, "jitter_fraction": 0.5, "seed": SEED}
    args.update(overrides)
    attempt = args.pop("attempt")
    with pytest.raises(InvalidArgument) as raised:
        retry_delay_s(attempt, **args)  # type: ignore[arg-type]
    assert raised.value.field == field


policies = st.fixed_dictionaries(
    {
        "initial_s": st.floats(min_value=0.001, max_value=100.0),
        "multiplier": st.floats(min_value=1.0, max_value=10.0),
    }
).flatmap(
    lambda p: st.fixed_dictionaries(
        {
            "initial_s": st.just(p["initial_s"]),
            "multiplier": st.just(p["multiplier"]),
            "max_s": st.floats(min_value=p["initial_s"], max_value=86_400.0),
        }
    )
)
attempts = st.integers(min_value=1, max_value=MAX_ATTEMPT - 1)


@PROPERTY_SETTINGS
@given(policies, attempts)
def test_base_delay_is_monotone_and_capped(policy: dict[str, float], attempt: int) -> None:
    this, following = base_delay_s(attempt, **policy), base_delay_s(attempt + 1, **policy)
    assert policy["initial_s"] <= this <= following <= policy["max_s"]


@PROPERTY_SETTINGS
@given(policies, attempts, st.floats(min_value=0.0, max_value=1.0), st.binary(max_size=32))
def test_jittered_delay_stays_in_its_band(
    policy: dict[str, float], attempt: int, fraction: float, seed: bytes
) -> None:
    base = base_delay_s(attempt, **policy)
    delay = retry_delay_s(attempt, **policy, jitter_fraction=fraction, seed=seed)
    assert base * (1.0 - fraction) <= delay <= base <= policy["max_s"]
    assert delay == retry_delay_s(attempt, **policy, jitter_fraction=fraction, seed=seed)
