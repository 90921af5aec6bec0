"""What a task listing asks for: the filters of ``ListTasks`` and the cursor of a page.

Plain values built by the wire (:mod:`chronoshard.scheduler.api.convert`, which also
encodes the cursor as a page token) and read by the statements
(:mod:`chronoshard.scheduler.store.tasks`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from chronoshard.scheduler.core.states import TaskStatus


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """ListTasks filters; an empty tuple or None means "any". Ranges are half-open."""

    statuses: tuple[TaskStatus, ...] = ()
    type: str | None = None
    queue: str | None = None
    job_id: str | None = None
    scheduled_from: datetime | None = None
    scheduled_before: datetime | None = None
    due_from: datetime | None = None
    due_before: datetime | None = None


@dataclass(frozen=True, slots=True)
class PageCursor:
    """The last row of a page: the next page starts strictly after it."""

    scheduled_at: datetime
    id: uuid.UUID
