"""A PostgreSQL primary and its asynchronous streaming standby, for failover drills.

A disaster-recovery drill needs what production would have: a primary, and a hot
standby made from it by ``pg_basebackup`` that replays its WAL as it streams in. The
drill kills every process of the primary with SIGKILL at once (its region is gone),
promotes the standby and carries on against it. Both servers run Debian's PostgreSQL
(the ``bin_dir`` the caller gives, ``fixtures.system.postgres_with_ssl()``), on loopback
ports of their own, each a :class:`~chronoshard._dev.postgres.PostgresServer`:

* the primary with ``wal_level=replica`` and WAL senders and replication slots to spare;
  initdb's ``--auth=trust`` pg_hba already lets ``replication`` connections in from
  127.0.0.1 with trust, which the controller checks (``pg_hba_file_rules``) before
  relying on it;
* the standby from ``pg_basebackup --write-recovery-conf --wal-method=stream`` with a
  physical replication slot created by the backup, so the primary keeps every WAL
  segment the standby has not received however far behind it falls (a test pair lives
  seconds; no cap, ``max_slot_wal_keep_size``, is needed), with ``hot_standby=on``:
  read-only queries work, writes fail with ``ReadOnlySqlTransaction``.

Both run with ``fsync=off``, as the other test servers do: it only matters when the
kernel itself crashes (written WAL waits in the page cache, which survives the death
of every PostgreSQL process), and a SIGKILLed primary is never started again here
anyway. What replication promises does not change: a commit returns once its WAL is
written locally (``synchronous_commit=on`` with no synchronous standby), the WAL sender
ships it afterwards, and what the standby had not received when the primary died is
lost at failover, as in production.

The servers run under a controller process (this module, run as a script; why, and its
line protocol: :mod:`harness.controller`), the only process that forks them: it prints
``ready PRIMARY_PORT STANDBY_PORT`` and takes ``kill_primary`` and ``quit``. Everything
that is only SQL or a signal (promotion by ``pg_promote()``, LSN reads, holding the WAL
sender) the client does directly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import psycopg

from harness.controller import CONTROL_TIMEOUT_S, Controller, answer_commands

CONNECT_TIMEOUT_S = 5
POLL_INTERVAL_S = 0.05
SLOT_NAME = "chronoshard_standby"
STANDBY_NAME = "chronoshard_standby"
"""The standby's ``application_name``: how it shows in the primary's pg_stat_replication."""
REPLICATION_SETTINGS = {
    "wal_level": "replica",
    "max_wal_senders": "4",
    "max_replication_slots": "4",
    "hot_standby": "on",
    # The standby reports its replay position every second rather than every 10 s, so
    # the primary's pg_stat_replication is fresh enough to read during a drill.
    "wal_receiver_status_interval": "1s",
}
"""Given to both servers: a standby needs the primary's limits or higher, and after
promotion the standby is a primary that could serve a standby of its own."""


def lsn_value(lsn: str) -> int:
    """A ``pg_lsn`` text (``16/B374D848``) as the byte position it names."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


