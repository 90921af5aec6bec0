"""Recurrence: cron in zones against a brute-force walk over every minute, DST rules,
intervals, validation, and the catchup plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoshard.scheduler.core.recurrence import (
    SCAN_MARGIN,
    Catchup,
    Cron,
    Interval,
    _transitions_in,
    plan,
)
from chronoshard.scheduler.errors import InvalidArgument

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
# Fixed-hour and every-hour expressions, with restricted days to exercise day_or.
EXPRESSIONS = [
    "30 2 * * *",
    "0 2,3 * * *",
    "15 1 * * 0",
    "*/15 * * * *",
    "0 * * * *",
    "5,35 * * * 1-5",
    "0 0 1 * *",
    "45 1-3 * 3,4,9,10,11 *",
    "*/30 2 * * *",
    "0 12 13 * 5",
]


class Reference:
    """The documented rules, walked minute by minute in UTC (5-field expressions)."""

    def __init__(self, expression: str, zone: str) -> None:
        fields = croniter(expression, datetime(2000, 1, 1)).expanded
        self.minutes, self.hours, self.days, self.months, self.weekdays = (
            None if f == ["*"] else set(f) for f in fields
        )
        self.every_hour = self.hours is None
        self.zone = ZoneInfo(zone)

    def matches(self, wall: datetime) -> bool:
        if self.minutes is not None and wall.minute not in self.minutes:
            return False
        if self.hours is not None and wall.hour not in self.hours:
            return False
        if self.months is not None and wall.month not in self.months:
            return False
        day = self.days is None or wall.day in self.days
        weekday = self.weekdays is None or (wall.weekday() + 1) % 7 in self.weekdays
        if self.days is not None and self.weekdays is not None:
            return day or weekday  # cron's rule when both day fields are restricted
        return day and weekday

    def between(self, start: datetime, end: datetime) -> list[datetime]:
        """Occurrences in ``(start, end]``; ``start`` on a whole minute."""
        found = []
        previous_wall = (start).astimezone(self.zone).replace(tzinfo=None)
        highest_wall = previous_wall
        at = start + MINUTE
        while at <= end:
            wall = at.astimezone(self.zone).replace(tzinfo=None)
            if self.every_hour:
                fires = self.matches(wall)
            else:
                first_pass = wall > highest_wall
                skipped = previous_wall + MINUTE
                in_gap = False
                while skipped < wall:  # wall times this instant jumped over
                    in_gap = in_gap or self.matches(skipped)
                    skipped += MINUTE
                fires = in_gap or (first_pass and self.matches(wall))
            if fires:
                found.append(at)
            previous_wall, highest_wall = wall, max(highest_wall, wall)
            at += MINUTE
        return found


def _ours(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    return Cron(expression, zone, now=NOW).between(start, end, limit=100_000)


def _transition_windows() -> list[tuple[str, datetime]]:
    """Three days around every offset change of 2024-2027 in the zones."""
    windows = []
    for zone in ZONES:
        for year in range(2024, 2028):
            for change in _transitions_in(ZoneInfo(zone), year):
                windows.append((zone, change.at.replace(minute=0, second=0) - timedelta(days=1)))
    return windows


TRANSITION_WINDOWS = _transition_windows()


def test_the_zones_change_as_the_tz_database_says() -> None:
    berlin = _transitions_in(ZoneInfo("Europe/Berlin"), 2026)
    assert [c.at for c in berlin] == [
        datetime(2026, 3, 29, 1, tzinfo=UTC),
        datetime(2026, 10, 25, 1, tzinfo=UTC),
    ]
    lord_howe = _transitions_in(ZoneInfo("Australia/Lord_Howe"), 2026)
    assert {c.offset_after - c.offset_before for c in lord_howe} == {
        timedelta(minutes=30),
        timedelta(minutes=-30),
    }
    assert _transitions_in(ZoneInfo("UTC"), 2026) == ()


@settings(max_examples=120, deadline=None)
@given(
    window=st.sampled_from(TRANSITION_WINDOWS),
    expression=st.sampled_from(EXPRESSIONS),
    offset_minutes=st.integers(0, 24 * 60),
)
def test_around_every_change_cron_matches_the_minute_walk(
    window: tuple[str, datetime], expression: str, offset_minutes: int
) -> None:
    zone, start = window
    start += timedelta(minutes=offset_minutes)
    end = start + timedelta(days=2)
    assert _ours(expression, zone, start, end) == Reference(expression, zone).between(start, end)


@settings(max_examples=60, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    expression=st.sampled_from(EXPRESSIONS),
    start=st.datetimes(datetime(1990, 1, 1), datetime(2060, 1, 1)).map(
        lambda d: d.replace(second=0, microsecond=0, tzinfo=UTC)
    ),
)
def test_anywhere_in_seventy_years_cron_matches_the_minute_walk(
    zone: str, expression: str, start: datetime
) -> None:
    end = start + timedelta(days=3)
    assert _ours(expression, zone, start, end) == Reference(expression, zone).between(start, end)


@pytest.mark.parametrize("zone", ZONES)
def test_a_whole_year_of_two_schedules_matches_the_minute_walk(zone: str) -> None:
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    for expression in ("30 2 * * *", "*/30 * * * *"):
        assert _ours(expression, zone, start, end) == Reference(expression, zone).between(
            start, end
        )


def _local(instants: list[datetime], zone: str) -> list[str]:
    return [i.astimezone(ZoneInfo(zone)).strftime("%m-%d %H:%M%z") for i in instants]


def test_berlin_spring_a_skipped_0230_runs_once_at_the_change() -> None:
    day = (datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 30, 12, tzinfo=UTC))
    assert _local(_ours("30 2 * * *", "Europe/Berlin", *day), "Europe/Berlin") == [
        "03-29 03:00+0200",
        "03-30 02:30+0200",
    ]
    # Every-hour schedules follow elapsed time: nothing in the hour that does not exist.
    hourly = _local(
        _ours("30 * * * *", "Europe/Berlin", day[0], day[0] + timedelta(hours=16)), "Europe/Berlin"
    )
    assert "03-29 01:30+0100" in hourly and "03-29 03:30+0200" in hourly
    assert len(hourly) == 16


def test_berlin_autumn_a_repeated_0230_runs_once_and_hourly_runs_both_passes() -> None:
    day = (datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 25, 12, tzinfo=UTC))
    assert _local(_ours("30 2 * * *", "Europe/Berlin", *day), "Europe/Berlin") == [
        "10-25 02:30+0200"
    ]
    hourly = _local(_ours("30 * * * *", "Europe/Berlin", *day), "Europe/Berlin")
    assert hourly.count("10-25 02:30+0200") == 1 and hourly.count("10-25 02:30+0100") == 1
    assert len(hourly) == 24  # one per elapsed hour


def test_lord_howe_half_hour_shift() -> None:
    # 2026-10-04 02:00 local jumps to 02:30: 02:15 does not exist and runs at the change.
    day = (datetime(2026, 10, 3, 12, tzinfo=UTC), datetime(2026, 10, 4, 12, tzinfo=UTC))
    assert _local(_ours("15 2 * * *", "Australia/Lord_Howe", *day), "Australia/Lord_Howe") == [
        "10-04 02:30+1100"
    ]


def test_six_fields_put_seconds_first() -> None:
    cron = Cron("*/20 0 12 * * *", "UTC", now=NOW)
    got = cron.between(
        datetime(2026, 1, 1, 12, tzinfo=UTC), datetime(2026, 1, 1, 13, tzinfo=UTC), 10
    )
    assert [g.second for g in got] == [20, 40]
    every_second = Cron("* * * * * *", "Europe/Berlin", now=NOW)
    start = datetime(2026, 3, 29, 0, 59, 58, tzinfo=UTC)
    assert every_second.between(start, start + timedelta(seconds=4), 10) == [
        start + timedelta(seconds=s) for s in range(1, 5)
    ]


def test_aliases_and_sub_second_starts() -> None:
    daily = Cron("@daily", "America/New_York", now=NOW)
    at = daily.next_after(datetime(2026, 6, 1, 4, 0, 0, 500, tzinfo=UTC))
    assert at == datetime(2026, 6, 2, 4, tzinfo=UTC)  # midnight EDT
    assert Cron("@HOURLY", "UTC", now=NOW).next_after(NOW) == NOW + timedelta(hours=1)


@pytest.mark.parametrize(
    ("expression", "zone", "field", "says"),
    [
        ("61 * * * *", "UTC", "cron", "not a valid expression"),
        ("* * * *", "UTC", "cron", "4 fields"),
        ("* * * * * * *", "UTC", "cron", "7 fields"),
        ("@reboot", "UTC", "cron", "unknown alias"),
        ("H * * * *", "UTC", "cron", "hashed"),
        ("0 0 30 2 *", "UTC", "cron", "names no time"),
        ("", "UTC", "cron", "1 to 200"),
        ("0 2 * * *", "Mars/Olympus", "timezone", "unknown zone"),
        ("0 2 * * *", "../etc/passwd", "timezone", "not an IANA zone"),
    ],
)
def test_bad_expressions_and_zones_name_the_field(
    expression: str, zone: str, field: str, says: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Cron(expression, zone, now=NOW)
    assert caught.value.field == field
    assert says in caught.value.message
    assert len(str(caught.value)) < 300


def test_day_names_are_not_taken_for_hashes() -> None:
    assert Cron("0 9 * * THU", "UTC", now=NOW).next_after(NOW) == datetime(
        2026, 1, 1, 9, tzinfo=UTC
    )


@settings(max_examples=200, deadline=None)
@given(
    every_s=st.integers(1, 10_000),
    anchor_s=st.integers(0, 10**6),
    after_s=st.floats(-1e5, 1e7, allow_nan=False),
)
def test_interval_is_the_next_multiple_after(every_s: int, anchor_s: int, after_s: float) -> None:
    anchor = NOW + timedelta(seconds=anchor_s)
    rule = Interval(anchor, timedelta(seconds=every_s))
    after = anchor + timedelta(seconds=after_s)
    got = rule.next_after(after)
    assert got is not None and got > after and got >= anchor
    assert (got - anchor) % timedelta(seconds=every_s) == timedelta(0)
    assert got - timedelta(seconds=every_s) <= after or got == anchor


def test_interval_below_a_second_is_refused() -> None:
    with pytest.raises(InvalidArgument) as caught:
        Interval(NOW, timedelta(milliseconds=500))
    assert caught.value.field == "interval"


# --- the catchup plan -------------------------------------------------------------

MINUTELY = Interval(NOW, MINUTE)
DOWN_FROM = NOW + timedelta(minutes=10)  # last occurrence materialised before the outage


def _plan(catchup: Catchup, down_for: timedelta, limit: int = 100) -> tuple[list[int], int]:
    now = DOWN_FROM + down_for
    result = plan(
        MINUTELY,
        DOWN_FROM,
        now,
        lookahead=timedelta(seconds=90),
        misfire_grace=timedelta(seconds=30),
        catchup=catchup,
        catchup_limit=limit,
    )
    assert result.cursor == (result.create[-1] if result.create else result.cursor)
    return [int((c - DOWN_FROM) / MINUTE) for c in result.create], result.missed


def test_catchup_over_three_missed_occurrences() -> None:
    # Down from minute 10 to 13:40: minutes 11, 12, 13 were missed; 14 and 15 are ahead.
    down = timedelta(minutes=3, seconds=40)
    assert _plan(Catchup.SKIP, down) == ([4, 5], 3)
    assert _plan(Catchup.LATEST, down) == ([3, 4, 5], 2)
    assert _plan(Catchup.ALL, down) == ([1, 2, 3, 4, 5], 0)
    assert _plan(Catchup.ALL, down, limit=2) == ([2, 3, 4, 5], 1)


def test_an_occurrence_inside_the_grace_is_not_missed() -> None:
    # A handoff 20 s after minute 11 fell due: it is late, not missed, under every policy.
    for catchup in Catchup:
        created, missed = _plan(catchup, timedelta(minutes=1, seconds=20))
        assert created[0] == 1 and missed == 0


@settings(max_examples=200, deadline=None)
@given(
    down_s=st.integers(0, 4000),
    catchup=st.sampled_from(list(Catchup)),
    limit=st.integers(1, 50),
    passes=st.integers(1, 5),
)
def test_repeated_passes_create_each_occurrence_at_most_once_and_miss_none_due(
    down_s: int, catchup: Catchup, limit: int, passes: int
) -> None:
    cursor, created = DOWN_FROM, []
    now = DOWN_FROM + timedelta(seconds=down_s)
    for n in range(passes):
        result = plan(
            MINUTELY,
            cursor,
            now + timedelta(seconds=20 * n),
            lookahead=timedelta(seconds=90),
            misfire_grace=timedelta(seconds=30),
            catchup=catchup,
            catchup_limit=limit,
            max_create=7,
        )
        assert result.cursor >= cursor
        created += result.create
        cursor = result.cursor
    assert created == sorted(set(created))
    cutoff = now - timedelta(seconds=30)
    due = [c for c in MINUTELY.between(DOWN_FROM, cursor, 10_000) if c >= cutoff]
    assert set(due) <= set(created)


def test_far_behind_a_plan_jumps_and_keeps_the_newest() -> None:
    # A day down under one occurrence per second: 86,400 missed. The plan looks at about
    # SCAN_MARGIN of them, not all, and still keeps exactly the newest ones.
    every_second = Interval(NOW, timedelta(seconds=1))
    cursor = NOW + timedelta(seconds=10)
    now = cursor + timedelta(days=1)
    cutoff = now - timedelta(seconds=30)
    calls = 0

    class Counting(Interval):
        def next_after(self, after: datetime) -> datetime | None:
            nonlocal calls
            calls += 1
            return super().next_after(after)

    counted = Counting(every_second.anchor, every_second.every)
    for catchup, limit in ((Catchup.SKIP, 1), (Catchup.LATEST, 1), (Catchup.ALL, 5)):
        calls = 0
        result = plan(
            counted,
            cursor,
            now,
            lookahead=timedelta(seconds=2),
            misfire_grace=timedelta(seconds=30),
            catchup=catchup,
            catchup_limit=limit,
        )
        assert calls < SCAN_MARGIN + limit + 100
        kept = [c for c in result.create if c < cutoff]
        newest_missed = every_second.between(cutoff - timedelta(seconds=limit + 1), cutoff, 100)
        newest_missed = [c for c in newest_missed if c < cutoff][-limit:]
        assert kept == ([] if catchup is Catchup.SKIP else newest_missed)
        # The estimate is exact for a fixed interval: every second in (cursor, cutoff).
        missed_total = int((cutoff - cursor).total_seconds()) - 1
        assert result.missed + len(kept) == missed_total
