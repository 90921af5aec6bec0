"""Schema migrations, run by ``chronoshard migrate``.

Migrations are the numbered files ``migrations/NNNN_name.sql`` of this package, read
through ``importlib.resources`` (so an installed wheel migrates like the source tree).
:func:`apply_migrations` applies the ones a database lacks, in order, each file in its
own transaction together with its row in ``schema_migrations(version, name, checksum,
applied_at)``, so a failed file leaves no trace and the next run starts at it again.

Several scheduler nodes may start at once and all run this: a session-level advisory
lock makes them take turns, and whoever comes second finds nothing left to do. An
applied migration is never edited: its SHA-256 is recorded, and a file whose checksum no
longer matches stops the run with :class:`MigrationError` instead of leaving databases
whose schemas differ under the same version. A database that has a migration this code
does not know (a newer release ran first) is left alone; a missing migration *below*
the newest applied one is refused, because applying it out of order is not what anyone
tested.

This is synchronous psycopg on purpose (:mod:`.direct`): it runs before any event loop
exists, from the CLI, the dev launcher and the test fixtures. Partition maintenance,
which the migrations' SQL functions make possible, is :mod:`.partitions`.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString

import psycopg

from chronoshard.scheduler.errors import MigrationError, StoreUnavailable
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.direct import connect

PACKAGE = "chronoshard.scheduler.store"
MIGRATIONS_DIR = "migrations"

_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<slug>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: ``version`` 1 is ``0001_initial.sql``, named ``0001_initial``."""

    version: int
    name: str
    sql: str
    checksum: str


def _checksum(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


def make_migration(filename: str, sql: str) -> Migration:
    """The migration for a file called ``filename`` with contents ``sql``.

    Raises:
        MigrationError: ``filename`` is not ``NNNN_lower_snake.sql``.
    """
    match = _FILE_NAME.match(filename)
    if match is None:
        raise MigrationError(f"migration file {filename!r} is not named NNNN_name.sql")
    return Migration(
        version=int(match["version"]),
        name=filename.removesuffix(".sql"),
        sql=sql,
        checksum=_checksum(sql),
    )


def load_migrations() -> list[Migration]:
    """This package's migrations, in version order.

    Raises:
        MigrationError: a file is misnamed or two files share a version.
    """
    root = resources.files(PACKAGE).joinpath(MIGRATIONS_DIR)
    found = [
        make_migration(entry.name, entry.read_text(encoding="utf-8"))
        for entry in root.iterdir()
        if entry.name.endswith(".sql")
    ]
    found.sort(key=lambda m: m.version)
    for before, after in itertools.pairwise(found):
        if before.version == after.version:
            raise MigrationError(f"{before.name} and {after.name} share version {before.version}")
    return found


def _pending(
    available: Sequence[Migration], applied: dict[int, tuple[str, str]]
) -> list[Migration]:
    """The migrations to apply, after checking the database's history against the files.

    Raises:
        MigrationError: an applied file changed, or a missing one is older than the newest
            applied migration.
    """
    for migration in available:
        recorded = applied.get(migration.version)
        if recorded is not None and recorded[1] != migration.checksum:
            raise MigrationError(
                f"migration {migration.name} was changed after it was applied "
                f"(recorded checksum {recorded[1][:12]}…, file {migration.checksum[:12]}…); "
                "applied migrations must never be edited: add a new one"
            )
    pending = [m for m in available if m.version not in applied]
    newest_applied = max(applied, default=0)
    stragglers = [m.name for m in pending if m.version < newest_applied]
    if stragglers:
        raise MigrationError(
            f"migrations {', '.join(stragglers)} are missing from a database that already "
            f"has version {newest_applied}; refusing to apply them out of order"
        )
    return pending


def apply_migrations(dsn: str, migrations: Sequence[Migration] | None = None) -> list[str]:
    """Bring the database at ``dsn`` up to date; the names of the migrations applied.

    ``migrations`` defaults to this package's files (tests pass their own). Applying
    twice is a no-op that returns ``[]``.

    Raises:
        StoreUnavailable: the server cannot be reached.
        MigrationError: see the module docstring; a failing file is named and rolled back.
    """
    available = load_migrations() if migrations is None else list(migrations)
    sql = queries.load("migrate.sql")
    done: list[str] = []
    with connect(dsn) as conn:
        try:
            conn.execute(sql["lock"])
            try:
                conn.execute(sql["create_migrations_table"])
                rows = conn.execute(sql["applied_migrations"]).fetchall()
                applied = {int(str(v)): (str(n), str(c)) for v, n, c in rows}
                for migration in _pending(available, applied):
                    _apply_one(conn, migration, sql["record_migration"])
                    done.append(migration.name)
            finally:
                # Closing the connection would release it too; unlocking keeps the
                # connection reusable and says so.
                if not conn.broken:
                    conn.execute(sql["unlock"])
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"lost PostgreSQL while migrating: {exc}") from exc
    return done


def _apply_one(
    conn: psycopg.Connection[tuple[object, ...]], migration: Migration, record: LiteralString
) -> None:
    try:
        with conn.transaction():
            # Without parameters psycopg sends the file as one simple query, which may
            # hold many statements. The text is a file of this package, not input.
            conn.execute(migration.sql)
            conn.execute(
                record,
                {
                    "version": migration.version,
                    "name": migration.name,
                    "checksum": migration.checksum,
                },
            )
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        raise MigrationError(
            f"migration {migration.name} failed and was rolled back: {exc}"
        ) from exc