class ReplicatedPostgres(Controller):
    """The controller's client: DSNs of both servers, WAL positions, failover.

    Synchronous (psycopg's blocking API): an async drill runs the waits in a thread
    (``asyncio.to_thread``) so its event loop keeps serving nodes meanwhile.
    """

    def __init__(self, log_path: Path, *, bin_dir: Path) -> None:
        super().__init__("replication controller", log_path)
        self._bin_dir = bin_dir
        self._held: list[int] = []
        self.primary_port = 0
        self.standby_port = 0
        self.primary_killed = False

    # -- lifecycle

    def open(self) -> None:
        """Start the controller; returns once the primary and its standby accept."""
        primary, standby = self._launch(__file__, str(self._bin_dir))
        self.primary_port, self.standby_port = int(primary), int(standby)

    def close(self) -> None:
        """Stop both servers and delete their directories (the controller's ``quit``)."""
        if self._proc is not None:
            # A WAL sender held by SIGSTOP would keep the primary's fast shutdown waiting.
            self.release_wal_shipping()
        super().close()

    # -- addresses

    def primary_dsn_for(self, dbname: str) -> str:
        return _dsn(self.primary_port, dbname)

    def standby_dsn_for(self, dbname: str) -> str:
        return _dsn(self.standby_port, dbname)

    # -- failover

    def kill_primary(self) -> None:
        """SIGKILL to every process of the primary (postmaster, backends, WAL sender,
        background processes) at once: the region died, nothing was shut down, flushed
        or sent on the way. Returns once none of them runs, so no client can still reach
        it and the standby receives nothing more from it."""
        self._command("kill_primary")
        self.primary_killed = True
        self._held.clear()

    def promote_standby(self, timeout_s: float = 30.0) -> None:
        """Promote the standby (``pg_promote``, as an operator would) and return once it
        is out of recovery, i.e. accepts writes: it has replayed all the WAL it received
        and started a timeline of its own."""
        deadline = time.monotonic() + timeout_s
        with self._connect(self.standby_dsn_for("postgres")) as conn:
            wait_s = max(1, int(timeout_s))
            conn.execute("SELECT pg_promote(wait => true, wait_seconds => %s)", (wait_s,))
        while self.standby_in_recovery():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the standby was still in recovery after {timeout_s} s")
            time.sleep(POLL_INTERVAL_S)

    def standby_in_recovery(self) -> bool:
        return bool(self._standby_value("SELECT pg_is_in_recovery()"))

    # -- WAL positions and lag

    def primary_lsn(self) -> str:
        """Where the primary's WAL ends now (``pg_current_wal_lsn()``)."""
        with self._connect(self.primary_dsn_for("postgres")) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])

    def receive_lsn(self) -> str:
        """How far the standby has received (and written) the primary's WAL."""
        return str(self._standby_value("SELECT pg_last_wal_receive_lsn()::text"))

    def replay_lsn(self) -> str:
        """How far the standby has replayed: what its queries (and, once promoted, its
        clients) see."""
        return str(self._standby_value("SELECT pg_last_wal_replay_lsn()::text"))

    def lag_bytes(self) -> int:
        """WAL the primary has and the standby has not replayed, in bytes. The primary is
        read first, so every byte counted was still missing on the standby when it was
        read, and 0 means the standby had replayed all the primary had when called."""
        primary = lsn_value(self.primary_lsn())
        return max(0, primary - lsn_value(self.replay_lsn()))

    def wait_replayed(self, timeout_s: float = 10.0) -> str:
        """Wait until the standby has replayed all the WAL the primary had when called:
        everything committed on the primary before the call is visible on the standby.
        Returns that position."""
        target = self.primary_lsn()
        deadline = time.monotonic() + timeout_s
        while lsn_value(self.replay_lsn()) < lsn_value(target):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the standby replayed up to {self.replay_lsn()} only, not the "
                    f"primary's {target}, within {timeout_s} s"
                )
            time.sleep(POLL_INTERVAL_S)
        return target

    def hold_wal_shipping(self) -> None:
        """Freeze the primary's WAL sender (SIGSTOP), the link between the regions cut:
        commits on the primary still return (replication is asynchronous) and the
        standby receives none of their WAL. Returns once the sender is stopped, so every
        commit from then on is one a failover would lose."""
        with self._connect(self.primary_dsn_for("postgres")) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchall()
        if not rows:
            raise RuntimeError("the primary has no WAL sender for the standby")
        for (pid,) in rows:
            os.kill(pid, signal.SIGSTOP)
            self._held.append(pid)
            deadline = time.monotonic() + CONTROL_TIMEOUT_S
            while _state(pid) not in {"T", "t", None}:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"WAL sender {pid} did not stop")
                time.sleep(0.001)

    def release_wal_shipping(self) -> None:
        """Let a held WAL sender go on (SIGCONT): the standby catches up."""
        held, self._held = self._held, []
        if self.primary_killed:
            return  # Gone with the primary; its pids may be anyone's by now.
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    # -- internals

    def _standby_value(self, query: str) -> Any:
        with self._connect(self.standby_dsn_for("postgres")) as conn:
            row = conn.execute(query).fetchone()
        assert row is not None
        return row[0]

    @staticmethod
    def _connect(dsn: str) -> psycopg.Connection[Any]:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)


def _dsn(port: int, dbname: str) -> str:
    if not port:
        raise RuntimeError("the replicated pair has not been started")
    return f"postgresql://postgres@127.0.0.1:{port}/{urllib.parse.quote(dbname, safe='')}"


