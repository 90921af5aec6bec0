"""``AdminService``: the cluster as this node sees it (topology, shards) and node drain.

Topology comes from etcd (live nodes, current claims with their epochs), so any node
answers for the whole cluster; workers use it to discover every node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from chronoshard.scheduler import boundary
from chronoshard.scheduler.coordination import CoordinationError, EtcdCoordinator
from chronoshard.scheduler.errors import shown
from chronoshard.scheduler.shards import ShardManager
from chronoshard.v1 import admin_service_pb2, admin_service_pb2_grpc, common_pb2


class AdminServicer(admin_service_pb2_grpc.AdminServiceServicer):
    def __init__(
        self,
        node_id: str,
        shard_count: int,
        coordinator: EtcdCoordinator,
        shards: ShardManager,
        drain: Callable[[], Awaitable[None]],
        is_draining: Callable[[], bool],
    ) -> None:
        self._node_id = node_id
        self._shard_count = shard_count
        self._coordinator = coordinator
        self._shards = shards
        self._drain = drain
        self._is_draining = is_draining

    async def GetTopology(
        self,
        request: admin_service_pb2.GetTopologyRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_service_pb2.GetTopologyResponse:
        claims = await self._claims(context)
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
                draining=info.node_id == self._node_id and self._is_draining(),
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

    async def ListShards(
        self,
        request: admin_service_pb2.ListShardsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_service_pb2.ListShardsResponse:
        claims = await self._claims(context)
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

    async def DrainNode(
        self,
        request: admin_service_pb2.DrainNodeRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_service_pb2.DrainNodeResponse:
        if request.node_id not in ("", self._node_id):
            info = self._shards.members.get(request.node_id)
            where = f" (at {info.address})" if info else ""
            await boundary.abort(
                context,
                common_pb2.ErrorInfo(
                    code="FAILED_PRECONDITION",
                    reason="WRONG_NODE",
                    message=f"ask node {shown(request.node_id)}{where} to drain itself",
                    field="node_id",
                ),
            )
        await self._drain()
        return admin_service_pb2.DrainNodeResponse(
            node=admin_service_pb2.Node(node_id=self._node_id, draining=True)
        )

    async def _claims(self, context: grpc.aio.ServicerContext[Any, Any]) -> dict[int, Any]:
        try:
            return await self._coordinator.shard_claims()
        except CoordinationError as exc:
            await boundary.abort(
                context,
                common_pb2.ErrorInfo(
                    code="UNAVAILABLE", reason=exc.reason, message=str(exc), retryable=True
                ),
            )
