"""ScheduleService and the materialiser against a real PostgreSQL.

The servicer runs on a real grpc.aio server (port 0) and is called through the
generated stub; the materialiser runs its real passes over the same database, on a
:class:`FakeClock` so that "the cluster was down for three occurrences" is a clock step,
not a wait. It owns every shard at one epoch (rows in ``shard_owners``) unless a test
moves one. Rows are read back with plain SQL: what was created, skipped, withdrawn.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.grpc_servers import serving
from fixtures.stores import tenant_with_key
from google.protobuf import duration_pb2, timestamp_pb2

from chronoshard.clock import FakeClock
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.schedule_requests import occurrence_builder
from chronoshard.scheduler.api.schedules import ScheduleServiceServicer, pacing_of
from chronoshard.scheduler.api.task_requests import SubmitLimits
from chronoshard.scheduler.cluster.materialiser import Materialiser
from chronoshard.scheduler.config import SchedulerConfig, SchedulesConfig, SchedulingConfig
from chronoshard.scheduler.core.models import Task, Tenant
from chronoshard.scheduler.core.schedules import Overlap, Schedule, lead
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.partitions import detach_old_partitions
from chronoshard.scheduler.store.schedules import ScheduleStore
from chronoshard.scheduler.store.submits import SubmitStore
from chronoshard.scheduler.store.tenants import TenantStore
from chronoshard.scheduler.store.workflow_progress import finish_runs
from chronoshard.v1 import common_pb2, task_service_pb2
from chronoshard.v1 import schedule_service_pb2 as pb
from chronoshard.v1 import schedule_service_pb2_grpc as pb_grpc
from chronoshard.wire import error_info_from_metadata

pytestmark = pytest.mark.store(own_database=True)

SHARDS = 8
EPOCH = 7
CONFIG = SchedulerConfig(
    scheduling=SchedulingConfig(shard_count=SHARDS),
    schedules=SchedulesConfig(lookahead_s=10.0, overlap_lead_s=2.0, batch=50),
)
START = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)


@dataclass
class Shards:
    """The materialiser's view of ownership: every shard at EPOCH unless told."""

    epochs_held: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(SHARDS), EPOCH))
    lost: set[int] = field(default_factory=set)

    def epochs(self) -> Mapping[int, int]:
        return self.epochs_held

    def owns(self, shard: int) -> bool:
        return shard in self.epochs_held

    def dispatch_allowed(self) -> bool:
        return True

    def epochs_lost(self, shards: Iterable[int]) -> None:
        self.lost.update(shards)


@dataclass
class Recorder:
    changed: list[int] = field(default_factory=list)
    submitted: list[Task] = field(default_factory=list)

    def schedule_changed(self, schedule: Schedule) -> None:
        self.changed.append(schedule.shard)

    def tasks_submitted(self, tasks: Sequence[Task]) -> None:
        self.submitted.extend(tasks)


@dataclass
class Env:
    stub: pb_grpc.ScheduleServiceStub
    store: Store
    dsn: str
    tenant: Tenant
    key: str
    clock: FakeClock
    shards: Shards
    listener: Recorder
    materialiser: Materialiser
    created: list[Task]

    @property
    def auth(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.key}"),)

    async def create(self, **spec: Any) -> pb.Schedule:
        response = await self.stub.CreateSchedule(
            pb.CreateScheduleRequest(spec=_spec(**spec)), metadata=self.auth, timeout=10
        )
        return response.schedule

    async def sql(self, query: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute(query, params or {})  # type: ignore[arg-type]
            return await cur.fetchall() if cur.description else []

    async def occurrences(self, schedule_id: str) -> list[tuple[datetime, str, bool]]:
        """(logical date, origin, has a task) of every occurrence, in order."""
        rows = await self.sql(
            "SELECT logical_date, origin, task_id IS NOT NULL FROM schedule_occurrences"
            " WHERE schedule_id = %(s)s ORDER BY logical_date",
            {"s": schedule_id},
        )
        return [(r[0], r[1], r[2]) for r in rows]

    async def tasks(self, schedule_id: str) -> list[tuple[datetime, datetime, str]]:
        """(logical date, scheduled_at, status) of the schedule's tasks, in order."""
        rows = await self.sql(
            "SELECT logical_date, scheduled_at, status FROM tasks WHERE schedule_id = %(s)s"
            " ORDER BY logical_date, created_at",
            {"s": schedule_id},
        )
        return [(r[0], r[1], r[2]) for r in rows]

    async def passes(self, n: int = 1) -> None:
        for _ in range(n):
            while await self.materialiser.pass_once():
                pass


def _ts(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def _dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=seconds))
    return d


