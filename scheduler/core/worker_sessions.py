"""The cluster's worker sessions as ``AdminService.ListWorkerSessions`` lists them: pure.

A worker holds one stream with every node, and each node knows only its own. Each node
records its streams in ``worker_sessions`` (:mod:`chronoshard.scheduler.cluster.liveness`)
every ``workers.session_timeout_s / 3``, and at once when one opens or closes; with
migration 0016 a record says what the stream is (a :class:`SessionReport`), so any node
can list the whole cluster's from PostgreSQL. The figures that change all the time
(credits, tasks running) are as of each node's last refresh, so the answering node puts
its own live figures over its own rows (:func:`with_live_figures`).

Whose session it is: the tenant whose API key (or client certificate) opened the
stream. Workers serve every tenant's tasks (docs/architecture.md, Decisions), so this
says whose worker it is, not whose tasks it runs. :class:`SessionOwners` keeps it per
stream on the node, since the stream's own record (the dispatch path's
``WorkerSession``) has no place for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from chronoshard.clock import Clock

MAX_SESSION_PAGE_SIZE = 1000
DEFAULT_SESSION_PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class SessionReport:
    """One of a node's worker streams, as the node records it."""

    worker_id: str
    session_id: str
    tenant_id: uuid.UUID | None
    """Whose key opened the stream; None when the node could not tell (or an old row)."""
    queues: tuple[str, ...]
    task_types: tuple[str, ...]
    slots: int
    credits: int
    """Credits the worker granted the node that the node has not used."""
    running: int
    """Tasks the node sent on the stream that the worker has not settled."""
    draining: bool
    connected_at: datetime | None


@dataclass(frozen=True, slots=True)
class ListedSession:
    """A session as the API lists it: a node's report of it, and as of when."""

    node_id: str
    report: SessionReport
    tenant_name: str
    reported_at: datetime


@dataclass(frozen=True, slots=True)
class SessionQuery:
    """Which sessions a caller asks for, a page of them at a time, ordered by worker id
    then node id. ``tenant_id`` None lists every tenant's (an operator's key)."""

    tenant_id: uuid.UUID | None
    worker_id: str | None
    node_id: str | None
    after: tuple[str, str] | None
    """The (worker id, node id) the previous page ended with."""
    limit: int


class LiveSession(Protocol):
    """What a node's live stream tells (the dispatch path's ``WorkerSession``)."""

    @property
    def worker_id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def queues(self) -> Collection[str]: ...
    @property
    def types(self) -> Collection[str]: ...
    @property
    def slots(self) -> int: ...
    @property
    def credits(self) -> int: ...
    @property
    def draining(self) -> bool: ...
    @property
    def assigned(self) -> Sized: ...
    @property
    def opened_at(self) -> float: ...


class LiveSessions(Protocol):
    """The node's session registry (the dispatch path's ``SessionRegistry``)."""

    def live(self) -> Sequence[LiveSession]: ...


class SessionOwners:
    """Which tenant's key opened each of the node's streams, by session id."""

    def __init__(self) -> None:
        self._tenant_of: dict[str, uuid.UUID | None] = {}

    def opened(self, session_id: str, tenant_id: uuid.UUID | None) -> None:
        self._tenant_of[session_id] = tenant_id

    def closed(self, session_id: str) -> None:
        self._tenant_of.pop(session_id, None)

    def tenant_of(self, session_id: str) -> uuid.UUID | None:
        return self._tenant_of.get(session_id)

    def __len__(self) -> int:
        return len(self._tenant_of)


def describe(
    session: LiveSession, tenant_id: uuid.UUID | None, now: datetime, monotonic_now: float
) -> SessionReport:
    """``session`` as its node records it. The stream's opening was taken on the node's
    monotonic clock; ``now`` and ``monotonic_now`` (read together) place it on the
    cluster clock."""
    return SessionReport(
        worker_id=session.worker_id,
        session_id=session.session_id,
        tenant_id=tenant_id,
        queues=tuple(sorted(session.queues)),
        task_types=tuple(sorted(session.types)),
        slots=session.slots,
        credits=session.credits,
        running=len(session.assigned),
        draining=session.draining,
        connected_at=now - timedelta(seconds=max(monotonic_now - session.opened_at, 0.0)),
    )


def describe_all(
    sessions: Iterable[LiveSession], owners: SessionOwners, now: datetime, monotonic_now: float
) -> list[SessionReport]:
    """Every live stream of the node, by worker id."""
    reports = [describe(s, owners.tenant_of(s.session_id), now, monotonic_now) for s in sessions]
    return sorted(reports, key=lambda r: r.worker_id)


class DescribedSessions:
    """The node's live sessions described, as of the clock's now: what the liveness loop
    records and what the node's own answer to ``ListWorkerSessions`` shows live."""

    def __init__(self, registry: LiveSessions, owners: SessionOwners, clock: Clock) -> None:
        self._registry = registry
        self._owners = owners
        self._clock = clock

    def reports(self) -> list[SessionReport]:
        return describe_all(
            self._registry.live(), self._owners, self._clock.now(), self._clock.monotonic()
        )


def with_live_figures(
    listed: Iterable[ListedSession],
    node_id: str,
    live: Mapping[str, SessionReport],
    now: datetime,
) -> list[ListedSession]:
    """``listed`` with the rows of ``node_id`` (the answering node) carrying the figures
    of its live streams (``live``, by session id) as of ``now`` instead of its last
    record's. A row whose stream is not live any more keeps its record: it closed since,
    or the record was written by the node's previous run."""
    answered = []
    for row in listed:
        fresh = live.get(row.report.session_id) if row.node_id == node_id else None
        if fresh is not None and fresh.worker_id == row.report.worker_id:
            # The recorded tenant stays: the statement selected the row by it.
            report = replace(fresh, tenant_id=row.report.tenant_id)
            row = replace(row, report=report, reported_at=now)
        answered.append(row)
    return answered
