"""A PostgreSQL of a test's own that the test stops (immediate mode) and starts again.

Fault tests need a server they may take down while the session's test server keeps
serving every other test (and the fault test's own side-effect ledger). The server runs
under a small controller process (this module, run as a script) that owns a
:class:`~chronoshard.services.PostgresServer`: ``stop`` does what ``pg_ctl stop -m
immediate`` does (SIGQUIT: every session cut, no checkpoint), ``start`` brings it back on
the same port and data directory (crash recovery runs first, as after a real crash).

Why a controller process rather than the server object in the test, and its line
protocol: :mod:`harness.controller`. This one prints ``ready PORT`` and takes ``stop``,
``start`` and ``quit``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.controller import Controller, answer_commands

SCHEDULER_DATABASE = "chronoshard"


class RestartablePostgres(Controller):
    """The controller's client: ``stop()`` immediately, ``start()`` again, ``close()``."""

    def __init__(self, log_path: Path) -> None:
        super().__init__("PostgreSQL controller", log_path)
        self.port = 0

    def open(self) -> None:
        [port] = self._launch(__file__)
        self.port = int(port)

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster); returns once it is down."""
        self._command("stop")

    def start(self) -> None:
        """Start again on the same port and data directory; returns once it accepts."""
        self._command("start")


@contextmanager
def migrated_postgres(log_path: Path) -> Iterator[RestartablePostgres]:
    """A :class:`RestartablePostgres` with the database ``chronoshard``
    (:data:`SCHEDULER_DATABASE`) created and migrated, closed on the way out."""
    import psycopg

    from chronoshard.scheduler.store.migrate import apply_migrations

    with RestartablePostgres(log_path) as server:
        with psycopg.connect(server.dsn_for("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {SCHEDULER_DATABASE}")
        apply_migrations(server.dsn_for(SCHEDULER_DATABASE))
        yield server


def _serve() -> None:
    # Imported here: the client half above must not pull the server code into the test.
    from chronoshard.services import PostgresServer
    from harness.processes import run_lifeline

    # This controller's own lifeline: the test run's keeper kills the controller, and
    # this one then stops its PostgreSQL.
    with PostgresServer(fsync=False, lifeline=run_lifeline()) as server:
        print(f"ready {server.port}", flush=True)
        answer_commands({"stop": server.stop_immediately, "start": server.start})


if __name__ == "__main__":
    _serve()
