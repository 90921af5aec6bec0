"""A submit answers with the task it built from the request (``core.models.inserted_task``),
not with its row read back: that task must be the row as PostgreSQL stored it, field for
field, for any task the wire can hand the store, on every write path (a keyless batch
chunk by chunk, a keyed one in one transaction, group commit with and without keys).

Payloads are generated as JSON text and parsed as the wire parses them, so their
numbers have the types the scheduler really holds (exact: Decimal where a float would
round)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import uvloop
from fixtures.stores import in_chunks, new_tenant, prepared_task
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronoshard import exact_json, json_documents
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import NewTask, Priority, SubmitResult, Tenant
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.errors import SchedulerError
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.submits import SubmitStore

SHARDS = 64
PATHS = ("batch", "batch-keyed", "group", "group-keyed", "streamed")
"""insert_tasks (a keyed or keyless SubmitBatch), insert_each (group commit), and
insert_streamed (a keyless SubmitBatch, chunk by chunk)."""

_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_PAYLOADS = st.dictionaries(_TEXT, _JSON, max_size=6).map(
    lambda value: json_documents.parse(exact_json.dumps(value).encode(), None, object_only=True)
)
_INSTANTS = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_NAMES = st.text("abcdefghijklmnopqrstuvwxyz._-", min_size=1, max_size=40)


@st.composite
def new_tasks(draw: st.DrawFn) -> NewTask:
    task_id = new_task_id()
    scheduled_at = draw(_INSTANTS)
    initial_s = draw(st.floats(min_value=0.001, max_value=3600))
    return NewTask(
        id=task_id,
        type=draw(_NAMES),
        scheduled_at=scheduled_at,
        due_at=scheduled_at + timedelta(microseconds=draw(st.integers(0, 10**8))),
        shard=shard_of(task_id, SHARDS),
        payload=draw(_PAYLOADS),
        priority=draw(st.sampled_from(Priority)),
        queue=draw(_NAMES),
        max_retries=draw(st.integers(0, 100)),
        timeout_s=draw(st.none() | st.floats(min_value=0.001, max_value=86400)),
        strict_timing=draw(st.booleans()),
        idempotent=draw(st.booleans()),
        job_id=draw(st.none() | _NAMES),
        jitter_mode=draw(st.sampled_from(JitterMode)),
        backoff_initial_s=initial_s,
        backoff_max_s=initial_s * draw(st.floats(min_value=1, max_value=100)),
        backoff_multiplier=draw(st.floats(min_value=1, max_value=10)),
        schedule_id=draw(st.none() | st.uuids()),
        logical_date=draw(st.none() | _INSTANTS),
        trace_context=draw(st.none() | st.dictionaries(_NAMES, _NAMES, max_size=3)),
        submitted_by=draw(st.none() | _NAMES),
    )


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as opened:
        yield opened


@pytest.fixture(scope="module")
def opened(runner: asyncio.Runner, db_dsn: str) -> Iterator[tuple[Store, Tenant]]:
    async def open_store() -> tuple[Store, Tenant]:
        store = await Store.open(db_dsn, min_size=1, max_size=2)
        return store, await new_tenant(store)

    store, tenant = runner.run(open_store())
    try:
        yield store, tenant
    finally:
        runner.run(store.close())


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tasks=st.lists(new_tasks(), min_size=1, max_size=4),
    path=st.sampled_from(PATHS),
    chunk=st.integers(min_value=1, max_value=3),
)
def test_the_answer_of_a_submit_is_the_row_as_stored(
    runner: asyncio.Runner,
    opened: tuple[Store, Tenant],
    tasks: list[NewTask],
    path: str,
    chunk: int,
) -> None:
    store, tenant = opened
    if path.endswith("-keyed"):
        tasks = [_with_key(t) for t in tasks]
    runner.run(_submit_and_compare(store, tenant, tasks, path=path, chunk=chunk))


def _with_key(task: NewTask) -> NewTask:
    fields: dict[str, Any] = {name: getattr(task, name) for name in NewTask.__dataclass_fields__}
    fields["idempotency_key"] = f"k-{uuid.uuid4().hex}"
    return NewTask(**fields)


async def _submit_and_compare(
    store: Store, tenant: Tenant, tasks: list[NewTask], *, path: str, chunk: int
) -> None:
    submits = SubmitStore(store)
    prepared = [prepared_task(t) for t in tasks]
    outcomes: list[SubmitResult | SchedulerError]
    if path.startswith("group"):
        outcomes = await submits.insert_each([(tenant.id, p) for p in prepared])
    elif path == "streamed":
        outcomes = list(await submits.insert_streamed(tenant.id, in_chunks(prepared, chunk)))
    else:
        outcomes = list(await submits.insert_tasks(tenant.id, prepared))
    assert len(outcomes) == len(tasks)
    for task, outcome in zip(tasks, outcomes, strict=True):
        assert not isinstance(outcome, Exception), outcome
        assert outcome.created
        stored = await store.get_task(tenant.id, task.id)
        assert stored is not None
        assert outcome.task == stored
        # Equal is not enough where types differ and compare equal (1 == 1.0 == True):
        # the answer's payload must serialise as the stored one's does.
        assert exact_json.dumps(outcome.task.payload, sort_keys=True) == exact_json.dumps(
            stored.payload, sort_keys=True
        )
