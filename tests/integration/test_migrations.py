"""Migrations, the schema they produce, partition maintenance and the CLI, on a real
PostgreSQL.

The schema snapshot test compares what all migrations produce with the committed
``schema_snapshot.txt``. After an intended schema change (a new migration), regenerate it
with::

    CHRONOSHARD_UPDATE_SCHEMA_SNAPSHOT=1 \
        .venv/bin/pytest tests/integration/test_migrations.py -k snapshot

and review the diff like code.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import LiteralString

import psycopg
import pytest
from fixtures.databases import unique_database_name

from chronoshard import cli
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import Priority
from chronoshard.scheduler.core.states import AttemptState, TaskStatus
from chronoshard.scheduler.errors import MigrationError, StoreUnavailable
from chronoshard.scheduler.store import partitions
from chronoshard.scheduler.store.migrate import (
    apply_migrations,
    load_migrations,
    make_migration,
)
from chronoshard.scheduler.store.partitions import detach_old_partitions, ensure_partitions
from chronoshard.services import PostgresServer

SNAPSHOT = Path(__file__).with_name("schema_snapshot.txt")
UPDATE_SNAPSHOT_ENV = "CHRONOSHARD_UPDATE_SCHEMA_SNAPSHOT"
UNREACHABLE_DSN = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2"
DAY_PARTITION = re.compile(r"^tasks_p\d{8}$")


@pytest.fixture
def empty_db_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A database with nothing in it: migrations have not run."""
    name = unique_database_name("empty")
    postgres_server.create_database(name)
    try:
        yield postgres_server.dsn_for(name)
    finally:
        postgres_server.drop_database(name)


