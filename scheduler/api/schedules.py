"""The ``ScheduleService`` servicer: recurring schedules (docs/architecture.md#d13).

The same three steps as every servicer: the caller's tenant from its API key, the whole
request validated by :mod:`.schedule_requests` before anything is written, then one
transaction in :class:`~chronoshard.scheduler.store.schedules.ScheduleStore`, run as the
caller's tenant (:meth:`~chronoshard.scheduler.store.database.Store.tenant_transaction`:
row-level security admits that tenant's rows only). This node creates no occurrence on a
schedule's behalf: that is the materialiser's, on the owner of the schedule's shard. A
call that changes when a schedule next runs (create, update, resume) tells the node
(:class:`ScheduleListener`), which wakes its materialiser when it owns the shard; another
owner finds the change within ``schedules.interval_s``.
Occurrences an explicit call creates (trigger, backfill) are submitted here, through the
submit path's insert, and routed like any submit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc

from chronoshard import wire
from chronoshard.clock import Clock, SystemClock
from chronoshard.scheduler.api import boundary, convert, schedule_requests
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.schedule_requests import Occurrence
from chronoshard.scheduler.api.task_requests import SubmitLimits
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.models import Task, Tenant
from chronoshard.scheduler.core.recurrence import Catchup
from chronoshard.scheduler.core.schedules import (
    Origin,
    Overlap,
    Pacing,
    Schedule,
    ScheduleSpec,
    backfill_dates,
    first_instants,
    restart,
    rule_of,
    upcoming,
)
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.errors import InvalidArgument, ScheduleExists, ScheduleNotFound
from chronoshard.scheduler.store.database import Connection, Store
from chronoshard.scheduler.store.schedules import ScheduleRun, ScheduleStore
from chronoshard.scheduler.store.submits import SubmitStore
from chronoshard.v1 import schedule_service_pb2 as pb
from chronoshard.v1 import schedule_service_pb2_grpc

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class ScheduleListener(Protocol):
    """What the node hears from the ScheduleService, after each commit."""

    def schedule_changed(self, schedule: Schedule) -> None:
        """``schedule`` changed: its ``materialise_at`` may come before the next pass."""
        ...

    def tasks_submitted(self, tasks: Sequence[Task]) -> None:
        """Occurrence tasks created by a trigger or a backfill (routed like submits)."""
        ...


class _NoListener:
    def schedule_changed(self, schedule: Schedule) -> None:
        pass

    def tasks_submitted(self, tasks: Sequence[Task]) -> None:
        pass


def pacing_of(config: SchedulerConfig) -> Pacing:
    """The materialiser's pacing, from ``[schedules]``."""
    s = config.schedules
    return Pacing(
        lookahead=timedelta(seconds=s.lookahead_s),
        overlap_lead=timedelta(seconds=s.overlap_lead_s),
        buffer_poll=timedelta(seconds=s.buffer_poll_s),
        max_create=s.max_create,
    )


