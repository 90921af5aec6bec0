"""The cross-node signal payloads: every shard and task arrives, in NOTIFY's size limit."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from chronoshard.scheduler.cluster.signals import (
    MAX_PAYLOAD_CHARS,
    decode,
    encode_due,
    encode_ready,
)
from chronoshard.scheduler.core.models import TaskRef

EPOCH = datetime(2026, 12, 1, tzinfo=UTC)

shards = st.integers(min_value=0, max_value=65_535)
refs = st.builds(
    TaskRef,
    st.integers(min_value=0, max_value=10**9).map(lambda us: EPOCH + timedelta(microseconds=us)),
    st.uuids(),
)


@given(st.lists(shards, max_size=3000))
def test_due_shards_arrive_once_each_within_the_payload_limit(wanted: list[int]) -> None:
    payloads = encode_due(wanted)
    received: list[int] = []
    for payload in payloads:
        assert len(payload) <= MAX_PAYLOAD_CHARS
        kind, woken, tasks = decode(payload)
        assert (kind, tasks) == ("due", [])
        received.extend(woken)
    assert sorted(received) == sorted(set(wanted))
    for full, following in itertools.pairwise(payloads):
        # A payload closed early would cost the receiver one more wake-up.
        assert len(full) + 1 + len(following.split(" ")[1]) > MAX_PAYLOAD_CHARS


@given(st.lists(st.tuples(shards, refs), max_size=400))
def test_ready_tasks_arrive_in_order_within_the_payload_limit(
    wanted: list[tuple[int, TaskRef]],
) -> None:
    received: list[tuple[int, TaskRef]] = []
    for payload in encode_ready(wanted):
        assert len(payload) <= MAX_PAYLOAD_CHARS
        kind, woken, tasks = decode(payload)
        assert kind == "ready" and woken == {shard for shard, _ in tasks}
        received.extend(tasks)
    assert received == wanted


def test_a_payload_is_closed_only_when_the_next_line_would_not_fit() -> None:
    line = len(f"7 {EPOCH.isoformat()} {uuid.UUID(int=0)}")
    per_payload = (MAX_PAYLOAD_CHARS - len("ready")) // (line + 1)
    tasks = [(7, TaskRef(EPOCH, uuid.UUID(int=i))) for i in range(per_payload + 1)]
    payloads = encode_ready(tasks)
    assert [len(decode(p)[2]) for p in payloads] == [per_payload, 1]