def _applied(dsn: str) -> list[tuple[int, str, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT version, name, checksum FROM schema_migrations ORDER BY version"
        ).fetchall()
    return [(int(v), str(n), str(c)) for v, n, c in rows]


def _table_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    assert row is not None
    return bool(row[0])


# --- applying ---------------------------------------------------------------------------


def test_apply_twice_is_a_noop(empty_db_dsn: str) -> None:
    names = [m.name for m in load_migrations()]
    assert names[:2] == ["0001_initial", "0002_partition_maintenance"]

    assert apply_migrations(empty_db_dsn) == names
    recorded = _applied(empty_db_dsn)
    assert [name for _, name, _ in recorded] == names

    assert apply_migrations(empty_db_dsn) == []
    assert _applied(empty_db_dsn) == recorded


def test_changed_migration_is_refused(empty_db_dsn: str) -> None:
    originals = load_migrations()
    apply_migrations(empty_db_dsn, originals)
    first = originals[0]
    edited = [make_migration(f"{first.name}.sql", first.sql + "\n-- edited\n"), *originals[1:]]

    with pytest.raises(MigrationError, match=first.name):
        apply_migrations(empty_db_dsn, edited)
    assert [c for _, _, c in _applied(empty_db_dsn)] == [m.checksum for m in originals]


def test_missing_older_migration_is_refused(empty_db_dsn: str) -> None:
    one = make_migration("0001_one.sql", "CREATE TABLE one (x int);")
    two = make_migration("0002_two.sql", "CREATE TABLE two (x int);")
    three = make_migration("0003_three.sql", "CREATE TABLE three (x int);")
    assert apply_migrations(empty_db_dsn, [one, three]) == ["0001_one", "0003_three"]

    with pytest.raises(MigrationError, match="0002_two"):
        apply_migrations(empty_db_dsn, [one, two, three])
    assert not _table_exists(empty_db_dsn, "two")


def test_newer_migration_in_the_database_is_left_alone(empty_db_dsn: str) -> None:
    # A newer release migrated first; an older node restarting must still start.
    one = make_migration("0001_one.sql", "CREATE TABLE one (x int);")
    two = make_migration("0002_two.sql", "CREATE TABLE two (x int);")
    apply_migrations(empty_db_dsn, [one, two])
    assert apply_migrations(empty_db_dsn, [one]) == []


def test_failing_migration_is_rolled_back_whole(empty_db_dsn: str) -> None:
    good = make_migration("0001_good.sql", "CREATE TABLE good (x int);")
    bad = make_migration("0002_bad.sql", "CREATE TABLE half (x int);\nSELECT no_such_function();")
    with pytest.raises(MigrationError, match="0002_bad"):
        apply_migrations(empty_db_dsn, [good, bad])

    assert _table_exists(empty_db_dsn, "good")
    assert not _table_exists(empty_db_dsn, "half")
    assert [name for _, name, _ in _applied(empty_db_dsn)] == ["0001_good"]


def test_concurrent_apply_from_two_threads_applies_once(empty_db_dsn: str) -> None:
    barrier = threading.Barrier(2)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(apply_migrations(empty_db_dsn))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    names = [m.name for m in load_migrations()]
    assert sorted(results, key=len) == [[], names]
    assert [name for _, name, _ in _applied(empty_db_dsn)] == names


def test_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        apply_migrations(UNREACHABLE_DSN)


# --- the schema -------------------------------------------------------------------------


_SNAPSHOT_QUERIES: dict[str, LiteralString] = {
    # Day partitions are left out: their names depend on the day the test runs. The
    # partitioned parent, DEFAULT and all partitioned indexes say what every day gets.
    "tables": """
        SELECT c.relname || ' ' || c.relkind::text
               || COALESCE(' partition by ' || pg_get_partkeydef(c.oid), '')
               || CASE WHEN c.relispartition
                       THEN ' partition of ' || i.inhparent::regclass::text || ' '
                            || pg_get_expr(c.relpartbound, c.oid)
                       ELSE '' END
        FROM pg_class c
        LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
          AND c.relname !~ '^tasks_p[0-9]{8}$'
        ORDER BY 1
    """,
    "columns": """
        SELECT table_name || '.' || column_name || ' ' || data_type
               || CASE WHEN is_nullable = 'NO' THEN ' not null' ELSE '' END
               || COALESCE(' default ' || column_default, '')
               || CASE WHEN is_identity = 'YES' THEN ' identity' ELSE '' END
        FROM information_schema.columns
        WHERE table_schema = 'public' AND table_name !~ '^tasks_(p[0-9]{8}|default)$'
        ORDER BY table_name, ordinal_position
    """,
    "constraints": """
        SELECT c.conrelid::regclass::text || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
        FROM pg_constraint c
        JOIN pg_class r ON r.oid = c.conrelid
        WHERE r.relnamespace = 'public'::regnamespace AND NOT r.relispartition
          -- PostgreSQL 18 lists NOT NULL as constraints too; "columns" already has them.
          AND c.contype <> 'n'
        ORDER BY 1
    """,
    "indexes": """
        SELECT pg_get_indexdef(x.indexrelid)
        FROM pg_index x
        JOIN pg_class r ON r.oid = x.indrelid
        WHERE r.relnamespace = 'public'::regnamespace AND NOT r.relispartition
        ORDER BY 1
    """,
    "functions": """
        SELECT p.proname || '(' || pg_get_function_arguments(p.oid) || ') returns '
               || pg_get_function_result(p.oid) || ' md5 ' || md5(p.prosrc)
        FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace
        ORDER BY 1
    """,
    "triggers": """
        SELECT t.tgrelid::regclass::text || ' ' || pg_get_triggerdef(t.oid)
        FROM pg_trigger t
        JOIN pg_class r ON r.oid = t.tgrelid
        WHERE r.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
        ORDER BY 1
    """,
    # Row-level security (0014): the tables under it, their policies, and what the API's
    # role may do (privileges of the tables' owner depend on who ran the migrations).
    "row level security": """
        SELECT c.relname || ' rls' || CASE WHEN c.relforcerowsecurity THEN ' forced' ELSE '' END
        FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relrowsecurity
        UNION ALL
        SELECT tablename || ' policy ' || policyname || ' ' || cmd
               || ' to ' || array_to_string(roles, ',')
               || regexp_replace(' using ' || COALESCE(qual, '-') || ' check '
                                 || COALESCE(with_check, '-'), '[[:space:]]+', ' ', 'g')
        FROM pg_policies
        WHERE schemaname = 'public'
        UNION ALL
        SELECT c.relname || ' grants ' || x.privilege_type || ' to chronoshard_api'
        FROM pg_class c, aclexplode(c.relacl) x
        WHERE c.relnamespace = 'public'::regnamespace AND x.grantee = 'chronoshard_api'::regrole
        UNION ALL
        SELECT c.relname || '.' || a.attname || ' grants ' || x.privilege_type
               || ' to chronoshard_api'
        FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid, aclexplode(a.attacl) x
        WHERE c.relnamespace = 'public'::regnamespace AND x.grantee = 'chronoshard_api'::regrole
        ORDER BY 1
    """,
}


def schema_snapshot(dsn: str) -> str:
    """A text dump of the schema, stable across days and servers of one major version."""
    sections: list[str] = []
    with psycopg.connect(dsn) as conn:
        for title, query in _SNAPSHOT_QUERIES.items():
            rows = conn.execute(query).fetchall()
            sections.append(f"## {title}\n" + "\n".join(str(row[0]) for row in rows))
    return "\n\n".join(sections) + "\n"


def test_schema_matches_snapshot(db_dsn: str) -> None:
    actual = schema_snapshot(db_dsn)
    if os.environ.get(UPDATE_SNAPSHOT_ENV):
        SNAPSHOT.write_text(actual, encoding="utf-8")
    expected = SNAPSHOT.read_text(encoding="utf-8") if SNAPSHOT.exists() else ""
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                "schema_snapshot.txt",
                "migrated database",
            )
        )
        pytest.fail(
            f"schema differs from {SNAPSHOT.name}; if intended, regenerate with "
            f"{UPDATE_SNAPSHOT_ENV}=1 (see this module's docstring):\n{diff}"
        )


