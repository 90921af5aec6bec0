"""Real scheduler and worker processes for end-to-end tests, with the faults we inject.

Each process is a child in its own process group with its output in a log file (shown
when a test fails). ``kill`` is SIGKILL, ``pause``/``resume`` are SIGSTOP/SIGCONT, and
``stop`` is a graceful SIGTERM with a bound. Everything started is ended by
:meth:`ProcessGroup.close`, and the pids are kept so tests can check nothing survived.

A test run that does not get to its teardown (pytest SIGTERMed or SIGKILLed, a CI
timeout) must not leave nodes and workers running behind it: they would hold ports and
cores through the next run. So every process started here (and every controller of
:mod:`harness.controller`) is registered with :func:`run_lifeline`, the ``chronoshard
dev`` launcher's lifeline (:mod:`chronoshard._dev.lifeline`) for this pytest process.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoshard._dev.lifeline import Lifeline, start_child
from chronoshard._dev.processes import free_ports

READY_TIMEOUT_S = 60.0
DEFAULT_SHARD_COUNT = 16
LIFELINE_GRACE_S = 5.0
"""How long the keeper gives a stage of a dead run's processes to stop before SIGKILL."""

_run_lifeline: Lifeline | None = None


def run_lifeline() -> Lifeline:
    """This process's lifeline (the pytest process's, or a controller's), started on
    first use: the processes started with it (``start_child``, or a launcher given
    ``lifeline=run_lifeline()``) are stopped by its keeper when this process exits,
    however it exits. They are registered from this side after their start
    (``from_parent``): a ``preexec_fn`` deadlocks in gRPC's at-fork handlers here. After
    a clean run everything is already stopped and the keeper ends without a word; its
    log is deleted then. After a killed run the log (``$TMPDIR/chronoshard-test-lifeline-PID.log``)
    stays and names what it stopped."""
    global _run_lifeline
    if _run_lifeline is None:
        log_path = Path(tempfile.gettempdir()) / f"chronoshard-test-lifeline-{os.getpid()}.log"
        lifeline = Lifeline(log_path, LIFELINE_GRACE_S, from_parent=True)
        lifeline.start()
        _run_lifeline = lifeline

        def close() -> None:
            lifeline.close()
            log_path.unlink(missing_ok=True)

        atexit.register(close)
    return _run_lifeline


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    cwd: Path | None = None
    """Where it runs (default: the test's own working directory)."""

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.proc = start_child(
                run_lifeline(),
                self.argv,
                name=self.name,
                env=self.env,
                cwd=self.cwd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        if self.alive():
            self.signal(signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(10)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; the exit code (SIGKILL after the timeout)."""
        assert self.proc is not None
        if self.alive():
            self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log(self, tail_chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail_chars:]
        except OSError:
            return ""

    def logged(self, *needles: str) -> bool:
        """Whether one line of the process's log holds every needle."""
        return any(
            all(needle in line for needle in needles)
            for line in self.log(tail_chars=1_000_000).splitlines()
        )


def wait_serving(
    address: str,
    timeout_s: float,
    process: ManagedProcess,
    credentials: grpc.ChannelCredentials | None = None,
) -> None:
    """Until the node at ``address`` reports SERVING; ``credentials`` for a TLS node."""
    deadline = time.monotonic() + timeout_s
    with (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited:\n{process.log()}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{process.name} at {address} not serving:\n{process.log()}")
            time.sleep(0.1)


@dataclass
class SchedulerHandle:
    process: ManagedProcess
    address: str
    metrics_address: str

    def metric(self, name: str) -> float | None:
        """The value of a (label-less or single-series) metric on the node's /metrics."""
        import urllib.request

        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=5) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return None


DIGEST_LINES = 25
"""Warnings and errors per process repeated at the end of :meth:`ProcessGroup.logs`."""


@dataclass
class ProcessGroup:
    """Scheduler and worker processes of one test; ``close`` ends them all."""

    log_dir: Path
    dsn: str
    etcd_endpoint: str
    cluster: str
    shard_count: int = DEFAULT_SHARD_COUNT
    scheduler_env: Mapping[str, str] = field(default_factory=dict)
    schedulers: list[SchedulerHandle] = field(default_factory=list)
    workers: list[ManagedProcess] = field(default_factory=list)

    def start_scheduler(
        self,
        node_id: str,
        *,
        host: str = "127.0.0.1",
        credentials: grpc.ChannelCredentials | None = None,
        **env: str,
    ) -> SchedulerHandle:
        """A node listening (and advertising) on ``host``; its metrics on the loopback.
        ``credentials`` are what its readiness is asked with (a TLS node's)."""
        grpc_port, metrics_port = free_ports(2)
        address = f"{host}:{grpc_port}"
        process = ManagedProcess(
            name=node_id,
            argv=[sys.executable, "-m", "chronoshard.scheduler"],
            env={
                **os.environ,
                "CHRONOSHARD_NODE_ID": node_id,
                "CHRONOSHARD_GRPC__LISTEN": address,
                "CHRONOSHARD_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
                "CHRONOSHARD_DATABASE__DSN": self.dsn,
                "CHRONOSHARD_ETCD__ENDPOINTS": self.etcd_endpoint,
                "CHRONOSHARD_ETCD__CLUSTER": self.cluster,
                "CHRONOSHARD_SCHEDULING__SHARD_COUNT": str(self.shard_count),
                "CHRONOSHARD_LOG_FORMAT": "text",
                **self.scheduler_env,
                **env,
            },
            log_path=self.log_dir / f"{node_id}.log",
        )
        process.start()
        handle = SchedulerHandle(process, address, f"127.0.0.1:{metrics_port}")
        self.schedulers.append(handle)
        wait_serving(address, READY_TIMEOUT_S, process, credentials)
        return handle

    def start_worker(
        self,
        name: str,
        spec: str,
        targets: Sequence[str],
        *,
        pythonpath: Path,
        wrap: Callable[[list[str]], list[str]] | None = None,
        **env: str,
    ) -> ManagedProcess:
        """A worker process; ``wrap`` turns its command line into another (e.g. run it in
        a network namespace: the wrapper must exec it, so the pid stays the worker's)."""
        argv = [sys.executable, "-m", "chronoshard.worker", spec]
        for target in targets:
            argv += ["--target", target]
        path = os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")]).strip(
            os.pathsep
        )
        process = ManagedProcess(
            name=name,
            argv=argv if wrap is None else wrap(argv),
            env={**os.environ, "PYTHONPATH": path, **env},
            log_path=self.log_dir / f"{name}.log",
        )
        process.start()
        self.workers.append(process)
        return process

    def all_pids(self) -> list[int]:
        return [s.process.pid for s in self.schedulers] + [w.pid for w in self.workers]

    def logs(self) -> str:
        parts = [f"==== {s.process.name}\n{s.process.log()}" for s in self.schedulers]
        parts += [f"==== {w.name}\n{w.log()}" for w in self.workers]
        # Last, because a CI log shows the tail of a failure: each process's latest
        # warnings and errors, so the cause is readable without the whole logs above.
        for process in [*(s.process for s in self.schedulers), *self.workers]:
            notable = [
                line
                for line in process.log().splitlines()
                if " WARNING " in line or " ERROR " in line or "Traceback" in line
            ]
            parts.append(f"==== {process.name}: last warnings and errors")
            parts.extend(notable[-DIGEST_LINES:])
        return "\n".join(parts)

    def close(self) -> None:
        for process in [*self.workers, *(s.process for s in self.schedulers)]:
            if process.alive():
                try:
                    process.resume()
                    process.stop(timeout_s=15)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    process.kill()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False
