"""Regions: a cluster serves the tenants homed in its region (and the ones it adopted in a
disaster recovery) and sends the others home with FAILED_PRECONDITION/WRONG_REGION.

Two clusters of one node each, "east" and "west", each with its own database (a region
owns its tenants' data); the tenant directory is in both, as a multi-region deployment
keeps it. A client given the regions' targets follows the refusal to the tenant's home.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace

import grpc
import psycopg
import pytest
import pytest_asyncio
from fixtures.databases import database_from_template
from fixtures.nodes import node_config, running_node
from fixtures.waiting import eventually

from chronoshard import Client, TaskStatus, WrongRegionError
from chronoshard.scheduler.config import RegionConfig, SchedulerConfig
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.scheduler.store.tenants import create_tenant, update_tenant
from chronoshard.services import EtcdProcess, PostgresServer

SHARDS = 4
pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Regions:
    east: SchedulerNode
    west: SchedulerNode
    east_dsn: str
    west_dsn: str

    def target(self, node: SchedulerNode) -> str:
        assert node.addresses is not None
        return node.addresses.grpc


@pytest.fixture(scope="module")
def west_dsn(postgres_server: PostgresServer, template_database: str) -> Iterator[str]:
    with database_from_template(postgres_server, template_database) as dsn:
        yield dsn


def _in_region(config: SchedulerConfig, name: str, *adopted: str) -> SchedulerConfig:
    return replace(config, region=RegionConfig(name=name, adopted=adopted))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def regions(db_dsn: str, west_dsn: str, etcd: EtcdProcess) -> AsyncIterator[Regions]:
    east_config = _in_region(node_config(db_dsn, etcd.endpoint, shard_count=SHARDS), "east")
    west_config = _in_region(node_config(west_dsn, etcd.endpoint, shard_count=SHARDS), "west")
    async with running_node(east_config) as east, running_node(west_config) as west:
        for node in (east, west):
            await eventually(
                lambda node=node: len(node.shards.epochs()) == SHARDS,
                timeout_s=10,
                what="all shards claimed",
            )
        yield Regions(east, west, db_dsn, west_dsn)


def _tenant_in_both(regions: Regions, home: str) -> tuple[str, str]:
    """A tenant homed in ``home``, known to both regions' directories with one key."""
    made = create_tenant(regions.east_dsn, f"r-{home}-{uuid.uuid4().hex[:8]}", home_region=home)
    row = made.tenant
    with psycopg.connect(regions.west_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO tenants (id, name, tier, rate_limit_rps, max_concurrent_workers,"
            " home_region, api_key_hash) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                row.id,
                row.name,
                row.tier,
                row.rate_limit_rps,
                row.max_concurrent_workers,
                row.home_region,
                row.api_key_hash,
            ),
        )
    return row.name, made.api_key


async def test_a_tenant_homed_elsewhere_is_refused_naming_its_home_and_nothing_is_written(
    regions: Regions,
) -> None:
    _, key = _tenant_in_both(regions, "west")
    async with Client(regions.target(regions.east), api_key=key) as client:
        with pytest.raises(WrongRegionError) as refused:
            await client.submit("noop", {"n": 1}, idempotency_key="k-1")
    error = refused.value
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "WRONG_REGION"
    assert error.home_region == "west"
    assert error.metadata["region"] == "east"
    assert "'west'" in error.details and "'east'" in error.details
    with psycopg.connect(regions.east_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM tasks WHERE idempotency_key = 'k-1'").fetchone()
    assert row == (0,)


async def test_a_client_given_the_regions_follows_the_tenant_home_and_stays_there(
    regions: Regions,
) -> None:
    _, key = _tenant_in_both(regions, "west")
    east, west = regions.target(regions.east), regions.target(regions.west)
    async with Client(east, api_key=key, regions={"west": west, "east": east}) as client:
        first = await client.submit("noop", {"n": 1})
        second = await client.submit("noop", {"n": 2})
        assert client.targets == (west,)
        # Both tasks live in the home region's database, none in the one that refused.
        for made in (first, second):
            assert (await client.get(made.task.id)).status in set(TaskStatus)
    with psycopg.connect(regions.east_dsn) as conn:
        east_rows = conn.execute(
            "SELECT count(*) FROM tasks WHERE id = ANY(%s)",
            ([first.task.id, second.task.id],),
        ).fetchone()
    assert east_rows == (0,)


async def test_a_client_without_the_home_region_raises_instead_of_guessing(
    regions: Regions,
) -> None:
    _, key = _tenant_in_both(regions, "north")
    east, west = regions.target(regions.east), regions.target(regions.west)
    async with Client(east, api_key=key, regions={"west": west}) as client:
        with pytest.raises(WrongRegionError) as refused:
            await client.submit("noop", {})
    assert refused.value.home_region == "north"


async def test_a_tenant_rehomed_live_is_served_where_it_now_lives(regions: Regions) -> None:
    name, key = _tenant_in_both(regions, "west")
    update_tenant(regions.east_dsn, name, home_region="east")
    # The node's authentication cache may hold the tenant for 30 s; a fresh key lookup
    # is what a node that never saw it does. This node saw nothing of it yet.
    async with Client(regions.target(regions.east), api_key=key) as client:
        made = await client.submit("noop", {})
        assert (await client.get(made.task.id)).id == made.task.id


async def test_an_adopting_cluster_serves_the_failed_region_s_tenants(
    regions: Regions, db_dsn: str, etcd: EtcdProcess
) -> None:
    _, key = _tenant_in_both(regions, "south")
    config = _in_region(node_config(db_dsn, etcd.endpoint, shard_count=SHARDS), "east", "south")
    async with (
        running_node(config) as adopting,
        Client(regions.target(adopting), api_key=key) as client,
    ):
        made = await client.submit("noop", {})
        assert (await client.get(made.task.id)).id == made.task.id
