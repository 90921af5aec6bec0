"""Which nodes the worker holds a session with: discovery through ``GetTopology``.

The worker is given a few addresses; the cluster tells it the rest. :class:`Topology`
asks the first address that answers (live sessions first, then the given targets) for
``GetTopology`` every ``refresh_s`` and soon after a stream ends or a node sends
``Drain``, then keeps exactly one :class:`NodeSession` per listed node, keyed by address
(a node that restarts on the same address gets the same session back). A draining node
is kept too: it says ``Drain`` on the stream (the worker grants it nothing and takes its
credits back) and ``Resume`` once undrained, so an undrain reaches every worker at once,
also one that started while the node was drained.
A node that left the list is *retired*: a live stream is kept until it ends (receipts
may still come on it), a disconnected one stops reconnecting at once.

A node that does not implement ``AdminService`` yet answers ``UNIMPLEMENTED``; the worker
then treats the given targets themselves as the nodes, so a single-node deployment
works without discovery.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from chronoshard.events import wait_event
from chronoshard.worker._backoff import backoff_s
from chronoshard.worker._errors import CallFailed
from chronoshard.worker._models import NodeInfo
from chronoshard.worker._session import NodeSession, SessionHost
from chronoshard.worker._transport import Transport

logger = logging.getLogger("chronoshard.worker")

REFRESH_S = 30.0
"""Ask for the topology this often even when nothing happened (docs/worker-protocol.md)."""
MIN_GAP_S = 1.0
"""Streams ending in a burst (a node died) cause one topology call, not one each."""

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class Topology:
    def __init__(
        self,
        *,
        targets: Sequence[str],
        transport: Transport,
        host: SessionHost,
        spawn: Spawn,
        heartbeat_interval_s: float | None = None,
        refresh_s: float = REFRESH_S,
        rng: random.Random | None = None,
    ) -> None:
        self._targets = list(targets)
        self._transport = transport
        self._host = host
        self._spawn = spawn
        self._heartbeat_interval_s = heartbeat_interval_s
        self._refresh_s = refresh_s
        self._rng = rng or random.Random()
        self._refresh = asyncio.Event()
        self.sessions: dict[str, NodeSession] = {}
        # Nodes that said they are stopping (Drain.shutting_down): no session to them
        # while they are still listed, draining, in the membership.
        self._leaving: set[str] = set()

    def _log(self, level: int, msg: str, *args: Any, **fields: Any) -> None:
        logger.log(level, msg, *args, extra={"worker_id": self._host.worker_id, **fields})

    def session(self, address: str) -> NodeSession | None:
        return self.sessions.get(address)

    def usable(self, address: str) -> bool:
        session = self.sessions.get(address)
        return session is not None and session.usable

    def request_refresh(self) -> None:
        self._refresh.set()

    def node_leaving(self, address: str) -> None:
        """The node at ``address`` is stopping: keep its stream while it lasts, never
        reconnect, and open no new session to it until it is listed again as available
        (restarted)."""
        self._leaving.add(address)
        session = self.sessions.get(address)
        if session is not None:
            session.retire()

    def addresses(self) -> list[str]:
        """Where to send a call: usable sessions first, then the targets, then the rest."""
        usable = sorted(a for a, s in self.sessions.items() if s.usable)
        rest = sorted(self.sessions)
        return list(dict.fromkeys([*usable, *self._targets, *rest]))

    async def run(self) -> None:
        """Discover and reconcile forever (cancel to stop)."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            fetched_at = loop.time()
            nodes = await self.discover()
            if nodes:
                failures = 0
                self.apply(nodes)
                delay = self._refresh_s
            else:
                failures += 1
                delay = backoff_s(failures, self._rng.random())
            await wait_event(self._refresh, delay)
            self._refresh.clear()
            await asyncio.sleep(max(0.0, fetched_at + MIN_GAP_S - loop.time()))

    async def discover(self) -> list[NodeInfo] | None:
        """The cluster's nodes from the first address that answers; None if none did."""
        unimplemented = answered = 0
        for address in self.addresses():
            try:
                nodes = await self._transport.get_topology(address)
            except CallFailed as exc:
                unimplemented += exc.code == "UNIMPLEMENTED"
                self._log(
                    logging.DEBUG,
                    "GetTopology on %s failed: %s",
                    address,
                    exc,
                    node=address,
                    event="topology_failed",
                )
                continue
            answered += 1
            listed = [n for n in nodes if n.address]
            if listed:
                return listed
        if unimplemented and not answered:
            return [NodeInfo(node_id=t, address=t) for t in self._targets]
        self._log(logging.WARNING, "no scheduler node reachable", event="topology_unavailable")
        return None

    def apply(self, nodes: Sequence[NodeInfo]) -> None:
        """Open sessions to new nodes, retire those of nodes no longer listed."""
        listed = {n.address: n for n in nodes}
        self._leaving &= {a for a, n in listed.items() if n.draining}
        wanted = {a: n for a, n in listed.items() if a not in self._leaving}
        for address, node in wanted.items():
            session = self.sessions.get(address)
            if session is None:
                session = NodeSession(
                    node,
                    self._host,
                    self._transport,
                    heartbeat_interval_s=self._heartbeat_interval_s,
                    rng=self._rng,
                )
                self.sessions[address] = session
                session.task = self._spawn(session.run(), f"chronoshard-session {address}")
                session.task.add_done_callback(functools.partial(self._stopped, session))
            elif session.retired:
                session.unretire()
        for address, session in self.sessions.items():
            if address not in wanted and not session.retired:
                self._log(
                    logging.INFO,
                    "node %s left the topology",
                    address,
                    node=session.node_id,
                    event="node_gone",
                )
                session.retire()

    def _stopped(self, session: NodeSession, _task: asyncio.Task[None]) -> None:
        if self.sessions.get(session.address) is session:
            del self.sessions[session.address]

    async def close(self) -> None:
        """Break every stream off and wait for the sessions to stop."""
        sessions = list(self.sessions.values())
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        self.sessions.clear()
