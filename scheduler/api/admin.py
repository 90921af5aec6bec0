"""``AdminService``: the cluster as this node sees it (topology, shards), node drain and
undrain.

Topology comes from etcd (live nodes with their draining flag, current claims with their
epochs), so any node answers for the whole cluster; workers use it to discover every
node. Drain and undrain act on the node asked; asked of another node they answer
FAILED_PRECONDITION naming where to ask.

Every RPC runs inside the node's one error boundary (:func:`.boundary.serve`, as
TaskService's do): a :class:`~.errors.SchedulerError` (etcd away, a node id naming no
live node) leaves as its status with a bounded message and the ``ErrorInfo`` trailer;
anything else is a bug, logged with its traceback and answered ``INTERNAL``, never
grpc's ``UNKNOWN`` with the exception's text. (Access is checked before, by the
interceptor of ``access.py``.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from chronoshard.scheduler.api import boundary
from chronoshard.scheduler.cluster.coordination import EtcdCoordinator
from chronoshard.scheduler.cluster.shards import ShardManager
from chronoshard.scheduler.errors import NodeNotFound, WrongNode
from chronoshard.v1 import admin_service_pb2, admin_service_pb2_grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


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
    ) -> None:
        self._node_id = node_id
        self._shard_count = shard_count
        self._coordinator = coordinator
        self._shards = shards
        self._drain = drain
        self._undrain = undrain
        self._is_draining = is_draining

    async def GetTopology(
        self, request: admin_service_pb2.GetTopologyRequest, context: Context
    ) -> admin_service_pb2.GetTopologyResponse:
        return await self._serve("GetTopology", self._get_topology, request, context)

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