class ScheduleServiceServicer(schedule_service_pb2_grpc.ScheduleServiceServicer):
    """The ``chronoshard.v1.ScheduleService`` implementation (see ``docs/api.md``)."""

    def __init__(
        self,
        *,
        config: SchedulerConfig,
        store: Store,
        authenticator: Authenticator,
        listener: ScheduleListener | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._store = store
        self._schedules = ScheduleStore(store, SubmitStore(store))
        self._auth = authenticator
        self._listener: ScheduleListener = listener or _NoListener()
        self._clock = clock or SystemClock()
        self._limits = SubmitLimits.from_config(config)
        self._build_task = schedule_requests.occurrence_builder(self._limits)
        self._pacing = pacing_of(config)
        self._shard_count = config.scheduling.shard_count
        self._max_page_size = config.limits.max_list_page_size

    # --- the RPCs -------------------------------------------------------------------------

    async def CreateSchedule(
        self, request: pb.CreateScheduleRequest, context: Context
    ) -> pb.CreateScheduleResponse:
        return await self._serve("CreateSchedule", self._create, request, context)

    async def GetSchedule(
        self, request: pb.GetScheduleRequest, context: Context
    ) -> pb.GetScheduleResponse:
        return await self._serve("GetSchedule", self._get, request, context)

    async def ListSchedules(
        self, request: pb.ListSchedulesRequest, context: Context
    ) -> pb.ListSchedulesResponse:
        return await self._serve("ListSchedules", self._list, request, context)

    async def UpdateSchedule(
        self, request: pb.UpdateScheduleRequest, context: Context
    ) -> pb.UpdateScheduleResponse:
        return await self._serve("UpdateSchedule", self._update, request, context)

    async def PauseSchedule(
        self, request: pb.PauseScheduleRequest, context: Context
    ) -> pb.PauseScheduleResponse:
        return await self._serve("PauseSchedule", self._pause, request, context)

    async def ResumeSchedule(
        self, request: pb.ResumeScheduleRequest, context: Context
    ) -> pb.ResumeScheduleResponse:
        return await self._serve("ResumeSchedule", self._resume, request, context)

    async def DeleteSchedule(
        self, request: pb.DeleteScheduleRequest, context: Context
    ) -> pb.DeleteScheduleResponse:
        return await self._serve("DeleteSchedule", self._delete, request, context)

    async def TriggerSchedule(
        self, request: pb.TriggerScheduleRequest, context: Context
    ) -> pb.TriggerScheduleResponse:
        return await self._serve("TriggerSchedule", self._trigger, request, context)

    async def BackfillSchedule(
        self, request: pb.BackfillScheduleRequest, context: Context
    ) -> pb.BackfillScheduleResponse:
        return await self._serve("BackfillSchedule", self._backfill, request, context)

    async def _serve(
        self,
        method: str,
        handler: Callable[[Tenant, _Req], Awaitable[_Resp]],
        request: _Req,
        context: Context,
    ) -> _Resp:
        return await boundary.serve_tenant(
            f"ScheduleService.{method}", context, self._auth, lambda t: handler(t, request)
        )

    # --- handlers -------------------------------------------------------------------------

    async def _create(
        self, tenant: Tenant, request: pb.CreateScheduleRequest
    ) -> pb.CreateScheduleResponse:
        now = self._clock.now()
        spec = self._spec(tenant, request.spec, now)
        schedule_id = new_task_id()
        anchor_at = spec.start_at or now
        cursor_at, next_at, materialise_at = first_instants(
            schedule_id, spec, rule_of(spec, anchor_at, now), now, self._pacing
        )
        shard = shard_of(schedule_id, self._shard_count)
        created = await self._schedules.insert(
            {
                "id": schedule_id,
                "tenant_id": tenant.id,
                "shard": shard,
                "anchor_at": anchor_at,
                "cursor_at": cursor_at,
                "next_at": next_at,
                "materialise_at": materialise_at,
            },
            spec,
        )
        if created is None:
            raise ScheduleExists(spec.name)
        self._listener.schedule_changed(created)
        return pb.CreateScheduleResponse(schedule=schedule_to_pb(created))

    async def _get(self, tenant: Tenant, request: pb.GetScheduleRequest) -> pb.GetScheduleResponse:
        next_count = schedule_requests.count_from_pb(
            request.next_count, "next_count", schedule_requests.DEFAULT_NEXT
        )
        runs_count = schedule_requests.count_from_pb(
            request.runs_count, "runs_count", schedule_requests.DEFAULT_RUNS
        )
        schedule = await self._found(tenant, request.id)
        now = self._clock.now()
        rule = rule_of(schedule.spec, schedule.anchor_at, now)
        # From now (those created ahead included), and never before the start.
        after = now
        if schedule.spec.start_at is not None:
            after = max(after, schedule.spec.start_at - timedelta(microseconds=1))
        nexts = upcoming(rule, after, schedule.spec.end_at, next_count)
        runs = await self._schedules.runs(tenant.id, schedule.id, runs_count)
        return pb.GetScheduleResponse(
            schedule=schedule_to_pb(schedule),
            next_occurrences=[convert.ts_to_pb(at) for at in nexts],
            runs=[run_to_pb(r) for r in runs],
        )

    async def _list(
        self, tenant: Tenant, request: pb.ListSchedulesRequest
    ) -> pb.ListSchedulesResponse:
        size = request.page_size or 100
        if size > self._max_page_size:
            raise InvalidArgument("page_size", f"must be at most {self._max_page_size}")
        after = convert.name_page_token_from_pb(request.page_token) or None
        found = await self._schedules.page(tenant.id, after, size + 1)
        response = pb.ListSchedulesResponse(schedules=[schedule_to_pb(s) for s in found[:size]])
        if len(found) > size:
            response.next_page_token = convert.name_page_token_to_pb(found[size - 1].spec.name)
        return response

    async def _update(
        self, tenant: Tenant, request: pb.UpdateScheduleRequest
    ) -> pb.UpdateScheduleResponse:
        now = self._clock.now()
        spec = self._spec(tenant, request.spec, now)
        async with self._store.tenant_transaction(tenant.id) as conn:
            old = await self._locked(conn, tenant, request.id)
            cursor = await self._withdrawn_cursor(conn, old, now)
            anchor_at = spec.start_at or old.anchor_at
            if spec.start_at is not None:
                cursor = max(cursor, spec.start_at - timedelta(microseconds=1))
            cursor_at, next_at, materialise_at = restart(
                old.id, spec, rule_of(spec, anchor_at, now), cursor, now, self._pacing
            )
            updated = await self._schedules.update_spec(
                conn,
                old.id,
                spec,
                {
                    "anchor_at": anchor_at,
                    "cursor_at": cursor_at,
                    "next_at": next_at,
                    "materialise_at": materialise_at,
                },
            )
            if updated is None:
                raise ScheduleExists(spec.name)
        self._listener.schedule_changed(updated)
        return pb.UpdateScheduleResponse(schedule=schedule_to_pb(updated))

    async def _pause(
        self, tenant: Tenant, request: pb.PauseScheduleRequest
    ) -> pb.PauseScheduleResponse:
        now = self._clock.now()
        async with self._store.tenant_transaction(tenant.id) as conn:
            schedule = await self._locked(conn, tenant, request.id)
            if not schedule.paused:
                cursor = await self._withdrawn_cursor(conn, schedule, now)
                schedule = await self._set_paused(conn, schedule, cursor, now, paused=True)
        return pb.PauseScheduleResponse(schedule=schedule_to_pb(schedule))

    async def _resume(
        self, tenant: Tenant, request: pb.ResumeScheduleRequest
    ) -> pb.ResumeScheduleResponse:
        now = self._clock.now()
        async with self._store.tenant_transaction(tenant.id) as conn:
            schedule = await self._locked(conn, tenant, request.id)
            if schedule.paused:
                # From now: what fell in the pause is not caught up.
                cursor = max(now, schedule.cursor_at)
                schedule = await self._set_paused(conn, schedule, cursor, now, paused=False)
        self._listener.schedule_changed(schedule)
        return pb.ResumeScheduleResponse(schedule=schedule_to_pb(schedule))

    async def _delete(
        self, tenant: Tenant, request: pb.DeleteScheduleRequest
    ) -> pb.DeleteScheduleResponse:
        now = self._clock.now()
        async with self._store.tenant_transaction(tenant.id) as conn:
            schedule = await self._locked(conn, tenant, request.id)
            withdrawn, _ = await self._schedules.withdraw_ahead(conn, schedule.id, now)
            await self._schedules.delete(conn, schedule.id)
        return pb.DeleteScheduleResponse(withdrawn=len(withdrawn))

    async def _trigger(
        self, tenant: Tenant, request: pb.TriggerScheduleRequest
    ) -> pb.TriggerScheduleResponse:
        schedule = await self._found(tenant, request.id)
        now = self._clock.now()
        prepared = self._occurrence(schedule, now, now)
        async with self._store.tenant_transaction(tenant.id) as conn:
            runs, due = await self._schedules.insert_runs(
                conn, tenant.id, schedule.id, [(now, Origin.TRIGGER, prepared)]
            )
        if not runs:
            # Another run holds this very microsecond: the schedule ran at it already.
            raise InvalidArgument("id", "an occurrence at this instant exists; try again")
        self._listener.tasks_submitted(due)
        return pb.TriggerScheduleResponse(run=run_to_pb(runs[0]))

    async def _backfill(
        self, tenant: Tenant, request: pb.BackfillScheduleRequest
    ) -> pb.BackfillScheduleResponse:
        now = self._clock.now()
        start, end = schedule_requests.backfill_range_from_pb(request, now)
        schedule = await self._found(tenant, request.id)
        rule = rule_of(schedule.spec, schedule.anchor_at, now)
        limit = schedule_requests.MAX_BACKFILL
        dates = backfill_dates(rule, start, end, limit)
        if len(dates) > limit:
            raise InvalidArgument(
                "end", f"the range holds more than {limit} occurrences: split it into parts"
            )
        if not dates:
            return pb.BackfillScheduleResponse()
        runs = [(at, Origin.BACKFILL, self._occurrence(schedule, at, now)) for at in dates]
        async with self._store.tenant_transaction(tenant.id) as conn:
            created, due = await self._schedules.insert_runs(conn, tenant.id, schedule.id, runs)
        self._listener.tasks_submitted(due)
        return pb.BackfillScheduleResponse(
            runs=[run_to_pb(run) for run in created], existing=len(dates) - len(created)
        )

    # --- shared steps ---------------------------------------------------------------------

    def _spec(self, tenant: Tenant, spec: pb.ScheduleSpec, now: datetime) -> ScheduleSpec:
        return schedule_requests.spec_from_pb(
            spec, tenant_id=tenant.id, now=now, limits=self._limits
        )

    def _occurrence(self, schedule: Schedule, logical_date: datetime, now: datetime) -> Occurrence:
        """The task (or run) of an explicit run: now, with the occurrence's logical date."""
        return self._build_task(schedule, logical_date, now, now)

    async def _found(self, tenant: Tenant, name_or_id: str) -> Schedule:
        schedule = await self._schedules.get(tenant.id, _name_or_id(name_or_id))
        if schedule is None:
            raise ScheduleNotFound(name_or_id)
        return schedule

    async def _locked(self, conn: Connection, tenant: Tenant, name_or_id: str) -> Schedule:
        schedule = await self._schedules.lock(conn, tenant.id, _name_or_id(name_or_id))
        if schedule is None:
            raise ScheduleNotFound(name_or_id)
        return schedule

    async def _withdrawn_cursor(
        self, conn: Connection, schedule: Schedule, now: datetime
    ) -> datetime:
        """Withdraw what was created ahead; the cursor the schedule restarts from: now,
        or the newest occurrence left (one that started keeps its place)."""
        _, newest = await self._schedules.withdraw_ahead(conn, schedule.id, now)
        return now if newest is None else max(now, newest)

    async def _set_paused(
        self, conn: Connection, schedule: Schedule, cursor: datetime, now: datetime, *, paused: bool
    ) -> Schedule:
        rule = rule_of(schedule.spec, schedule.anchor_at, now)
        cursor_at, next_at, materialise_at = restart(
            schedule.id, schedule.spec, rule, cursor, now, self._pacing
        )
        return await self._schedules.set_paused(
            conn,
            schedule.id,
            {
                "paused": paused,
                "cursor_at": cursor_at,
                "next_at": next_at,
                "materialise_at": materialise_at,
            },
        )


def _name_or_id(value: str) -> str:
    if value == "":
        raise InvalidArgument("id", "is required (the schedule's id or name)")
    if len(value) > schedule_requests.MAX_NAME_CHARS:
        raise InvalidArgument(
            "id", f"must be at most {schedule_requests.MAX_NAME_CHARS} characters"
        )
    return value


# --- conversions ------------------------------------------------------------------------

_CATCHUP_TO_PB = {
    Catchup.SKIP: pb.CATCHUP_POLICY_SKIP,
    Catchup.LATEST: pb.CATCHUP_POLICY_LATEST,
    Catchup.ALL: pb.CATCHUP_POLICY_ALL,
}
_OVERLAP_TO_PB = {
    Overlap.ALLOW: pb.OVERLAP_POLICY_ALLOW,
    Overlap.SKIP: pb.OVERLAP_POLICY_SKIP,
    Overlap.BUFFER_ONE: pb.OVERLAP_POLICY_BUFFER_ONE,
}


def spec_to_pb(spec: ScheduleSpec) -> pb.ScheduleSpec:
    out = pb.ScheduleSpec(
        name=spec.name,
        timezone=spec.timezone,
        catchup_policy=_CATCHUP_TO_PB[spec.catchup],
        catchup_limit=spec.catchup_limit,
        overlap_policy=_OVERLAP_TO_PB[spec.overlap],
        job_id=spec.job_id,
        watch=pb.ScheduleWatch(
            disabled=not spec.watch,
            expected_duration=wire.duration_to_pb(spec.expected_duration_s),
            tolerance=wire.duration_to_pb(spec.tolerance_s),
            severity=spec.severity,
        ),
        misfire_grace=wire.duration_to_pb(spec.misfire_grace_s),
    )
    if spec.creates_workflow:
        out.workflow_template.CopyFrom(schedule_requests.workflow_template_to_pb(spec))
    else:
        out.task_template.CopyFrom(schedule_requests.template_to_pb(spec))
    if spec.cron is not None:
        out.cron = spec.cron
    elif spec.interval_s is not None:
        out.interval.CopyFrom(wire.duration_to_pb(spec.interval_s))
    if spec.start_at is not None:
        out.start_at.CopyFrom(convert.ts_to_pb(spec.start_at))
    if spec.end_at is not None:
        out.end_at.CopyFrom(convert.ts_to_pb(spec.end_at))
    return out


def schedule_to_pb(schedule: Schedule) -> pb.Schedule:
    out = pb.Schedule(
        id=str(schedule.id),
        tenant_id=str(schedule.tenant_id),
        spec=spec_to_pb(schedule.spec),
        paused=schedule.paused,
        created_at=convert.ts_to_pb(schedule.created_at),
        updated_at=convert.ts_to_pb(schedule.updated_at),
    )
    if schedule.next_at is not None and not schedule.paused:
        out.next_occurrence.CopyFrom(convert.ts_to_pb(schedule.next_at))
    return out


def run_to_pb(run: ScheduleRun) -> pb.ScheduleRun:
    out = pb.ScheduleRun(
        logical_date=convert.ts_to_pb(run.logical_date),
        origin=str(run.origin),
        task_id="" if run.task_id is None else str(run.task_id),
        workflow_id="" if run.workflow_id is None else str(run.workflow_id),
    )
    if run.status is not None:
        out.status = convert.status_to_pb(run.status)  # type: ignore[assignment]
    if run.finished_at is not None:
        out.finished_at.CopyFrom(convert.ts_to_pb(run.finished_at))
    return out
