"""UUIDv7 ids: RFC 9562 layout, readable time, creation-order sorting, and the one text
form the API accepts for an id."""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.api import convert
from chronoshard.scheduler.core.ids import (
    UUIDv7Generator,
    new_task_id,
    uuid7,
    uuid7_time,
    wall_clock_ms,
)
from chronoshard.scheduler.errors import InvalidArgument

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
MAX_MS = (1 << 48) - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DATETIME_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

# Worked out by hand from RFC 9562 §5.7 and frozen.
FIXED_VECTORS = [
    (0, bytes(10), "00000000-0000-7000-8000-000000000000"),
    (MAX_MS, b"\xff" * 10, "ffffffff-ffff-7fff-bfff-ffffffffffff"),
    # 2026-01-01T00:00:00.123Z = 0x019b76daa87b ms; low 74 bits of 0x00112233445566778899:
    # rand_a = 0x044, rand_b = 0x2233445566778899 (variant bits replace the top two 0s).
    (
        1_767_225_600_123,
        bytes.fromhex("00112233445566778899"),
        "019b76da-a87b-7044-a233-445566778899",
    ),
    (1_700_000_000_000, bytes(range(10)), "018bcfe5-6800-7004-8203-040506070809"),
]


@pytest.mark.parametrize(("unix_ms", "rand", "expected"), FIXED_VECTORS)
def test_fixed_vectors(unix_ms: int, rand: bytes, expected: str) -> None:
    assert uuid7(unix_ms, rand) == uuid.UUID(expected)


def test_reads_the_time_back() -> None:
    u = uuid.UUID("019b76da-a87b-7044-a233-445566778899")
    assert uuid7_time(u) == datetime(2026, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)


def test_time_past_the_year_9999_is_rejected_not_crashed() -> None:
    last = uuid7_time(uuid7(DATETIME_MAX_MS, bytes(10)))
    assert last == datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
    with pytest.raises(InvalidArgument):
        uuid7_time(uuid7(DATETIME_MAX_MS + 1, bytes(10)))


def test_time_of_a_non_v7_uuid_is_rejected() -> None:
    with pytest.raises(InvalidArgument):
        uuid7_time(uuid.UUID("123e4567-e89b-42d3-a456-426614174000"))