def _spec(
    *,
    name: str = "nightly",
    cron: str | None = None,
    every_s: float | None = None,
    timezone: str = "",
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    payload: bytes = b'{"n": 1}',
    timeout_s: float | None = None,
    catchup: int = pb.CATCHUP_POLICY_UNSPECIFIED,
    catchup_limit: int | None = None,
    overlap: int = pb.OVERLAP_POLICY_UNSPECIFIED,
    template: task_service_pb2.SubmitTaskRequest | None = None,
) -> pb.ScheduleSpec:
    spec = pb.ScheduleSpec(
        name=name,
        timezone=timezone,
        catchup_policy=catchup,  # type: ignore[arg-type]
        overlap_policy=overlap,  # type: ignore[arg-type]
    )
    if cron is not None:
        spec.cron = cron
    if every_s is not None:
        spec.interval.CopyFrom(_dur(every_s))
    if start_at is not None:
        spec.start_at.CopyFrom(_ts(start_at))
    if end_at is not None:
        spec.end_at.CopyFrom(_ts(end_at))
    if catchup_limit is not None:
        spec.catchup_limit = catchup_limit
    body = template or task_service_pb2.SubmitTaskRequest(
        type="report", payload_json=payload, strict_timing=True
    )
    if timeout_s is not None:
        body.timeout.CopyFrom(_dur(timeout_s))
    spec.task_template.CopyFrom(body)
    return spec


@pytest.fixture
async def env(store: Store, fresh_db_dsn: str) -> AsyncIterator[Env]:
    for shard in range(SHARDS):
        assert await store.claim_shard_epoch(shard, EPOCH, "node-test")
    tenant, key = await tenant_with_key(store)
    clock = FakeClock(START)
    shards = Shards()
    listener = Recorder()
    limits = SubmitLimits.from_config(CONFIG)
    created: list[Task] = []

    materialiser = Materialiser(
        CONFIG,
        clock,
        store,
        ScheduleStore(store, SubmitStore(store)),
        shards,
        pacing_of(CONFIG),
        occurrence_builder(limits),
        created.extend,
    )
    servicer = ScheduleServiceServicer(
        config=CONFIG,
        store=store,
        authenticator=Authenticator(TenantStore(store)),
        listener=listener,
        clock=clock,
    )
    async with serving(pb_grpc.add_ScheduleServiceServicer_to_server, servicer) as channel:
        yield Env(
            pb_grpc.ScheduleServiceStub(channel),
            store,
            fresh_db_dsn,
            tenant,
            key,
            clock,
            shards,
            listener,
            materialiser,
            created,
        )


def ahead(made: pb.Schedule) -> int:
    """How many every-second occurrences one pass creates: the schedule's lead (the
    lookahead plus its share of the spread), in whole seconds."""
    return int(lead(uuid.UUID(made.id), Overlap.ALLOW, pacing_of(CONFIG)).total_seconds())


async def _refused(call: Awaitable[Any], code: grpc.StatusCode) -> common_pb2.ErrorInfo:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code, raised.value.details()
    info = error_info_from_metadata(raised.value.trailing_metadata())
    assert info is not None
    return info


# --- the API ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cron": "61 * * * *"}, "spec.cron"),
        ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "spec.timezone"),
        (
            {"cron": "0 2 * * *", "start_at": START + timedelta(days=2), "end_at": START},
            "spec.end_at",
        ),
        ({"cron": "0 2 * * *", "catchup": pb.CATCHUP_POLICY_ALL}, "spec.catchup_limit"),
        ({"cron": "0 2 * * *", "overlap": pb.OVERLAP_POLICY_SKIP}, "spec.task_template.timeout"),
        ({"every_s": 0.5}, "spec.interval"),
        ({}, "spec.cron"),
        ({"cron": "0 2 * * *", "payload": b"[1]"}, "spec.task_template.payload_json"),
        ({"cron": "0 2 * * *", "name": ""}, "spec.name"),
    ],
)
async def test_bad_specs_name_the_field_and_write_nothing(
    env: Env, spec: dict[str, Any], field: str
) -> None:
    info = await _refused(env.create(**spec), grpc.StatusCode.INVALID_ARGUMENT)
    assert info.field == field
    assert await env.sql("SELECT count(*) FROM schedules") == [(0,)]


