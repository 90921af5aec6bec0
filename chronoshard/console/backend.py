"""The console's calls to the cluster: the public gRPC API and the nodes' /metrics, with
the user's API key. The only module of the console that talks to anything.

Tasks, schedules, workflows, incidents and worker sessions go through
:class:`chronoshard.Client`, one per session (the client sends its key on every call, and
the tenant scoping is the API's: another tenant's task is NotFoundError like a task that
does not exist; another tenant's workers are not listed). The topology
(``AdminService.GetTopology``: nodes, shard owners and epochs) and the watchdog's
expectations (``WatchdogService``) are not in the client; they are called through the
generated stubs over one shared channel per target, with the session's key as the
call's metadata, so the API decides who may see them: a key without the operator flag
gets the nodes only (``TopologyView.restricted``). Errors come back as the client's
:class:`~chronoshard.errors.ChronoshardError` either way.

The nodes' /metrics (wheel sizes, worker sessions, dispatch lateness) need no key, but
their addresses come only in an operator's topology; the :class:`MetricsPoller` scrapes
every node such a topology named, every ``interval_s``, into a
:class:`~chronoshard.console.lateness.History` the overview plots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import grpc

from chronoshard._cli.admin import NodeMetrics, parse_node_metrics
from chronoshard.client import Client, TLSConfig, channel_options
from chronoshard.console.lateness import History, sample
from chronoshard.errors import from_rpc_error
from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    watchdog_service_pb2,
    watchdog_service_pb2_grpc,
)

log = logging.getLogger(__name__)

METRICS_TIMEOUT_S = 2.0
DEFAULT_POLL_INTERVAL_S = 2.0


@dataclass(frozen=True)
class NodeView:
    node_id: str
    address: str
    metrics_address: str
    started_at: datetime | None
    shards: tuple[int, ...]
    draining: bool
    clock_skewed: bool


@dataclass(frozen=True)
class ShardView:
    shard: int
    node_id: str
    epoch: int


@dataclass(frozen=True)
class TopologyView:
    answered_by: str
    shard_count: int
    nodes: tuple[NodeView, ...]
    shards: tuple[ShardView, ...]
    restricted: bool = False
    """Answered for a key without the operator flag: the nodes only (no shards, epochs,
    nor metrics endpoints)."""


@dataclass(frozen=True)
class ExpectationView:
    job_id: str
    interval_s: float
    tolerance_s: float
    severity: str
    enabled: bool
    from_config: bool
    description: str


def _seconds(duration: Any) -> float:
    return float(duration.seconds) + float(duration.nanos) / 1e9


def topology_view(reply: admin_service_pb2.GetTopologyResponse) -> TopologyView:
    nodes = tuple(
        NodeView(
            node_id=n.node_id,
            address=n.address,
            metrics_address=n.metrics_address,
            started_at=n.started_at.ToDatetime(tzinfo=UTC) if n.HasField("started_at") else None,
            shards=tuple(sorted(n.shards)),
            draining=n.draining,
            clock_skewed=n.clock_skewed,
        )
        for n in reply.nodes
    )
    shards = tuple(
        sorted(
            (ShardView(s.shard, s.node_id, s.epoch) for s in reply.shards), key=lambda s: s.shard
        )
    )
    return TopologyView(reply.node_id, reply.shard_count, nodes, shards, reply.restricted)


def expectation_view(exp: watchdog_service_pb2.Expectation) -> ExpectationView:
    severity = watchdog_service_pb2.Severity.Name(exp.severity).removeprefix("SEVERITY_")
    return ExpectationView(
        job_id=exp.job_id,
        interval_s=_seconds(exp.interval),
        tolerance_s=_seconds(exp.tolerance),
        severity=severity.lower(),
        enabled=exp.enabled,
        from_config=exp.from_config,
        description=exp.description,
    )


class Cluster:
    """Where the cluster is and how to reach it; makes each session's :class:`Client`
    and holds the shared channels of the cluster views."""

    def __init__(self, targets: list[str], *, tls: TLSConfig | None, call_timeout_s: float) -> None:
        if not targets:
            raise ValueError("the console needs at least one scheduler address")
        self.targets = targets
        self.tls = tls
        self.call_timeout_s = call_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._next = 0

    def client(self, api_key: str) -> Client:
        return Client(
            self.targets, api_key=api_key, tls=self.tls or False, timeout_s=self.call_timeout_s
        )

    def _channel(self) -> grpc.aio.Channel:
        target = self.targets[self._next % len(self.targets)]
        self._next += 1
        channel = self._channels.get(target)
        if channel is None:
            options = channel_options(server_name=self.tls.server_name if self.tls else None)
            if self.tls is None:
                channel = grpc.aio.insecure_channel(target, options=options)
            else:
                channel = grpc.aio.secure_channel(target, self.tls.credentials(), options=options)
            self._channels[target] = channel
        return channel

    async def _unary(self, stub_class: Any, method: str, request: Any, api_key: str) -> Any:
        stub = stub_class(self._channel())
        try:
            return await getattr(stub, method)(
                request,
                timeout=self.call_timeout_s,
                metadata=(("authorization", f"Bearer {api_key}"),),
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    async def topology(self, api_key: str) -> TopologyView:
        reply = await self._unary(
            admin_service_pb2_grpc.AdminServiceStub,
            "GetTopology",
            admin_service_pb2.GetTopologyRequest(),
            api_key,
        )
        return topology_view(reply)

    async def expectations(self, api_key: str) -> list[ExpectationView]:
        found: list[ExpectationView] = []
        token = ""
        while True:
            page = await self._unary(
                watchdog_service_pb2_grpc.WatchdogServiceStub,
                "ListExpectations",
                watchdog_service_pb2.ListExpectationsRequest(page_size=1000, page_token=token),
                api_key,
            )
            found.extend(expectation_view(e) for e in page.expectations)
            if not page.next_page_token:
                return found
            token = page.next_page_token

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


class MetricsPoller:
    """Scrapes the nodes the overview last saw, every ``interval_s``, into ``history``;
    ``latest`` holds each node's last figures (or the error instead)."""

    def __init__(self, interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.history = History()
        self.latest: dict[str, NodeMetrics | str] = {}
        self._addresses: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    def watch(self, topology: TopologyView) -> None:
        """Scrape these nodes from now on (the topology an overview just read)."""
        self._addresses = {n.node_id: n.metrics_address for n in topology.nodes}
        self.history.forget_except(set(self._addresses))
        for node_id in list(self.latest):
            if node_id not in self._addresses:
                del self.latest[node_id]

    async def scrape_once(self) -> None:
        if self._http is None:
            # Cluster addresses: a proxy from the environment must not intercept them.
            self._http = aiohttp.ClientSession(
                trust_env=False, timeout=aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)
            )
        addresses = dict(self._addresses)
        results = await asyncio.gather(*(self._scrape(a) for a in addresses.values()))
        now = time.time()
        for node_id, result in zip(addresses, results, strict=True):
            self.latest[node_id] = result
            if isinstance(result, NodeMetrics):
                self.history.add(node_id, sample(now, result))

    async def _scrape(self, address: str) -> NodeMetrics | str:
        if not address:
            return "no metrics address"
        assert self._http is not None
        try:
            async with self._http.get(f"http://{address}/metrics") as reply:
                if reply.status != 200:
                    return f"metrics answered HTTP {reply.status}"
                return parse_node_metrics(await reply.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return f"metrics unreachable: {exc or type(exc).__name__}"

    async def _run(self) -> None:
        while True:
            try:
                await self.scrape_once()
            except Exception:  # one bad round must not end the history
                log.exception("scraping the nodes' metrics failed")
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._http is not None:
            await self._http.close()
            self._http = None