def _state(pid: int) -> str | None:
    """The process state letter from /proc (``T`` when stopped); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    # The command name (in parentheses) may hold spaces; the state follows it.
    return stat.rpartition(")")[2].split()[0]


# -- the controller (run as a script)


def _check_replication_trusted(dsn: str) -> None:
    """Fail clearly unless pg_hba lets ``replication`` in from 127.0.0.1 with trust."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT 1 FROM pg_hba_file_rules WHERE type = 'host' AND auth_method = 'trust'"
            " AND 'replication' = ANY(database) AND 'all' = ANY(user_name)"
            " AND family(address::inet) = 4"
            " AND ('127.0.0.1'::inet & netmask::inet) = (address::inet & netmask::inet)"
        ).fetchall()
    if not rows:
        raise RuntimeError("the primary's pg_hba.conf has no trusted replication from 127.0.0.1")


def _kill_server(postmaster: int, timeout_s: float) -> None:
    """SIGKILL the postmaster and every process it started, and wait until none runs.

    Not a ``killpg``: each PostgreSQL child calls ``setsid()`` and leads a group of its
    own, and an orphaned backend only exits once it notices the postmaster is gone (a
    stopped WAL sender never does). The postmaster is stopped first, so that it forks
    no one while its children are listed and killed, and reaps none of them: their pids
    stay theirs until they are zombies, when they count as gone. The postmaster goes
    last; its pid stays ours until :meth:`PostgresServer.stop` reaps it. All of it takes
    milliseconds: to its clients and to the standby, the whole server dies at once."""
    deadline = time.monotonic() + timeout_s

    def kill_and_wait(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while running := [pid for pid in pids if _state(pid) not in {"Z", "X", None}]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes {running} outlived SIGKILL by {timeout_s} s")
            time.sleep(0.001)

    os.kill(postmaster, signal.SIGSTOP)
    while _state(postmaster) not in {"T", "t", "Z", "X", None}:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the postmaster ({postmaster}) did not stop")
        time.sleep(0.001)
    kill_and_wait(_children(postmaster))
    kill_and_wait([postmaster])


def _children(parent: int) -> list[int]:
    """Pids of the processes whose parent is ``parent`` (read from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # Gone while we looked.
        if int(fields[1]) == parent:  # After the command name: state, ppid.
            children.append(int(entry.name))
    return children


def _serve(bin_dir: Path) -> None:
    # Imported here: the client half above must not pull the server code into the test.
    from chronoshard._dev.postgres import PostgresServer, PostgresStandby
    from harness.processes import run_lifeline

    # This controller's own lifeline: the test run's keeper kills the controller, and
    # this one then stops its servers.
    lifeline = run_lifeline()

    with contextlib.ExitStack() as stack:
        try:
            started = time.monotonic()
            primary = stack.enter_context(
                PostgresServer(
                    fsync=False, bin_dir=bin_dir, settings=REPLICATION_SETTINGS, lifeline=lifeline
                )
            )
            _check_replication_trusted(primary.admin_dsn)
            print(f"primary up in {time.monotonic() - started:.3f} s", file=sys.stderr)
            started = time.monotonic()
            source = PostgresStandby(
                f"{primary.admin_dsn}?application_name={STANDBY_NAME}", slot=SLOT_NAME
            )
            standby = stack.enter_context(
                PostgresServer(
                    fsync=False,
                    bin_dir=bin_dir,
                    settings=REPLICATION_SETTINGS,
                    standby_of=source,
                    lifeline=lifeline,
                )
            )
        except Exception as exc:
            print(f"error {exc!r}".replace("\n", " "), flush=True)
            raise
        print(f"standby up in {time.monotonic() - started:.3f} s", file=sys.stderr)
        print(f"ready {primary.port} {standby.port}", flush=True)
        killed: list[int] = []

        def kill_primary() -> None:
            # Once reaped, its pid may be anyone's: never signal it again.
            pid = primary.pid
            if pid is None or killed:
                raise RuntimeError("the primary is not running")
            killed.append(pid)
            _kill_server(pid, CONTROL_TIMEOUT_S)
            primary.stop()  # Reaps the postmaster and closes its descriptors.

        answer_commands({"kill_primary": kill_primary})


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
