"""A network partition made of real kernel parts: a namespace, a veth pair, a route.

:class:`NetworkNamespace` puts a process in a network namespace of its own (``ip netns
add``), joined to the host by a veth pair on a private /24: the host side holds the
addresses the test's services listen on (``host_address`` for the scheduler nodes,
``db_address`` for the database), the namespace side one address of its own. Nothing
leaves this machine. :meth:`NetworkNamespace.cut` adds a blackhole route inside the
namespace for one host address, so the process inside can no longer reach it (its
connects fail at once, its packets on open connections are dropped) while the other
address stays reachable; :meth:`NetworkNamespace.heal` removes it.

The database listens on the host's loopback; :class:`TcpForwarder` relays connections
from ``db_address`` to it (in a thread of the test process with its own event loop, so
the test's own blocking calls never stall it).

Everything made is removed by ``close`` (the namespace takes its end of the veth pair,
and the pair goes with it). The caller checks first that namespaces can be made here
(``tests/fixtures/system.py: network_namespaces()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field


def _private_subnet() -> str:
    """A /24 of 10.200.0.0 - 10.250.255.0 (three octets), picked at random."""
    return f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"


@dataclass
class NetworkNamespace:
    ip: str
    """The ``ip`` binary."""
    name: str = field(default_factory=lambda: f"csf-{os.getpid()}-{secrets.token_hex(2)}")
    subnet: str = field(default_factory=_private_subnet)
    made: bool = False

    @property
    def host_address(self) -> str:
        """Host side: where the scheduler nodes listen (and advertise)."""
        return f"{self.subnet}.1"

    @property
    def db_address(self) -> str:
        """Host side: where the database is forwarded (stays reachable in a cut)."""
        return f"{self.subnet}.2"

    @property
    def inside_address(self) -> str:
        return f"{self.subnet}.3"

    @property
    def _host_if(self) -> str:
        return f"vh{self.name[-9:].replace('-', '')}"[:15]

    @property
    def _inside_if(self) -> str:
        return f"vn{self.name[-9:].replace('-', '')}"[:15]

    def _run(self, *args: str) -> None:
        done = subprocess.run([self.ip, *args], capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def _inside(self, *args: str) -> None:
        self._run("netns", "exec", self.name, self.ip, *args)

    def make(self) -> NetworkNamespace:
        self._run("netns", "add", self.name)
        self.made = True
        self._run("link", "add", self._host_if, "type", "veth", "peer", "name", self._inside_if)
        self._run("link", "set", self._inside_if, "netns", self.name)
        for address in (self.host_address, self.db_address):
            self._run("addr", "add", f"{address}/24", "dev", self._host_if)
        self._run("link", "set", self._host_if, "up")
        self._inside("addr", "add", f"{self.inside_address}/24", "dev", self._inside_if)
        self._inside("link", "set", self._inside_if, "up")
        self._inside("link", "set", "lo", "up")
        return self

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return [self.ip, "netns", "exec", self.name, *argv]

    def cut(self, address: str) -> None:
        """The process inside can no longer reach ``address`` (a blackhole route)."""
        self._inside("route", "add", "blackhole", f"{address}/32")

    def heal(self, address: str) -> None:
        self._inside("route", "del", "blackhole", f"{address}/32")

    def close(self) -> None:
        if self.made:
            with contextlib.suppress(RuntimeError):
                self._run("netns", "delete", self.name)
            with contextlib.suppress(RuntimeError):
                self._run("link", "delete", self._host_if)  # gone with the namespace, usually
            self.made = False

    def __enter__(self) -> NetworkNamespace:
        return self.make()

    def __exit__(self, *exc: object) -> None:
        self.close()


class TcpForwarder:
    """Relays every TCP connection made to ``listen`` to ``target`` (both host, port)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self._listen = listen
        self._target = target
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tcp-forwarder", daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    def start(self) -> TcpForwarder:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the forwarder did not start")
        return self

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._relay, self._listen[0], self._listen[1])
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()
