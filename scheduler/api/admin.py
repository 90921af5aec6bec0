"""``AdminService``: the cluster as this node sees it (topology, shards, worker sessions),
node drain and undrain.

Topology comes from etcd (live nodes with their draining flag, current claims with their
epochs), so any node answers for the whole cluster; workers use it to discover every
node. Drain and undrain act on the node asked; asked of another node they answer
FAILED_PRECONDITION naming where to ask.

The cluster views are an operator key's (docs/architecture.md, Decisions): ``ListShards``
is refused to any other key by the access interceptor, and ``GetTopology`` answers it
the nodes only (:func:`restricted_topology`: what a worker needs to reach every node,
which is why any key may call it). ``ListWorkerSessions`` lists the sessions of the
caller's own workers, or every session for an operator, from the nodes' session
records in PostgreSQL (:mod:`chronoshard.scheduler.core.worker_sessions`), this node's
own with their live figures. These two ask the authenticator whom they answer (a cache
hit: the interceptor has just checked the same key).

Every RPC runs inside the node's one error boundary (:func:`.boundary.serve`, as
TaskService's do): a :class:`~.errors.SchedulerError` (etcd away, a node id naming no
live node) leaves as its status with a bounded message and the ``ErrorInfo`` trailer;
anything else is a bug, logged with its traceback and answered ``INTERNAL``, never
grpc's ``UNKNOWN`` with the exception's text. (Access is checked before, by the
interceptor of ``access.py``.)
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc

from chronoshard.clock import Clock
from chronoshard.scheduler.api import boundary, convert
from chronoshard.scheduler.cluster.coordination import EtcdCoordinator
from chronoshard.scheduler.cluster.shards import ShardManager
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.core.worker_sessions import (
    DEFAULT_SESSION_PAGE_SIZE,
    MAX_SESSION_PAGE_SIZE,
    ListedSession,
    SessionQuery,
    SessionReport,
    with_live_figures,
)
from chronoshard.scheduler.errors import InvalidArgument, NodeNotFound, WrongNode
from chronoshard.v1 import admin_service_pb2, admin_service_pb2_grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

MAX_FILTER_CHARS = 200
"""A worker id or node id filter: as long as a worker id may be (and a node's)."""


class SessionRecords(Protocol):
    """The cluster's worker-session records
    (:class:`~chronoshard.scheduler.store.sessions.WorkerSessionStore`)."""

    async def list_worker_sessions(
        self, query: SessionQuery, within_s: float
    ) -> tuple[list[ListedSession], bool]: ...


class OwnSessions(Protocol):
    """This node's live sessions, described
    (:class:`~chronoshard.scheduler.core.worker_sessions.DescribedSessions`)."""

    def reports(self) -> list[SessionReport]: ...


# --- pure request parsing and answers -----------------------------------------------------


def _name_filter(value: str, field: str) -> str | None:
    """A worker id or node id to filter on (None: no filter): at most
    :data:`MAX_FILTER_CHARS`, no control characters."""
    if value == "":
        return None
    if len(value) > MAX_FILTER_CHARS:
        raise InvalidArgument(field, f"must be at most {MAX_FILTER_CHARS} characters")
    if convert.has_control_character(value):
        raise InvalidArgument(field, "must not contain control characters")
    return value


def session_page_token(last: ListedSession) -> str:
    """Where the next page starts: after this (worker id, node id)."""
    return convert.name_page_token_to_pb(json.dumps([last.report.worker_id, last.node_id]))


def _after(token: str) -> tuple[str, str] | None:
    """The (worker id, node id) a :func:`session_page_token` holds; None for the first page."""
    text = convert.name_page_token_from_pb(token)
    if text == "":
        return None
    try:
        worker_id, node_id = json.loads(text)
    except (ValueError, TypeError, binascii.Error):
        raise InvalidArgument("page_token", "not a token this server issued") from None
    if not isinstance(worker_id, str) or not isinstance(node_id, str):
        raise InvalidArgument("page_token", "not a token this server issued")
    return worker_id, node_id


def session_query_from_pb(
    request: admin_service_pb2.ListWorkerSessionsRequest, tenant: Tenant
) -> SessionQuery:
    """What a ``ListWorkerSessions`` request asks for, checked completely: an operator's
    key lists every tenant's sessions, any other only its own.

    Raises:
        InvalidArgument: naming ``worker_id``, ``node_id`` or ``page_token``.
    """
    return SessionQuery(
        tenant_id=None if tenant.operator else tenant.id,
        worker_id=_name_filter(request.worker_id, "worker_id"),
        node_id=_name_filter(request.node_id, "node_id"),
        after=_after(request.page_token),
        limit=min(request.page_size or DEFAULT_SESSION_PAGE_SIZE, MAX_SESSION_PAGE_SIZE),
    )


def worker_session_to_pb(
    listed: ListedSession, tenant_name: str
) -> admin_service_pb2.WorkerSession:
    report = listed.report
    message = admin_service_pb2.WorkerSession(
        worker_id=report.worker_id,
        node_id=listed.node_id,
        session_id=report.session_id,
        tenant_id="" if report.tenant_id is None else str(report.tenant_id),
        tenant_name=tenant_name,
        queues=report.queues,
        task_types=report.task_types,
        slots=report.slots,
        credits=report.credits,
        running=report.running,
        draining=report.draining,
        reported_at=convert.ts_to_pb(listed.reported_at),
    )
    if report.connected_at is not None:
        message.connected_at.CopyFrom(convert.ts_to_pb(report.connected_at))
    return message


def restricted_topology(
    full: admin_service_pb2.GetTopologyResponse,
) -> admin_service_pb2.GetTopologyResponse:
    """The topology a key without the operator flag gets: each node's id, address, start,
    draining and clock skew (a worker's SDK connects to every node by it, and follows
    their drains), and nothing of the shard map, epochs or metrics endpoints."""
    nodes = []
    for node in full.nodes:
        kept = admin_service_pb2.Node(
            node_id=node.node_id,
            address=node.address,
            draining=node.draining,
            clock_skewed=node.clock_skewed,
        )
        if node.HasField("started_at"):
            kept.started_at.CopyFrom(node.started_at)
        nodes.append(kept)
    return admin_service_pb2.GetTopologyResponse(nodes=nodes, node_id=full.node_id, restricted=True)


# --- the servicer --------------------------------------------------------------------------


class AdminServicer(admin_service_pb2_grpc.AdminServiceServicer):
    def __init__(
        self,
        node_id: str,
        shard_count: int,
        coordinator: EtcdCoordinator,
        shards: ShardManager,
        drain: Callable[[], Awaitable[None]],
        undrain: Callable[[], Awaitable[None]],
        is_draining: Callable[[], bool],
        *,
        authenticator: boundary.Authenticates,
        clock: Clock,
        session_records: SessionRecords,
        own_sessions: OwnSessions,
        session_timeout_s: float,
    ) -> None:
        self._node_id = node_id
        self._shard_count = shard_count
        self._coordinator = coordinator
        self._shards = shards
        self._drain = drain
        self._undrain = undrain
        self._is_draining = is_draining
        self._authenticator = authenticator
        self._clock = clock
        self._session_records = session_records
        self._own_sessions = own_sessions
        # A record not refreshed for this long belongs to a node that died (liveness
        # refreshes every third of it).
        self._session_timeout_s = session_timeout_s

    async def GetTopology(
        self, request: admin_service_pb2.GetTopologyRequest, context: Context
    ) -> admin_service_pb2.GetTopologyResponse:
        return await boundary.serve_tenant(
            "AdminService.GetTopology",
            context,
            self._authenticator,
            lambda tenant: self._get_topology_for(tenant, request),
        )

    async def ListWorkerSessions(
        self, request: admin_service_pb2.ListWorkerSessionsRequest, context: Context
    ) -> admin_service_pb2.ListWorkerSessionsResponse:
        return await boundary.serve_tenant(
            "AdminService.ListWorkerSessions",
            context,
            self._authenticator,
            lambda tenant: self._list_worker_sessions(tenant, request),
        )

    async def ListShards(
        self, request: admin_service_pb2.ListShardsRequest, context: Context
    ) -> admin_service_pb2.ListShardsResponse:
        return await self._serve("ListShards", self._list_shards, request, context)

    async def DrainNode(
        self, request: admin_service_pb2.DrainNodeRequest, context: Context
    ) -> admin_service_pb2.DrainNodeResponse:
        return await self._serve("DrainNode", self._drain_node, request, context)

    async def UndrainNode(
        self, request: admin_service_pb2.UndrainNodeRequest, context: Context
    ) -> admin_service_pb2.UndrainNodeResponse:
        return await self._serve("UndrainNode", self._undrain_node, request, context)

    async def _serve(
        self,
        method: str,
        handler: Callable[[_Req], Awaitable[_Resp]],
        request: _Req,
        context: Context,
    ) -> _Resp:
        """Run ``handler`` inside the error boundary (:mod:`.boundary`)."""
        return await boundary.serve(f"AdminService.{method}", context, lambda: handler(request))

    # --- handlers -------------------------------------------------------------------------

    async def _get_topology_for(
        self, tenant: Tenant, request: admin_service_pb2.GetTopologyRequest
    ) -> admin_service_pb2.GetTopologyResponse:
        full = await self._get_topology(request)
        return full if tenant.operator else restricted_topology(full)

    async def _list_worker_sessions(
        self, tenant: Tenant, request: admin_service_pb2.ListWorkerSessionsRequest
    ) -> admin_service_pb2.ListWorkerSessionsResponse:
        query = session_query_from_pb(request, tenant)
        listed, more = await self._session_records.list_worker_sessions(
            query, self._session_timeout_s
        )
        live = {r.session_id: r for r in self._own_sessions.reports()}
        listed = with_live_figures(listed, self._node_id, live, self._clock.now())
        # A tenant's rows are all its own; an operator's were named by the store.
        own_name = tenant.name if query.tenant_id is not None else None
        response = admin_service_pb2.ListWorkerSessionsResponse(
            sessions=[worker_session_to_pb(row, own_name or row.tenant_name) for row in listed],
            node_id=self._node_id,
            restricted=query.tenant_id is not None,
        )
        if more and listed:
            response.next_page_token = session_page_token(listed[-1])
        return response

    async def _get_topology(
        self, request: admin_service_pb2.GetTopologyRequest
    ) -> admin_service_pb2.GetTopologyResponse:
        claims = await self._coordinator.shard_claims()
        by_node: dict[str, list[int]] = {}
        for claim in claims.values():
            by_node.setdefault(claim.node_id, []).append(claim.shard)
        nodes = []
        for info in sorted(self._shards.members.values(), key=lambda n: n.node_id):
            node = admin_service_pb2.Node(
                node_id=info.node_id,
                address=info.address,
                metrics_address=info.metrics_address,
                shards=sorted(by_node.get(info.node_id, [])),
                # etcd's record, so every node answers alike; this node's own state wins
                # for itself (it may not have seen its re-registration come back yet).
                draining=self._is_draining() if info.node_id == self._node_id else info.draining,
                clock_skewed=info.clock_skewed,
            )
            if info.started_at:
                node.started_at.FromJsonString(info.started_at)
            nodes.append(node)
        return admin_service_pb2.GetTopologyResponse(
            nodes=nodes,
            shards=[
                admin_service_pb2.ShardOwner(shard=c.shard, node_id=c.node_id, epoch=c.epoch)
                for c in sorted(claims.values(), key=lambda c: c.shard)
            ],
            shard_count=self._shard_count,
            node_id=self._node_id,
        )

    async def _list_shards(
        self, request: admin_service_pb2.ListShardsRequest
    ) -> admin_service_pb2.ListShardsResponse:
        claims = await self._coordinator.shard_claims()
        target = self._shards.target_map()
        states = []
        for shard in range(self._shard_count):
            claim = claims.get(shard)
            owner = admin_service_pb2.ShardOwner(shard=shard)
            if claim is not None:
                owner.node_id = claim.node_id
                owner.epoch = claim.epoch
            states.append(
                admin_service_pb2.ShardState(owner=owner, target_node_id=target.get(shard, ""))
            )
        return admin_service_pb2.ListShardsResponse(shards=states, shard_count=self._shard_count)

    async def _drain_node(
        self, request: admin_service_pb2.DrainNodeRequest
    ) -> admin_service_pb2.DrainNodeResponse:
        self._check_node(request.node_id, "drain")
        await self._drain()
        return admin_service_pb2.DrainNodeResponse(node=self._self_node(draining=True))

    async def _undrain_node(
        self, request: admin_service_pb2.UndrainNodeRequest
    ) -> admin_service_pb2.UndrainNodeResponse:
        self._check_node(request.node_id, "undrain")
        await self._undrain()
        return admin_service_pb2.UndrainNodeResponse(node=self._self_node(draining=False))

    def _self_node(self, *, draining: bool) -> admin_service_pb2.Node:
        node = admin_service_pb2.Node(node_id=self._node_id, draining=draining)
        info = self._shards.members.get(self._node_id)
        if info is not None:
            node.address = info.address
            node.metrics_address = info.metrics_address
        return node

    def _check_node(self, node_id: str, verb: str) -> None:
        """The request names this node (or none): else NOT_FOUND (no such live node) or
        FAILED_PRECONDITION saying where that node is."""
        if node_id in ("", self._node_id):
            return
        info = self._shards.members.get(node_id)
        if info is None:
            raise NodeNotFound(node_id)
        raise WrongNode(node_id, info.address, verb)
