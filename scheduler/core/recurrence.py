"""When a recurring schedule fires: cron in an IANA zone, or a fixed interval; I/O-free.

The field math (which wall-clock times a cron expression names: ranges, steps, names,
``L``, ``#``, ``@daily``-style aliases, a leading seconds field) is croniter's, asked
only about naive wall-clock times. Mapping wall-clock times to instants is ours, done
with zoneinfo and defined here for daylight-saving changes (docs/architecture.md#d13):

* **A schedule whose hour field is every hour** (``*/15 * * * *``, ``@hourly``) follows
  elapsed time: it fires at every instant whose wall-clock time matches. In a repeated
  hour both passes fire (each its own occurrence, at its own instant), and the wall
  times of a skipped hour do not exist, so none fire: the schedule never falls silent
  for an hour and never bunches up.
* **A schedule that names its hours** (``30 2 * * *``) follows the wall clock: each wall
  time it names fires exactly once. One in a repeated hour fires at its first pass; one
  in a skipped hour fires at the first valid instant after it, the change itself (several
  such wall times of one change are one occurrence).

An occurrence's **logical date** is the instant it fires, in UTC: unique per schedule, so
``(schedule_id, logical_date)`` identifies it. A fixed interval ignores zones: the
occurrences are ``anchor + k * every``.

Offsets come from the zone's transitions, which are found by sampling the zone's UTC
offset every :data:`TRANSITION_SAMPLE` and bisecting each change to the second, per zone
and year, cached. Two changes less than :data:`TRANSITION_SAMPLE` apart would be missed;
the tz database has none since 1970 in any zone.
"""

from __future__ import annotations

import functools
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from chronoshard.scheduler.errors import InvalidArgument

MIN_INTERVAL = timedelta(seconds=1)
"""The smallest interval, and the finest cron (a seconds field of ``*``)."""
MAX_CRON_LENGTH = 200
TRANSITION_SAMPLE = timedelta(hours=6)
NEVER_AFTER_YEARS = 50
"""A cron with no occurrence within this many years of now is refused (``0 0 30 2 *``)."""

_ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
# croniter extensions we do not document and so do not accept: hashed (H) and random (R)
# fields, which would make a schedule's times depend on something other than its text.
_EXTENSION = re.compile(r"(^|[,/\-(])[HhRr](?=$|[,/\-(])")
_ONE_SECOND = timedelta(seconds=1)
_ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of a zone's UTC offset at ``at``: a gap when it grows, a fold when it shrinks."""

    at: datetime
    offset_before: timedelta
    offset_after: timedelta