@pytest.mark.parametrize(
    ("unix_ms", "rand", "field"),
    [(-1, bytes(10), "unix_ms"), (MAX_MS + 1, bytes(10), "unix_ms"), (0, bytes(9), "rand")],
)
def test_rejects_out_of_range_inputs(unix_ms: int, rand: bytes, field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        uuid7(unix_ms, rand)
    assert raised.value.field == field


@PROPERTY_SETTINGS
@given(st.integers(0, MAX_MS), st.binary(min_size=10, max_size=10))
def test_layout_bits(unix_ms: int, rand: bytes) -> None:
    u = uuid7(unix_ms, rand)
    assert u.version == 7
    assert u.variant == uuid.RFC_4122
    assert u.int >> 80 == unix_ms
    # The 74 random bits come back out of rand_a and rand_b unchanged.
    rand_a = (u.int >> 64) & 0xFFF
    rand_b = u.int & ((1 << 62) - 1)
    assert (rand_a << 62) | rand_b == int.from_bytes(rand, "big") & ((1 << 74) - 1)


@PROPERTY_SETTINGS
@given(
    st.integers(0, MAX_MS),
    st.integers(0, MAX_MS),
    st.binary(min_size=10, max_size=10),
    st.binary(min_size=10, max_size=10),
)
def test_ids_sort_by_time(ms_1: int, ms_2: int, rand_1: bytes, rand_2: bytes) -> None:
    first, second = uuid7(ms_1, rand_1), uuid7(ms_2, rand_2)
    if ms_1 < ms_2:
        assert first < second
        assert str(first) < str(second)  # also as text, the way PostgreSQL compares uuid
        assert first.bytes < second.bytes
    if ms_1 <= DATETIME_MAX_MS:
        assert uuid7_time(first) == _EPOCH + timedelta(milliseconds=ms_1)
    else:
        with pytest.raises(InvalidArgument):
            uuid7_time(first)


class _SteppingClock:
    """A clock that returns a scripted sequence of milliseconds."""

    def __init__(self, readings: list[int]) -> None:
        self._readings: Iterator[int] = iter(readings)

    def __call__(self) -> int:
        return next(self._readings)


@PROPERTY_SETTINGS
@given(
    st.lists(st.integers(1_700_000_000_000, 1_700_000_000_050), min_size=1, max_size=100),
    st.integers(0, 2**32),
)
def test_generator_output_sorts_in_creation_order_even_if_the_clock_steps_back(
    readings: list[int], seed: int
) -> None:
    generator = UUIDv7Generator(
        clock_ms=_SteppingClock(readings), randbytes=random.Random(seed).randbytes
    )
    made = [generator.new() for _ in readings]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    # The timestamp is the highest reading so far: never ahead of the clock by more than
    # an exhausted random space (which these few ids cannot exhaust).
    high_water = 0
    for reading, u in zip(readings, made, strict=True):
        high_water = max(high_water, reading)
        assert u.int >> 80 == high_water


def test_same_millisecond_increments_the_random_part() -> None:
    generator = UUIDv7Generator(clock_ms=lambda: 1_000, randbytes=lambda n: bytes(n))
    first, second, third = generator.new(), generator.new(), generator.new()
    assert first == uuid7(1_000, bytes(10))
    assert second.int == first.int + 1
    assert third.int == first.int + 2


def test_a_later_millisecond_draws_fresh_randomness() -> None:
    draws = iter([b"\x00" * 9 + b"\x05", b"\x00" * 9 + b"\x01"])
    generator = UUIDv7Generator(randbytes=lambda n: next(draws))
    assert generator.new(1_000) == uuid7(1_000, b"\x00" * 9 + b"\x05")
    assert generator.new(1_001) == uuid7(1_001, b"\x00" * 9 + b"\x01")


def test_exhausted_random_space_borrows_the_next_millisecond() -> None:
    draws = iter([b"\xff" * 10, b"\x00" * 9 + b"\x07"])
    generator = UUIDv7Generator(clock_ms=lambda: 1_000, randbytes=lambda n: next(draws))
    top = generator.new()
    assert top == uuid7(1_000, b"\xff" * 10)
    after = generator.new()
    assert after == uuid7(1_001, b"\x00" * 9 + b"\x07")
    assert top < after


def test_threads_share_one_order() -> None:
    generator = UUIDv7Generator(clock_ms=lambda: 5_000)
    per_thread: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def make(out: list[uuid.UUID]) -> None:
        for _ in range(500):
            out.append(generator.new())

    threads = [threading.Thread(target=make, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [u for out in per_thread for u in out]
    assert len(set(everything)) == 2000
    for out in per_thread:
        assert out == sorted(out)


def test_new_task_id_is_monotonic_across_calls_and_injected_clocks() -> None:
    first = new_task_id()
    pinned = new_task_id(lambda: 1)  # a clock far behind the process's last id
    later = new_task_id()
    assert first < pinned < later
    assert first.version == pinned.version == later.version == 7


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_continue_the_parents_sequence() -> None:
    # Pin the clock to "now" (never ahead: later ids of this process must not inherit a
    # future timestamp) so parent and child both stay in the same millisecond.
    now_ms = wall_clock_ms()
    parent_last = new_task_id(lambda: now_ms)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.write(write_end, new_task_id(lambda: now_ms).bytes)
        finally:
            os._exit(0)
    os.close(write_end)
    child_id = uuid.UUID(bytes=os.read(read_end, 16))
    os.close(read_end)
    os.waitpid(pid, 0)
    parent_next = new_task_id(lambda: now_ms)
    # Without the fork hook the child would make exactly parent_last + 1, as the parent does.
    assert parent_next.int == parent_last.int + 1
    assert child_id != parent_next


@PROPERTY_SETTINGS
@given(st.uuids())
def test_an_id_is_read_from_its_canonical_text_in_either_case(value: uuid.UUID) -> None:
    # Upper-case hex names the same 128 bits: accepted, and answered in lower case.
    assert convert.uuid_from_pb(str(value), "id") == value
    assert convert.uuid_from_pb(str(value).upper(), "id") == value


@pytest.mark.parametrize(
    "text",
    [
        "{0190a5e2-0000-7000-8000-000000000001}",  # braces
        "urn:uuid:0190a5e2-0000-7000-8000-000000000001",
        "0190a5e2000070008000000000000001",  # no hyphens
        "0190a5e2-0000-7000-8000-00000000001",  # one digit short
        "0190a5e2-0000-7000-8000-0000000000012",  # one too many
        "0190a5e20-000-7000-8000-000000000001",  # hyphens in the wrong places
        "0190a5e2-0000-7000-8000-00000000000g",
        " 0190a5e2-0000-7000-8000-000000000001",
        "0190a5e2-0000-7000-8000-000000000001\n",
        "0190a5e2-0000-7000-8000-00000000000\uff11",  # a non-ASCII digit
        "",
    ],
)
def test_any_other_spelling_of_an_id_is_refused_on_its_field(text: str) -> None:
    # The first three uuid.UUID() reads (braces, urn:uuid:, no hyphens), and so did this:
    # the API does not, so an id has one spelling (case aside).
    with pytest.raises(InvalidArgument) as raised:
        convert.uuid_from_pb(text, "task.id")
    assert raised.value.field == "task.id"
    assert "canonical text (8-4-4-4-12 hex digits)" in raised.value.message
