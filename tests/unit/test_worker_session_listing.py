"""The pure parts of ``AdminService.ListWorkerSessions`` and of the restricted topology:
how a node describes its live streams (``core/worker_sessions.py``), how its own live
figures replace its last record's, how a request is read and a page token made
(``api/admin.py``), what a tenant's key is shown of the topology, and the client's view
of an answer. Against real nodes and workers: tests/integration/test_admin_api.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest
from fixtures.rows import session_report, tenant_model

from chronoshard import _convert as convert
from chronoshard.clock import FakeClock
from chronoshard.scheduler.api.admin import (
    restricted_topology,
    session_page_token,
    session_query_from_pb,
    worker_session_to_pb,
)
from chronoshard.scheduler.core.worker_sessions import (
    DescribedSessions,
    ListedSession,
    SessionOwners,
    with_live_figures,
)
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.v1 import admin_service_pb2

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@dataclass
class Stream:
    """What the dispatch path's WorkerSession holds, as far as a listing goes."""

    worker_id: str
    session_id: str
    queues: frozenset[str] = frozenset({"default"})
    types: frozenset[str] = frozenset({"b.type", "a.type"})
    slots: int = 4
    credits: int = 2
    draining: bool = False
    assigned: dict[str, object] = field(default_factory=dict)
    opened_at: float = 0.0


class Registry:
    def __init__(self, *streams: Stream) -> None:
        self.streams = list(streams)

    def live(self) -> list[Stream]:
        return list(self.streams)


def test_a_node_describes_its_streams_with_their_owner_and_opening_on_the_cluster_clock() -> None:
    clock = FakeClock(start=NOW, monotonic_start=1000.0)
    owner = uuid.uuid4()
    owners = SessionOwners()
    late = Stream("w2", "n/2", opened_at=990.0, assigned={"t1": 1, "t2": 2}, draining=True)
    early = Stream("w1", "n/1", opened_at=940.0)
    owners.opened("n/2", owner)
    owners.opened("n/1", None)  # the node could not tell whose it is
    described = DescribedSessions(Registry(late, early), owners, clock).reports()
    assert [r.worker_id for r in described] == ["w1", "w2"]  # by worker id
    first, second = described
    assert first.tenant_id is None and first.connected_at == NOW - timedelta(seconds=60)
    assert (second.tenant_id, second.session_id) == (owner, "n/2")
    assert second.task_types == ("a.type", "b.type") and second.queues == ("default",)
    assert (second.slots, second.credits, second.running, second.draining) == (4, 2, 2, True)
    owners.closed("n/2")
    owners.closed("n/1")
    owners.closed("n/1")  # twice: nothing happens
    assert len(owners) == 0


def _listed(node_id: str, worker_id: str, **fields: object) -> ListedSession:
    report = replace(session_report(worker_id, session_id=f"{node_id}/{worker_id}"), **fields)
    return ListedSession(node_id, report, "acme", NOW - timedelta(seconds=4))


def test_the_answering_nodes_own_rows_carry_its_live_figures_and_the_rest_their_record() -> None:
    tenant = uuid.uuid4()
    mine = _listed("a", "w1", tenant_id=tenant, credits=1, running=0)
    gone = _listed("a", "w2", tenant_id=tenant)  # closed here since its last record
    elsewhere = _listed("b", "w1", tenant_id=tenant, credits=3)
    live = replace(mine.report, credits=0, running=4, tenant_id=None)
    # A live stream of another worker under gone's old id (a restarted node counts anew).
    stranger = replace(session_report("w9", session_id="a/w2"), running=7)
    answered = with_live_figures(
        [mine, gone, elsewhere], "a", {"a/w1": live, "a/w2": stranger}, NOW
    )
    assert [(r.node_id, r.report.worker_id) for r in answered] == [
        ("a", "w1"),
        ("a", "w2"),
        ("b", "w1"),
    ]
    fresh, kept, other = answered
    assert (fresh.report.credits, fresh.report.running, fresh.reported_at) == (0, 4, NOW)
    assert fresh.report.tenant_id == tenant  # as recorded: the listing chose it by that
    assert kept == gone and other == elsewhere