class Recurrence(ABC):
    """When a schedule fires, as UTC instants."""

    __slots__ = ()  # so the subclasses' slots are real (an ABC without them adds a __dict__)

    @abstractmethod
    def next_after(self, after: datetime) -> datetime | None:
        """The first occurrence strictly after ``after`` (aware), or None if there is none."""

    def between(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """Occurrences in ``(after, until]``, at most ``limit``, in order."""
        found: list[datetime] = []
        at = self.next_after(after)
        while at is not None and at <= until and len(found) < limit:
            found.append(at)
            at = self.next_after(at)
        return found


@dataclass(frozen=True, slots=True)
class Interval(Recurrence):
    """Every ``every`` from ``anchor``: elapsed time, no zone."""

    anchor: datetime
    every: timedelta

    def __post_init__(self) -> None:
        if self.every < MIN_INTERVAL:
            raise InvalidArgument(
                "interval", f"must be at least {MIN_INTERVAL.total_seconds():g} s"
            )
        if self.anchor.tzinfo is None:
            raise InvalidArgument("start_at", "must carry a zone")

    def next_after(self, after: datetime) -> datetime | None:
        if after < self.anchor:
            return self.anchor.astimezone(UTC)
        steps = (after - self.anchor) // self.every + 1
        return (self.anchor + steps * self.every).astimezone(UTC)


class Cron(Recurrence):
    """A cron expression (5 fields, or 6 with seconds first) in an IANA zone."""

    __slots__ = ("_every_hour", "_fields", "_iter", "_seconds", "expression", "zone")

    def __init__(self, expression: str, zone: str, *, now: datetime) -> None:
        self.expression = expression
        self.zone = zone_named(zone)
        self._fields, self._seconds = _parse(expression)
        # Parsed once and moved to each start (set_current): building a croniter is most
        # of what a lookup costs (~120 us against ~24 us; issue 15's 10,000-schedule bench
        # spent 60 % of a materialiser step there). Not shared across threads.
        self._iter = croniter(
            self._fields,
            datetime(2000, 1, 1),
            second_at_beginning=self._seconds,
            max_years_between_matches=NEVER_AFTER_YEARS,
        )
        self._every_hour = self._iter.expanded[1] == ["*"]
        first = self.next_after(now)
        if first is None or first > now + timedelta(days=366 * NEVER_AFTER_YEARS):
            raise InvalidArgument(
                "cron", f"{expression!r} names no time in the next {NEVER_AFTER_YEARS} years"
            )

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, {self.zone.key!r})"

    def next_after(self, after: datetime) -> datetime | None:
        at = after.astimezone(UTC)
        offset, inclusive = _offset(self.zone, at), False
        while True:
            # Until the next change of offset, wall time = instant + offset.
            hit = self._next_wall(at + offset, inclusive=inclusive)
            if hit is None:
                return None
            change = _next_change(self.zone, at, until=hit - offset)
            if change is None:
                return hit - offset
            before, later = change.offset_before, change.offset_after
            if later > before:  # a gap: wall times [at + before, at + later) do not exist
                if not self._every_hour:
                    skipped = self._next_wall(change.at + before, inclusive=True)
                    if skipped is not None and skipped < change.at + later:
                        return change.at
                at = change.at
            elif self._every_hour:  # a fold: wall times [at + later, at + before) come again
                at = change.at
            else:  # ... and fired in their first pass: go on from the first one that did not
                at = change.at + (before - later)
            offset, inclusive = later, True

    def _next_wall(self, wall: datetime, *, inclusive: bool) -> datetime | None:
        """The first naive wall time the expression names after ``wall`` (aware, any zone's
        label ignored), or at it when ``inclusive``; whole seconds."""
        naive = wall.replace(tzinfo=None)
        start = naive.replace(microsecond=0)
        if inclusive and naive.microsecond == 0:
            start -= _ONE_SECOND
        self._iter.set_current(start, force=True)
        try:
            found: datetime = self._iter.get_next(datetime)
        except CroniterError:
            return None
        return found.replace(tzinfo=UTC)


def _parse(expression: str) -> tuple[str, bool]:
    """The fields croniter is given, and whether the first is seconds."""
    text = expression.strip()
    if not text or len(text) > MAX_CRON_LENGTH:
        raise InvalidArgument("cron", f"must be 1 to {MAX_CRON_LENGTH} characters")
    if text.startswith("@"):
        if text.lower() not in _ALIASES:
            raise InvalidArgument(
                "cron", f"unknown alias {text!r}; one of {', '.join(sorted(_ALIASES))}"
            )
        return text.lower(), False
    fields = text.split()
    if len(fields) not in (5, 6):
        raise InvalidArgument(
            "cron", f"{text!r} has {len(fields)} fields; 5, or 6 with seconds first"
        )
    if any(_EXTENSION.search(f) for f in fields):
        raise InvalidArgument(
            "cron", f"{text!r}: hashed (H) and random (R) fields are not supported"
        )
    joined = " ".join(fields)
    seconds = len(fields) == 6
    try:
        croniter(joined, datetime(2000, 1, 1), second_at_beginning=seconds)
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidArgument("cron", f"{text!r} is not a valid expression: {exc}") from None
    return joined, seconds


def zone_named(name: str) -> ZoneInfo:
    """The IANA zone ``name``; InvalidArgument naming ``timezone`` if there is none."""
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        raise InvalidArgument("timezone", f"{name[:64]!r} is not an IANA zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument("timezone", f"unknown zone {name!r}") from None


def _offset(zone: ZoneInfo, at: datetime) -> timedelta:
    offset = at.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _next_change(zone: ZoneInfo, after: datetime, until: datetime) -> Transition | None:
    """The zone's first offset change in ``(after, until]``, if any."""
    for year in range(after.year, until.year + 1):
        for change in _transitions_in(zone, year):
            if after < change.at <= until:
                return change
    return None


@functools.lru_cache(maxsize=4096)
def _transitions_in(zone: ZoneInfo, year: int) -> tuple[Transition, ...]:
    start = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC) if year < 9999 else start + timedelta(days=300)
    found = []
    at, offset = start, _offset(zone, start)
    while at < end:
        step = min(at + TRANSITION_SAMPLE, end)
        next_offset = _offset(zone, step)
        if next_offset != offset:
            found.append(Transition(_bisect(zone, at, step, offset), offset, next_offset))
        at, offset = step, next_offset
    return tuple(found)


