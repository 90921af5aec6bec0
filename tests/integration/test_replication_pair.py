"""The replicated PostgreSQL pair a disaster-recovery drill fails over (``harness.replication``).

Real servers, Debian's PostgreSQL: a primary and the hot standby ``pg_basebackup`` made
from it, streaming asynchronously. What the drill relies on is shown here, so that a
drill failure is about the scheduler and not the pair:

* what is committed on the primary is visible on the standby once ``wait_replayed``
  returns, and the standby refuses writes (``ReadOnlySqlTransaction``) until promoted;
* after ``kill_primary`` the old primary is unreachable, and once ``promote_standby``
  returns the standby accepts writes and has every replicated row;
* replication is asynchronous: a commit the primary acknowledged while its WAL sender
  was held (the link between the regions cut) never reached the standby, and is gone
  after failover, which is the loss the drill must expect.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fixtures.system import postgres_with_ssl, unavailable
from harness.replication import ReplicatedPostgres, lsn_value

pytestmark = pytest.mark.timeout(120)

DATABASE = "postgres"
REPLAY_TIMEOUT_S = 10.0
PROMOTE_TIMEOUT_S = 30.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ReplicatedPostgres]:
    bin_dir = postgres_with_ssl()
    if not (bin_dir / "pg_basebackup").exists():
        unavailable(f"pg_basebackup not found in {bin_dir} (Debian package postgresql)")
    with ReplicatedPostgres(tmp_path / "replication-control.log", bin_dir=bin_dir) as started:
        yield started


def _execute(dsn: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(query)
        return cursor.fetchall() if cursor.description is not None else []


def test_the_standby_replays_the_primary_refuses_writes_and_takes_over_once_promoted(
    pair: ReplicatedPostgres,
) -> None:
    primary, standby = pair.primary_dsn_for(DATABASE), pair.standby_dsn_for(DATABASE)
    _execute(primary, "CREATE TABLE drill (id int PRIMARY KEY, note text NOT NULL)")
    _execute(primary, "INSERT INTO drill VALUES (1, 'before the outage')")

    pair.wait_replayed(REPLAY_TIMEOUT_S)

    assert _execute(standby, "SELECT id, note FROM drill") == [(1, "before the outage")]
    assert pair.standby_in_recovery()
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        _execute(standby, "INSERT INTO drill VALUES (2, 'on a standby')")

    pair.kill_primary()

    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(primary, connect_timeout=2).close()

    pair.promote_standby(PROMOTE_TIMEOUT_S)

    assert not pair.standby_in_recovery()
    _execute(standby, "INSERT INTO drill VALUES (2, 'after the failover')")
    assert _execute(standby, "SELECT id, note FROM drill ORDER BY id") == [
        (1, "before the outage"),
        (2, "after the failover"),
    ]


def test_a_commit_the_standby_never_received_is_lost_at_failover(
    pair: ReplicatedPostgres,
) -> None:
    primary, standby = pair.primary_dsn_for(DATABASE), pair.standby_dsn_for(DATABASE)
    _execute(primary, "CREATE TABLE drill (id int PRIMARY KEY)")
    _execute(primary, "INSERT INTO drill VALUES (1)")
    pair.wait_replayed(REPLAY_TIMEOUT_S)

    pair.hold_wal_shipping()
    # Acknowledged: asynchronous replication does not wait for the standby.
    _execute(primary, "INSERT INTO drill VALUES (2)")
    committed_up_to = lsn_value(pair.primary_lsn())

    assert lsn_value(pair.receive_lsn()) < committed_up_to
    assert pair.lag_bytes() > 0
    assert _execute(primary, "SELECT id FROM drill ORDER BY id") == [(1,), (2,)]

    pair.kill_primary()
    pair.promote_standby(PROMOTE_TIMEOUT_S)

    assert _execute(standby, "SELECT id FROM drill ORDER BY id") == [(1,)]