def test_a_request_lists_the_tenants_own_unless_the_key_is_an_operators() -> None:
    tenant = tenant_model()
    request = admin_service_pb2.ListWorkerSessionsRequest(worker_id="w1", page_size=5000)
    query = session_query_from_pb(request, tenant)
    assert (query.tenant_id, query.worker_id, query.node_id, query.after) == (
        tenant.id,
        "w1",
        None,
        None,
    )
    assert query.limit == 1000  # capped
    operator = replace(tenant, operator=True)
    everyone = session_query_from_pb(admin_service_pb2.ListWorkerSessionsRequest(), operator)
    assert everyone.tenant_id is None and everyone.limit == 100


def test_a_page_token_leads_on_from_the_last_session_of_the_page() -> None:
    last = _listed("node-b", "wörker 7")
    token = session_page_token(last)
    request = admin_service_pb2.ListWorkerSessionsRequest(page_token=token)
    assert session_query_from_pb(request, tenant_model()).after == ("wörker 7", "node-b")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"worker_id": "x" * 201}, "worker_id"),
        ({"node_id": "a\nb"}, "node_id"),
        ({"page_token": "not base64!"}, "page_token"),
        ({"page_token": "WzFd"}, "page_token"),  # [1]: JSON, not a pair of names
        ({"page_token": "eyJhIjogMX0"}, "page_token"),  # {"a": 1}
    ],
)
def test_a_bad_request_names_its_field(fields: dict[str, str], field: str) -> None:
    request = admin_service_pb2.ListWorkerSessionsRequest(**fields)
    with pytest.raises(InvalidArgument) as refused:
        session_query_from_pb(request, tenant_model())
    assert refused.value.field == field and len(str(refused.value)) < 100


def test_the_client_reads_a_session_as_the_server_wrote_it() -> None:
    tenant = uuid.uuid4()
    listed = _listed("node-a", "w1", tenant_id=tenant, running=2)
    page = admin_service_pb2.ListWorkerSessionsResponse(
        sessions=[worker_session_to_pb(listed, "acme")], node_id="node-a", restricted=True
    )
    read = convert.worker_session_page_from_pb(page)
    assert read.restricted and read.answered_by == "node-a" and read.next_page_token is None
    [session] = read.sessions
    assert (session.worker_id, session.node_id, session.tenant_id, session.tenant_name) == (
        "w1",
        "node-a",
        str(tenant),
        "acme",
    )
    assert (session.queues, session.task_types, session.running) == (("default",), ("t",), 2)
    assert session.reported_at == listed.reported_at
    assert session.connected_at == listed.report.connected_at
    unknown = convert.worker_session_from_pb(
        worker_session_to_pb(_listed("n", "w", tenant_id=None, connected_at=None), "")
    )
    assert unknown.tenant_id is None and unknown.connected_at is None


def test_a_tenants_topology_has_the_nodes_and_nothing_of_the_shards_or_the_metrics() -> None:
    full = admin_service_pb2.GetTopologyResponse(
        nodes=[
            admin_service_pb2.Node(
                node_id="n1",
                address="10.0.0.1:7070",
                metrics_address="10.0.0.1:9090",
                shards=[0, 1],
                draining=True,
                clock_skewed=True,
            )
        ],
        shards=[admin_service_pb2.ShardOwner(shard=0, node_id="n1", epoch=9)],
        shard_count=2,
        node_id="n1",
    )
    full.nodes[0].started_at.FromDatetime(NOW)
    shown = restricted_topology(full)
    assert shown.restricted and shown.node_id == "n1"
    assert (list(shown.shards), shown.shard_count) == ([], 0)
    [node] = shown.nodes
    assert (node.node_id, node.address, node.draining, node.clock_skewed) == (
        "n1",
        "10.0.0.1:7070",
        True,
        True,
    )
    assert node.metrics_address == "" and list(node.shards) == []
    assert node.started_at.ToDatetime(tzinfo=UTC) == NOW