def _bisect(zone: ZoneInfo, low: datetime, high: datetime, before: timedelta) -> datetime:
    """The first whole second in ``(low, high]`` whose offset is no longer ``before``."""
    lo, hi = int(low.timestamp()), int(high.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset(zone, datetime.fromtimestamp(mid, UTC)) == before:
            lo = mid
        else:
            hi = mid
    return datetime.fromtimestamp(hi, UTC)


class Catchup(StrEnum):
    """What a schedule does with occurrences missed while nothing materialised them."""

    SKIP = "SKIP"
    LATEST = "LATEST"
    ALL = "ALL"


SCAN_MARGIN = 1000
"""How many missed occurrences beyond those a policy keeps a plan looks at.

A cluster down for a day under a schedule of one per second missed 86,400: walking them
all costs seconds of CPU (each is a ``next_after``). A plan that is that far behind
jumps instead, to ``(kept + SCAN_MARGIN)`` periods before the cutoff (the period
measured between the first two missed), and counts what it jumped over by that period.
Behind by fewer, every missed occurrence is walked and counted exactly; past it the
count is an estimate, and an irregular rule whose first gap is shorter than its later
ones may keep fewer than ``catchup_limit`` under ``ALL``."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What one materialisation pass creates.

    ``create`` are the logical dates to create, in order; ``missed`` how many older
    occurrences the catchup policy passed over (estimated when far behind: :data:`SCAN_MARGIN`);
    ``cursor`` the last occurrence considered, where the next pass starts (exclusive).
    """

    create: tuple[datetime, ...]
    missed: int
    cursor: datetime
    following: datetime | None
    """The first occurrence after ``cursor`` (None: none, or none by ``end_at``), which
    the plan has found anyway: the schedule's next one to decide."""


def plan(
    rule: Recurrence,
    cursor: datetime,
    now: datetime,
    *,
    lookahead: timedelta,
    misfire_grace: timedelta,
    catchup: Catchup,
    catchup_limit: int,
    end_at: datetime | None = None,
    max_create: int = 1000,
) -> Plan:
    """The occurrences after ``cursor`` up to ``now + lookahead`` (and ``end_at``).

    One later than ``now - misfire_grace`` is due (or nearly): it is created whatever the
    policy, so a node taking a shard over a few seconds late misses nothing. Older ones
    were missed: ``SKIP`` creates none, ``LATEST`` the newest, ``ALL`` the newest
    ``catchup_limit``. At most ``max_create`` are created per pass; the cursor stops at
    the last one, and the next pass goes on from there.
    """
    horizon = now + lookahead if end_at is None else min(now + lookahead, end_at)
    cutoff = now - misfire_grace
    missed: list[datetime] = []
    due: list[datetime] = []
    seen = cursor
    keep = 0 if catchup is Catchup.SKIP else 1 if catchup is Catchup.LATEST else catchup_limit
    at, skipped = _far_behind(rule, rule.next_after(cursor), cutoff, keep)
    while at is not None and at <= horizon and len(due) < max_create:
        if at < cutoff:
            missed.append(at)
        else:
            due.append(at)
        seen = at
        at = rule.next_after(at)
    if catchup is Catchup.SKIP:
        kept: list[datetime] = []
    elif catchup is Catchup.LATEST:
        kept = missed[-1:]
    else:
        kept = missed[-catchup_limit:]
    create = (kept + due)[:max_create]
    if create and len(kept + due) > max_create:
        seen = create[-1]
        at = rule.next_after(seen)
    following = None if at is None or (end_at is not None and at > end_at) else at
    return Plan(tuple(create), len(missed) - len(kept) + skipped, seen, following)


def _far_behind(
    rule: Recurrence, first: datetime | None, cutoff: datetime, keep: int
) -> tuple[datetime | None, int]:
    """Where a plan starts walking, and how many missed occurrences it jumped over
    (:data:`SCAN_MARGIN`): ``first`` itself unless it lies more than ``keep +
    SCAN_MARGIN`` periods before ``cutoff``."""
    if first is None or first >= cutoff:
        return first, 0
    following = rule.next_after(first)
    if following is None:
        return first, 0
    period = max(following - first, _ONE_MICROSECOND)
    start = cutoff - period * (keep + SCAN_MARGIN)
    if start <= first:
        return first, 0
    return rule.next_after(start), (start - first) // period + 1