async def test_a_template_with_its_own_time_or_key_is_refused(env: Env) -> None:
    timed = task_service_pb2.SubmitTaskRequest(type="report", delay=_dur(5))
    info = await _refused(
        env.create(cron="* * * * *", template=timed), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert info.field == "spec.task_template.delay"
    keyed = task_service_pb2.SubmitTaskRequest(type="report", idempotency_key="k")
    info = await _refused(
        env.create(cron="* * * * *", template=keyed), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert info.field == "spec.task_template.idempotency_key"


async def test_create_get_round_trips_the_spec_exactly(env: Env) -> None:
    payload = b'{"big": 12345678901234567890, "x": 1.0e5, "s": "\\u00e9"}'
    made = await env.create(
        name="ledger", cron="0 2 * * *", timezone="Europe/Berlin", payload=payload, timeout_s=30
    )
    got = await env.stub.GetSchedule(pb.GetScheduleRequest(id="ledger"), metadata=env.auth)
    assert got.schedule == made
    assert made.spec.task_template.payload_json == payload  # bytes as sent
    assert made.spec.job_id == "ledger"
    assert made.spec.watch.expected_duration.seconds == 30  # the template's timeout
    # 02:00 Berlin is 01:00 UTC in winter; the next five, in order, one day apart.
    nexts = [t.ToDatetime(tzinfo=UTC) for t in got.next_occurrences]
    assert nexts[0] == datetime(2026, 3, 3, 1, 0, tzinfo=UTC)
    assert len(nexts) == 5 and all(b - a == timedelta(days=1) for a, b in itertools.pairwise(nexts))
    by_id = await env.stub.GetSchedule(pb.GetScheduleRequest(id=made.id), metadata=env.auth)
    assert by_id.schedule == made
    info = await _refused(
        env.create(name="ledger", cron="* * * * *"), grpc.StatusCode.ALREADY_EXISTS
    )
    assert info.field == "spec.name"


async def test_list_pages_by_name(env: Env) -> None:
    for name in ("c", "a", "b"):
        await env.create(name=name, every_s=60)
    first = await env.stub.ListSchedules(pb.ListSchedulesRequest(page_size=2), metadata=env.auth)
    assert [s.spec.name for s in first.schedules] == ["a", "b"]
    rest = await env.stub.ListSchedules(
        pb.ListSchedulesRequest(page_size=2, page_token=first.next_page_token), metadata=env.auth
    )
    assert [s.spec.name for s in rest.schedules] == ["c"] and rest.next_page_token == ""


async def test_another_tenant_sees_nothing(env: Env) -> None:
    await env.create(name="mine", every_s=60)
    _, other_key = await tenant_with_key(env.store)
    other = (("authorization", f"Bearer {other_key}"),)
    await _refused(
        env.stub.GetSchedule(pb.GetScheduleRequest(id="mine"), metadata=other),
        grpc.StatusCode.NOT_FOUND,
    )
    listed = await env.stub.ListSchedules(pb.ListSchedulesRequest(), metadata=other)
    assert list(listed.schedules) == []


# --- materialisation ----------------------------------------------------------------------


async def test_every_second_creates_each_occurrence_once_ahead(env: Env) -> None:
    made = await env.create(name="tick", every_s=1)
    await env.passes(3)  # repeated passes at one instant create nothing more
    first = await env.occurrences(made.id)
    n = ahead(made)  # the lookahead, 10 s, and the schedule's share of the spread
    assert 10 <= n < 15
    assert [o[0] for o in first] == [START + timedelta(seconds=k) for k in range(1, n + 1)]
    env.clock.advance(5)
    await env.passes()
    tasks = await env.tasks(made.id)
    assert [t[0] for t in tasks] == [START + timedelta(seconds=k) for k in range(1, n + 6)]
    # Each occurrence runs at its own instant, strict, with its logical date.
    assert all(logical == scheduled for logical, scheduled, _ in tasks)
    assert env.created and {t.logical_date for t in env.created} == {t[0] for t in tasks}


async def test_two_materialisers_at_once_create_nothing_twice(env: Env) -> None:
    made = await env.create(name="tick", every_s=1)
    await asyncio.gather(*(env.materialiser.pass_once() for _ in range(4)))
    tasks = await env.tasks(made.id)
    assert len(tasks) == len({t[0] for t in tasks}) == ahead(made)


async def test_a_stale_epoch_writes_nothing(env: Env) -> None:
    made = await env.create(name="tick", every_s=1)
    await env.sql("UPDATE shard_owners SET epoch = epoch + 1")  # another node claimed
    await env.passes()
    assert await env.occurrences(made.id) == []
    assert env.shards.lost == set(range(SHARDS))


@pytest.mark.parametrize(
    ("catchup", "limit", "caught_up"),
    [
        (pb.CATCHUP_POLICY_SKIP, None, 0),
        (pb.CATCHUP_POLICY_LATEST, None, 1),
        (pb.CATCHUP_POLICY_ALL, 100, 3),
        (pb.CATCHUP_POLICY_ALL, 2, 2),
    ],
)
async def test_catchup_after_the_cluster_was_down_over_three_occurrences(
    env: Env, catchup: int, limit: int | None, caught_up: int
) -> None:
    made = await env.create(name="minutely", every_s=60, catchup=catchup, catchup_limit=limit)
    await env.passes()
    assert len(await env.occurrences(made.id)) == 0  # the first is 60 s away, beyond 10 s
    # Nobody materialises for 4 min 10 s: minutes 1, 2 and 3 are missed (minute 3 by 70 s,
    # beyond the 60 s misfire grace); minute 4 fell due 10 s ago, inside the grace: it is
    # late, not missed, and runs under every policy.
    env.clock.advance(4 * 60 + 10)
    await env.passes()
    occurrences = await env.occurrences(made.id)
    origins = [o[1] for o in occurrences]
    assert origins.count("CATCHUP") == caught_up
    assert [o[0] for o in occurrences if o[1] == "SCHEDULE"] == [START + timedelta(minutes=4)]
    caught = [o[0] for o in occurrences if o[1] == "CATCHUP"]
    assert caught == [START + timedelta(minutes=m) for m in (1, 2, 3)][3 - caught_up :]
    env.clock.advance(60)
    await env.passes()
    tasks = await env.tasks(made.id)
    assert [t[0] for t in tasks][-1] == START + timedelta(minutes=5)
    assert len(tasks) == caught_up + 2


async def test_overlap_skip_and_buffer_one(env: Env) -> None:
    skip = await env.create(name="skip", every_s=10, overlap=pb.OVERLAP_POLICY_SKIP, timeout_s=60)
    buffer = await env.create(
        name="buffer", every_s=10, overlap=pb.OVERLAP_POLICY_BUFFER_ONE, timeout_s=60
    )
    env.clock.advance(9)  # 1 s before the first: inside the 2 s lead
    await env.passes()
    for made in (skip, buffer):
        assert [o[2] for o in await env.occurrences(made.id)] == [True]
    # Both first occurrences run long.
    await env.sql("UPDATE tasks SET status = 'RUNNING' WHERE schedule_id IS NOT NULL")
    env.clock.advance(10)
    await env.passes()
    assert [o[2] for o in await env.occurrences(skip.id)] == [True, False]  # skipped
    assert [o[2] for o in await env.occurrences(buffer.id)] == [True]  # held back
    env.clock.advance(10)
    await env.passes()
    assert [o[2] for o in await env.occurrences(buffer.id)] == [True, False]  # 3rd dropped
    await env.sql("UPDATE tasks SET status = 'COMPLETED' WHERE schedule_id IS NOT NULL")
    env.clock.advance(1)
    await env.passes()
    runs = await env.occurrences(buffer.id)
    assert [(o[0], o[1]) for o in runs if o[2]] == [
        (START + timedelta(seconds=10), "SCHEDULE"),
        (START + timedelta(seconds=20), "BUFFERED"),
    ]


async def test_update_takes_effect_from_the_next_occurrence(env: Env) -> None:
    made = await env.create(name="tick", every_s=1, payload=b'{"v": 1}')
    await env.passes()
    n = ahead(made)
    assert len(await env.tasks(made.id)) == n
    spec = _spec(name="tick", every_s=1, payload=b'{"v": 2}')
    await env.stub.UpdateSchedule(
        pb.UpdateScheduleRequest(id=made.id, spec=spec), metadata=env.auth
    )
    statuses = [t[2] for t in await env.tasks(made.id)]
    assert statuses == ["CANCELLED"] * n  # none had started
    await env.passes()
    rows = await env.sql(
        "SELECT payload->>'v', count(*) FROM tasks"
        " WHERE schedule_id = %(s)s AND status = 'SCHEDULED' GROUP BY 1",
        {"s": made.id},
    )
    assert rows == [("2", n)]
    # One occurrence row per logical date, each pointing at its live task.
    assert len(await env.occurrences(made.id)) == n


async def test_pause_withdraws_and_resume_does_not_catch_up(env: Env) -> None:
    made = await env.create(name="tick", every_s=1)
    await env.passes()
    paused = await env.stub.PauseSchedule(pb.PauseScheduleRequest(id="tick"), metadata=env.auth)
    assert paused.schedule.paused and not paused.schedule.HasField("next_occurrence")
    assert await env.occurrences(made.id) == []
    env.clock.advance(30)
    await env.passes()
    assert await env.occurrences(made.id) == []
    await env.stub.ResumeSchedule(pb.ResumeScheduleRequest(id="tick"), metadata=env.auth)
    await env.passes()
    dates = [o[0] for o in await env.occurrences(made.id)]
    assert dates[0] == START + timedelta(seconds=31)  # nothing from the pause


async def test_trigger_and_backfill(env: Env) -> None:
    made = await env.create(name="hourly", cron="0 * * * *")
    run = (
        await env.stub.TriggerSchedule(pb.TriggerScheduleRequest(id="hourly"), metadata=env.auth)
    ).run
    assert run.origin == "TRIGGER" and run.logical_date.ToDatetime(tzinfo=UTC) == START
    request = pb.BackfillScheduleRequest(
        id=made.id, start=_ts(START - timedelta(hours=3)), end=_ts(START - timedelta(minutes=1))
    )
    filled = await env.stub.BackfillSchedule(request, metadata=env.auth)
    assert [r.logical_date.ToDatetime(tzinfo=UTC) for r in filled.runs] == [
        START - timedelta(hours=3),
        START - timedelta(hours=2),
        START - timedelta(hours=1),
    ]
    again = await env.stub.BackfillSchedule(request, metadata=env.auth)
    assert (len(again.runs), again.existing) == (0, 3)
    tasks = await env.tasks(made.id)
    assert len(tasks) == 4
    assert all(scheduled == START for _, scheduled, _ in tasks)  # run now, dated then
    assert len(env.listener.submitted) == 4
    too_many = pb.BackfillScheduleRequest(
        id=made.id, start=_ts(START - timedelta(days=60)), end=_ts(START - timedelta(hours=1))
    )
    info = await _refused(
        env.stub.BackfillSchedule(too_many, metadata=env.auth), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert info.field == "end"


async def test_delete_withdraws_what_has_not_started(env: Env) -> None:
    made = await env.create(name="tick", every_s=1)
    await env.passes()
    await env.sql(
        "UPDATE tasks SET status = 'RUNNING' WHERE schedule_id = %(s)s AND logical_date = %(at)s",
        {"s": made.id, "at": START + timedelta(seconds=1)},
    )
    deleted = await env.stub.DeleteSchedule(pb.DeleteScheduleRequest(id="tick"), metadata=env.auth)
    assert deleted.withdrawn == ahead(made) - 1
    statuses = sorted(t[2] for t in await env.tasks(made.id))
    assert statuses == ["CANCELLED"] * (ahead(made) - 1) + ["RUNNING"]
    assert await env.sql("SELECT count(*) FROM schedule_occurrences") == [(0,)]
    await _refused(
        env.stub.GetSchedule(pb.GetScheduleRequest(id=made.id), metadata=env.auth),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_retention_drops_old_occurrence_records(env: Env) -> None:
    made = await env.create(name="tick", every_s=1)
    await env.passes()
    await env.sql(
        "UPDATE schedule_occurrences SET created_at = now() - interval '31 days'"
        " WHERE logical_date <= %(at)s",
        {"at": START + timedelta(seconds=4)},
    )
    await asyncio.to_thread(detach_old_partitions, env.dsn, 30)
    dates = [o[0] for o in await env.occurrences(made.id)]
    assert dates == [START + timedelta(seconds=k) for k in range(5, ahead(made) + 1)]


async def test_the_watch_defaults_make_room_for_jitter_and_get_starts_at_start(env: Env) -> None:
    jittered = task_service_pb2.SubmitTaskRequest(type="report", jitter_window=_dur(100))
    made = await env.create(
        name="spread", cron="0 * * * *", template=jittered, start_at=START + timedelta(days=1)
    )
    # Symmetric jitter starts up to half the window late: 60 s + 50 s.
    assert made.spec.watch.tolerance.seconds == 110
    strict = await env.create(name="strict", cron="0 * * * *")
    assert strict.spec.watch.tolerance.seconds == 60
    got = await env.stub.GetSchedule(pb.GetScheduleRequest(id="spread"), metadata=env.auth)
    first = got.next_occurrences[0].ToDatetime(tzinfo=UTC)
    assert first == START + timedelta(days=1)


# --- schedules that start a workflow per occurrence ---------------------------------------


def _workflow_spec(
    name: str = "pipeline", *, timeout_s: float | None = 60, **rule: Any
) -> pb.ScheduleSpec:
    """A schedule whose occurrences each create a diamond (fetch, then invoice and
    credit in parallel, then summary)."""
    spec = _spec(name=name, **rule)
    spec.ClearField("task_template")
    refs = ["fetch", "invoice", "credit", "summary"]
    for ref in refs:
        task = spec.workflow_template.tasks.add(ref=ref)
        task.task.type = f"step.{ref}"
        task.task.strict_timing = True
        if timeout_s is not None:
            task.task.timeout.CopyFrom(_dur(timeout_s))
    for parent, child in [
        ("fetch", "invoice"),
        ("fetch", "credit"),
        ("invoice", "summary"),
        ("credit", "summary"),
    ]:
        spec.workflow_template.edges.add(parent=parent, child=child)
    return spec


async def _create_spec(env: Env, spec: pb.ScheduleSpec) -> pb.Schedule:
    made = await env.stub.CreateSchedule(pb.CreateScheduleRequest(spec=spec), metadata=env.auth)
    return made.schedule


async def _runs_of(env: Env, schedule_id: str) -> list[tuple[datetime, Any]]:
    """(logical date, workflow id or None) of every occurrence, in order."""
    rows = await env.sql(
        "SELECT logical_date, workflow_id FROM schedule_occurrences WHERE schedule_id = %(s)s"
        " ORDER BY logical_date",
        {"s": schedule_id},
    )
    return [(r[0], r[1]) for r in rows]


async def test_a_workflow_schedule_creates_one_run_per_occurrence_dated_on_every_task(
    env: Env,
) -> None:
    made = await _create_spec(env, _workflow_spec(every_s=10))
    assert made.spec.HasField("workflow_template") and not made.spec.HasField("task_template")
    # The watch's default expected duration: the longest chain's timeouts (3 x 60 s).
    assert made.spec.watch.expected_duration.ToTimedelta() == timedelta(seconds=180)
    env.clock.advance(9)
    await env.passes()
    created = await _runs_of(env, made.id)
    (logical_date, run_id) = created[0]
    assert logical_date == START + timedelta(seconds=10)
    assert all(run is not None for _, run in created)
    runs = await env.sql(
        "SELECT name, schedule_id, logical_date, job_id, state, task_count FROM workflow_runs"
        " WHERE id = %(w)s",
        {"w": run_id},
    )
    assert runs == [("pipeline", uuid.UUID(made.id), logical_date, "pipeline", "RUNNING", 4)]
    assert await env.sql("SELECT count(*) FROM workflow_runs") == [(len(created),)]
    tasks = await env.sql(
        "SELECT t.type, t.unresolved_dependencies, t.logical_date, t.schedule_id"
        " FROM tasks t JOIN workflow_tasks w ON w.task_id = t.id"
        " WHERE t.workflow_id = %(w)s ORDER BY w.position",
        {"w": run_id},
    )
    assert [(t[0], t[1]) for t in tasks] == [
        ("step.fetch", 0),
        ("step.invoice", 1),
        ("step.credit", 1),
        ("step.summary", 2),
    ]
    assert {(t[2], t[3]) for t in tasks} == {(logical_date, uuid.UUID(made.id))}
    # Only the roots are routed; each occurrence shows as its run.
    assert [t.type for t in env.created] == ["step.fetch"] * len(created)
    got = await env.stub.GetSchedule(pb.GetScheduleRequest(id=made.id), metadata=env.auth)
    run = got.runs[-1]  # newest first
    assert run.workflow_id == str(run_id) and run.task_id == ""
    assert run.status == common_pb2.TASK_STATUS_RUNNING


async def test_a_workflow_schedule_skips_while_the_previous_run_runs(env: Env) -> None:
    made = await _create_spec(env, _workflow_spec(every_s=10, overlap=pb.OVERLAP_POLICY_SKIP))
    env.clock.advance(9)
    await env.passes()
    env.clock.advance(10)
    await env.passes()
    assert [run is not None for _, run in await _runs_of(env, made.id)] == [True, False]
    # The first run finishes (its tasks complete; the run's last settlement sets it).
    [(_, run_id), _] = await _runs_of(env, made.id)
    await env.sql("UPDATE tasks SET status = 'COMPLETED' WHERE workflow_id = %(w)s", {"w": run_id})
    async with env.store.transaction() as conn:
        await finish_runs(conn, [run_id])
    # A run that succeeded completes the schedule's job in the ledger, under its own id.
    assert await env.sql("SELECT job_id, task_id FROM task_completions") == [("pipeline", run_id)]
    env.clock.advance(10)
    await env.passes()
    assert [run is not None for _, run in await _runs_of(env, made.id)] == [True, False, True]


async def test_an_update_withdraws_runs_not_started_and_keeps_a_started_one(env: Env) -> None:
    made = await _create_spec(env, _workflow_spec(every_s=1))
    await env.passes()
    created = await _runs_of(env, made.id)
    assert len(created) == ahead(made)
    started = created[0][1]
    await env.sql(
        "UPDATE tasks SET status = 'RUNNING' WHERE workflow_id = %(w)s"
        " AND unresolved_dependencies = 0",
        {"w": started},
    )
    await env.stub.UpdateSchedule(
        pb.UpdateScheduleRequest(id=made.id, spec=_workflow_spec(every_s=1)), metadata=env.auth
    )
    states = dict(await env.sql("SELECT id, state FROM workflow_runs"))
    assert states.pop(started) == "RUNNING"
    assert set(states.values()) == {"CANCELLED"} and len(states) == ahead(made) - 1
    waiting = await env.sql(
        "SELECT DISTINCT status FROM tasks WHERE workflow_id <> %(w)s", {"w": started}
    )
    assert waiting == [("CANCELLED",)]  # withdrawn: never UPSTREAM_FAILED
    await env.passes()
    again = await _runs_of(env, made.id)
    assert again[0][1] == started and all(run is not None for _, run in again)


async def test_trigger_of_a_workflow_schedule_answers_with_its_run(env: Env) -> None:
    made = await _create_spec(env, _workflow_spec(cron="0 * * * *"))
    run = (
        await env.stub.TriggerSchedule(pb.TriggerScheduleRequest(id=made.id), metadata=env.auth)
    ).run
    assert run.origin == "TRIGGER" and run.workflow_id and run.task_id == ""
    assert await env.sql(
        "SELECT logical_date FROM workflow_runs WHERE id = %(w)s", {"w": run.workflow_id}
    ) == [(START,)]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s.task_template.CopyFrom(task_service_pb2.SubmitTaskRequest(type="t")),
         "spec.workflow_template"),
        (lambda s: s.workflow_template.edges.add(parent="summary", child="fetch"),
         "spec.workflow_template.edges"),
        (lambda s: setattr(s.workflow_template, "job_id", "mine"),
         "spec.workflow_template.job_id"),
        (lambda s: s.workflow_template.delay.FromTimedelta(timedelta(seconds=1)),
         "spec.workflow_template.delay"),
    ],
)  # fmt: skip
async def test_a_bad_workflow_template_names_its_field(env: Env, change: Any, field: str) -> None:
    spec = _workflow_spec(every_s=10)
    change(spec)
    info = await _refused(
        env.stub.CreateSchedule(pb.CreateScheduleRequest(spec=spec), metadata=env.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == field, info
    assert await env.sql("SELECT count(*) FROM schedules") == [(0,)]


async def test_skip_needs_a_timeout_on_every_task_of_the_workflow(env: Env) -> None:
    spec = _workflow_spec(every_s=10, timeout_s=None, overlap=pb.OVERLAP_POLICY_SKIP)
    info = await _refused(
        env.stub.CreateSchedule(pb.CreateScheduleRequest(spec=spec), metadata=env.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "spec.workflow_template.tasks[0].task.timeout"