def _check_values(dsn: str, constraint: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s",
            (constraint,),
        ).fetchone()
    assert row is not None, constraint
    return set(re.findall(r"'([^']*)'::text", str(row[0])))


def test_enum_checks_match_the_python_enums(db_dsn: str) -> None:
    assert _check_values(db_dsn, "tasks_status_check") == {s.value for s in TaskStatus}
    assert _check_values(db_dsn, "tasks_priority_check") == {p.value for p in Priority}
    assert _check_values(db_dsn, "tasks_jitter_mode_check") == {m.value for m in JitterMode}
    assert _check_values(db_dsn, "task_attempts_state_check") == {s.value for s in AttemptState}


# --- partitions -------------------------------------------------------------------------


def _db_today(conn: psycopg.Connection[tuple[object, ...]]) -> date:
    row = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()
    assert row is not None
    value = row[0]
    assert isinstance(value, date)
    return value


def _partitions(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'tasks'::regclass"
        ).fetchall()
    return {str(r[0]) for r in rows}


def _day_name(day: date) -> str:
    return f"tasks_p{day:%Y%m%d}"


def test_migrated_database_has_today_to_a_week_ahead_and_default(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        today = _db_today(conn)
    expected = {_day_name(today + timedelta(days=i)) for i in range(8)} | {"tasks_default"}
    assert expected <= _partitions(db_dsn)


def test_ensure_creates_missing_days_once(fresh_db_dsn: str) -> None:
    with psycopg.connect(fresh_db_dsn) as conn:
        today = _db_today(conn)
    before = _partitions(fresh_db_dsn)

    created = ensure_partitions(fresh_db_dsn, days_ahead=10)
    assert {_day_name(today + timedelta(days=i)) for i in (8, 9, 10)} <= set(created)
    assert set(created) == _partitions(fresh_db_dsn) - before
    assert ensure_partitions(fresh_db_dsn, days_ahead=10) == []


def test_ensure_by_hand_gives_up_when_the_tasks_lock_is_not_granted_in_time(
    fresh_db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's wait (10 s) shortened, so that giving up shows well inside the bound.
    monkeypatch.setattr(partitions, "CLI_LOCK_TIMEOUT_S", 0.2)
    with psycopg.connect(fresh_db_dsn) as conn:
        missing = _day_name(_db_today(conn) + timedelta(days=10))
    with psycopg.connect(fresh_db_dsn) as reader:
        # A long reader holds ACCESS SHARE on tasks; creating a partition waits for it.
        reader.execute("SELECT count(*) FROM tasks")
        # A backstop, so that a run that ignored the lock timeout fails the bound below
        # instead of waiting for the reader forever.
        monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=30s")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="partition maintenance failed"):
            ensure_partitions(fresh_db_dsn, days_ahead=10)
        assert time.monotonic() - started < 5.0
        reader.rollback()
    # Nothing was left half done, and the next run does the work.
    assert missing not in _partitions(fresh_db_dsn)
    assert missing in ensure_partitions(fresh_db_dsn, days_ahead=10)


def _tenant(conn: psycopg.Connection[tuple[object, ...]]) -> uuid.UUID:
    row = conn.execute(
        "INSERT INTO tenants (name, tier, rate_limit_rps, max_concurrent_workers, home_region,"
        " api_key_hash) VALUES (%s, 'free', 10, 5, 'eu', %s) RETURNING id",
        (f"tenant-{uuid.uuid4().hex}", uuid.uuid4().hex),
    ).fetchone()
    assert row is not None
    assert isinstance(row[0], uuid.UUID)
    return row[0]


def _task(
    conn: psycopg.Connection[tuple[object, ...]],
    tenant_id: uuid.UUID,
    scheduled_at: datetime,
    status: TaskStatus,
    key: str | None = None,
) -> uuid.UUID:
    """A raw task row (the store's own path is tested in test_store.py), with an
    idempotency key and an attempt row when ``key`` is given."""
    task_id = uuid.uuid4()
    conn.execute(
        "INSERT INTO tasks (id, tenant_id, type, scheduled_at, due_at, status, max_retries,"
        " backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode, payload, shard,"
        " priority, queue) VALUES (%s, %s, 'report', %s, %s, %s, 3, 1, 60, 2, 'NONE', '{}',"
        " 0, 'standard', 'default')",
        (task_id, tenant_id, scheduled_at, scheduled_at, status.value),
    )
    if key is not None:
        conn.execute(
            "INSERT INTO idempotency_keys (tenant_id, key, task_id, scheduled_at,"
            " request_fingerprint) VALUES (%s, %s, %s, %s, 'fp')",
            (tenant_id, key, task_id, scheduled_at),
        )
        conn.execute(
            "INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token, state)"
            " VALUES (%s, 1, %s, 1, 'SUCCEEDED')",
            (task_id, scheduled_at),
        )
    return task_id


def _where(conn: psycopg.Connection[tuple[object, ...]], task_id: uuid.UUID) -> str | None:
    row = conn.execute("SELECT tableoid::regclass::text FROM tasks WHERE id = %s", (task_id,))
    found = row.fetchone()
    return None if found is None else str(found[0])


def test_ensure_moves_rows_out_of_default(fresh_db_dsn: str) -> None:
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        day = _db_today(conn) + timedelta(days=40)
        tenant = _tenant(conn)
        at = datetime(day.year, day.month, day.day, 23, 59, 59, 999999, tzinfo=UTC)
        inside = _task(conn, tenant, at, TaskStatus.SCHEDULED, key="inside")
        next_day = _task(conn, tenant, at + timedelta(microseconds=1), TaskStatus.SCHEDULED)
        assert _where(conn, inside) == "tasks_default"
        row_before = conn.execute("SELECT * FROM tasks WHERE id = %s", (inside,)).fetchone()

        assert ensure_partitions(fresh_db_dsn, days_ahead=0, from_day=day) == [_day_name(day)]

        assert _where(conn, inside) == _day_name(day)
        assert _where(conn, next_day) == "tasks_default"
        row_after = conn.execute("SELECT * FROM tasks WHERE id = %s", (inside,)).fetchone()
        assert row_after == row_before


def test_detach_drops_only_finished_partitions_past_retention(fresh_db_dsn: str) -> None:
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        today = _db_today(conn)
    old = today - timedelta(days=60)
    ensure_partitions(fresh_db_dsn, days_ahead=3, from_day=old)
    recent = today - timedelta(days=10)
    ensure_partitions(fresh_db_dsn, days_ahead=0, from_day=recent)

    def noon(day: date) -> datetime:
        return datetime(day.year, day.month, day.day, 12, tzinfo=UTC)

    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        tenant = _tenant(conn)
        # old + 0: empty. old + 1: only finished tasks. old + 2: one still running.
        # old + 3: one dead-lettered (an operator may retry it). recent: inside retention.
        finished = [
            _task(conn, tenant, noon(old + timedelta(days=1)), status, key=f"done-{status}")
            for status in (TaskStatus.COMPLETED, TaskStatus.CANCELLED, TaskStatus.UPSTREAM_FAILED)
        ]
        _task(conn, tenant, noon(old + timedelta(days=2)), TaskStatus.COMPLETED)
        _task(conn, tenant, noon(old + timedelta(days=2)), TaskStatus.RUNNING, key="running")
        _task(conn, tenant, noon(old + timedelta(days=3)), TaskStatus.DEAD_LETTER, key="dead")
        _task(conn, tenant, noon(recent), TaskStatus.COMPLETED, key="recent")

    dropped = detach_old_partitions(fresh_db_dsn, retention_days=30)

    assert dropped == [_day_name(old), _day_name(old + timedelta(days=1))]
    remaining = _partitions(fresh_db_dsn)
    assert _day_name(old + timedelta(days=2)) in remaining
    assert _day_name(old + timedelta(days=3)) in remaining
    assert _day_name(recent) in remaining
    with psycopg.connect(fresh_db_dsn) as conn:
        keys = {str(r[0]) for r in conn.execute("SELECT key FROM idempotency_keys").fetchall()}
        assert keys == {"running", "dead", "recent"}
        attempts = conn.execute(
            "SELECT count(*) FROM task_attempts WHERE task_id = ANY(%s)", (finished,)
        ).fetchone()
        assert attempts == (0,)
    assert detach_old_partitions(fresh_db_dsn, retention_days=30) == []


# --- the CLI ----------------------------------------------------------------------------


def test_cli_migrate_reports_up_to_date(db_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["migrate", "--dsn", db_dsn]) == cli.EXIT_OK
    assert capsys.readouterr().out.strip() == "schema is up to date"


def test_cli_migrate_lists_what_it_applied(
    empty_db_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(cli.DSN_ENV, empty_db_dsn)
    assert cli.main(["migrate"]) == cli.EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out == [f"applied {m.name}" for m in load_migrations()]


def test_cli_unreachable_database_is_one_readable_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["migrate", "--dsn", UNREACHABLE_DSN]) == cli.EXIT_FAILURE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("chronoshard migrate: cannot connect to PostgreSQL")
    assert "Traceback" not in captured.err


def test_cli_without_a_dsn_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(cli.DSN_ENV, raising=False)
    assert cli.main(["migrate"]) == cli.EXIT_USAGE
    assert cli.DSN_ENV in capsys.readouterr().err


def test_cli_partitions(fresh_db_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["partitions", "ensure", "--dsn", fresh_db_dsn, "--days-ahead", "9"]) == 0
    assert capsys.readouterr().out.startswith("created tasks_p")
    assert cli.main(["partitions", "ensure", "--dsn", fresh_db_dsn, "--days-ahead", "9"]) == 0
    assert capsys.readouterr().out.strip() == "all partitions exist"
    assert cli.main(["partitions", "detach", "--dsn", fresh_db_dsn]) == 0
    assert capsys.readouterr().out.strip() == "nothing to drop"
    with pytest.raises(SystemExit):
        cli.main(["partitions", "ensure", "--dsn", fresh_db_dsn, "--days-ahead", "-1"])
