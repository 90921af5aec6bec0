"""WatchdogService (the expectation registry) on a real grpc.aio server and PostgreSQL,
called through the generated stub and through ``chronoshard expect``."""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.stores import tenant_with_key
from google.protobuf import duration_pb2

from chronoshard import cli
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.expectations import WatchdogServiceServicer
from chronoshard.scheduler.core.api_keys import new_api_key
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.tenants import TenantStore, create_tenant
from chronoshard.v1 import watchdog_service_pb2 as pb
from chronoshard.v1 import watchdog_service_pb2_grpc
from chronoshard.wire import error_info_from_metadata


@dataclass
class Api:
    stub: watchdog_service_pb2_grpc.WatchdogServiceStub
    address: str
    dsn: str
    tenant: Tenant
    key: str

    def auth(self, key: str | None = None) -> Sequence[tuple[str, str]]:
        return (("authorization", f"Bearer {key or self.key}"),)


def seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    whole = int(value)
    d.seconds, d.nanos = whole, round((value - whole) * 1e9)
    return d


@pytest.fixture
async def api(db_dsn: str, caplog: pytest.LogCaptureFixture) -> AsyncIterator[Api]:
    caplog.set_level(logging.INFO)  # the servicer's log lines run (and must not raise)
    # The module's database; every test gets a tenant of its own.
    store = await Store.open(db_dsn, 1, 4)
    server = grpc.aio.server()
    watchdog_service_pb2_grpc.add_WatchdogServiceServicer_to_server(
        WatchdogServiceServicer(store=store, authenticator=Authenticator(TenantStore(store))),
        server,
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tenant, key = await tenant_with_key(store)
    address = f"127.0.0.1:{port}"
    async with grpc.aio.insecure_channel(address) as channel:
        yield Api(
            watchdog_service_pb2_grpc.WatchdogServiceStub(channel), address, db_dsn, tenant, key
        )
    await server.stop(None)
    await store.close()


async def rows(api: Api) -> list[tuple[Any, ...]]:
    """The test tenant's expectations as stored."""
    async with await psycopg.AsyncConnection.connect(api.dsn) as conn:
        cur = await conn.execute(
            "SELECT tenant_id, job_id, interval_s, tolerance_s, severity, enabled, source"
            " FROM expectations WHERE tenant_id = %s ORDER BY job_id",
            (api.tenant.id,),
        )
        return await cur.fetchall()


async def refused(call: Any) -> tuple[grpc.StatusCode, Any]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), error_info_from_metadata(info.value.trailing_metadata())


async def test_create_replace_list_and_delete(api: Api) -> None:
    created = await api.stub.CreateExpectation(
        pb.CreateExpectationRequest(
            job_id="nightly",
            interval=seconds(86400),
            tolerance=seconds(600.5),
            severity=pb.SEVERITY_WARNING,
            description="the nightly report",
        ),
        metadata=api.auth(),
        timeout=10,
    )
    assert created.created
    exp = created.expectation
    assert exp.job_id == "nightly" and exp.enabled and not exp.from_config
    assert exp.interval.seconds == 86400 and exp.tolerance.ToTimedelta().total_seconds() == 600.5
    assert exp.severity == pb.SEVERITY_WARNING

    replaced = await api.stub.CreateExpectation(
        pb.CreateExpectationRequest(job_id="nightly", interval=seconds(3600), enabled=False),
        metadata=api.auth(),
        timeout=10,
    )
    assert not replaced.created
    assert replaced.expectation.created_at == exp.created_at  # registration time kept
    assert not replaced.expectation.enabled
    assert await rows(api) == [(api.tenant.id, "nightly", 3600.0, 0.0, "critical", False, "api")]

    for job in ("a", "b", "c"):
        await api.stub.CreateExpectation(
            pb.CreateExpectationRequest(job_id=job, interval=seconds(60)),
            metadata=api.auth(),
            timeout=10,
        )
    first = await api.stub.ListExpectations(
        pb.ListExpectationsRequest(page_size=3), metadata=api.auth(), timeout=10
    )
    assert [e.job_id for e in first.expectations] == ["a", "b", "c"]
    assert first.next_page_token
    second = await api.stub.ListExpectations(
        pb.ListExpectationsRequest(page_size=3, page_token=first.next_page_token),
        metadata=api.auth(),
        timeout=10,
    )
    assert [e.job_id for e in second.expectations] == ["nightly"]
    assert second.next_page_token == ""

    deleted = await api.stub.DeleteExpectation(
        pb.DeleteExpectationRequest(job_id="b"), metadata=api.auth(), timeout=10
    )
    assert deleted.expectation.job_id == "b"
    code, info = await refused(
        api.stub.DeleteExpectation(
            pb.DeleteExpectationRequest(job_id="b"), metadata=api.auth(), timeout=10
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND and info.reason == "EXPECTATION_NOT_FOUND"


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.CreateExpectationRequest(job_id="j", interval=seconds(0)), "interval"),
        (pb.CreateExpectationRequest(job_id="j", interval=seconds(-60)), "interval"),
        (pb.CreateExpectationRequest(job_id="j"), "interval"),
        (pb.CreateExpectationRequest(job_id="j", interval=seconds(1), tolerance=seconds(-1)),
         "tolerance"),
        (pb.CreateExpectationRequest(job_id="", interval=seconds(1)), "job_id"),
    ],
)  # fmt: skip
async def test_malformed_expectations_are_refused_naming_the_field_and_nothing_is_written(
    api: Api, request_: pb.CreateExpectationRequest, field: str
) -> None:
    code, info = await refused(
        api.stub.CreateExpectation(request_, metadata=api.auth(), timeout=10)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.reason == "INVALID_ARGUMENT" and info.field == field
    assert field in info.message
    assert await rows(api) == []


async def test_an_unknown_tenant_is_unauthenticated(api: Api) -> None:
    request = pb.CreateExpectationRequest(job_id="j", interval=seconds(60))
    code, info = await refused(
        api.stub.CreateExpectation(request, metadata=api.auth(new_api_key()), timeout=10)
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED and info.reason == "UNAUTHENTICATED"
    code, _ = await refused(api.stub.ListExpectations(pb.ListExpectationsRequest(), timeout=10))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert await rows(api) == []


async def test_tenants_see_only_their_own_and_config_expectations_are_read_only(
    api: Api,
) -> None:
    store = await Store.open(api.dsn, 1, 1)
    _, other_key = await tenant_with_key(store)
    await store.close()
    await api.stub.CreateExpectation(
        pb.CreateExpectationRequest(job_id="mine", interval=seconds(60)),
        metadata=api.auth(),
        timeout=10,
    )
    theirs = await api.stub.ListExpectations(
        pb.ListExpectationsRequest(), metadata=api.auth(other_key), timeout=10
    )
    assert list(theirs.expectations) == []
    code, _ = await refused(
        api.stub.DeleteExpectation(
            pb.DeleteExpectationRequest(job_id="mine"), metadata=api.auth(other_key), timeout=10
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND

    async with await psycopg.AsyncConnection.connect(api.dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE expectations SET source = 'config' WHERE tenant_id = %s AND job_id = 'mine'",
            (api.tenant.id,),
        )
    request = pb.CreateExpectationRequest(job_id="mine", interval=seconds(5))
    code, info = await refused(api.stub.CreateExpectation(request, metadata=api.auth(), timeout=10))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.reason == "EXPECTATION_MANAGED_BY_CONFIG"
    code, _ = await refused(
        api.stub.DeleteExpectation(
            pb.DeleteExpectationRequest(job_id="mine"), metadata=api.auth(), timeout=10
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    [listed] = (
        await api.stub.ListExpectations(pb.ListExpectationsRequest(), metadata=api.auth())
    ).expectations
    assert listed.from_config and listed.interval.seconds == 60


def run_cli(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main(args, out=out)
    return code, out.getvalue()


async def test_the_cli_adds_lists_and_removes(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--target", api.address, "--api-key", api.key]
    code, out = await asyncio.to_thread(
        run_cli,
        ["expect", "add", "backup", "--every", "1d", "--tolerance", "30m", "--severity",
         "error", "--description", "nightly backup", *common],
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert out.startswith("created backup")
    code, out = await asyncio.to_thread(run_cli, ["expect", "ls", *common])
    assert code == 0
    assert out.split() == ["backup", "every", "1d", "+30m", "error", "enabled", "api", "nightly",
                           "backup"]  # fmt: skip

    code, _ = await asyncio.to_thread(run_cli, ["expect", "add", "backup", "--every=-5s", *common])
    assert code == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "(field interval)" in err and "must be positive" in err

    code, out = await asyncio.to_thread(run_cli, ["expect", "rm", "backup", *common])
    assert (code, out) == (0, "removed backup\n")
    code, _ = await asyncio.to_thread(run_cli, ["expect", "rm", "backup", *common])
    assert code == cli.EXIT_NOT_FOUND  # NOT_FOUND is exit code 3 for every command
    assert "EXPECTATION_NOT_FOUND" in capsys.readouterr().err


async def _alert(
    dsn: str,
    tenant: Tenant | None,
    job_id: str,
    *,
    opened_ago_s: float,
    resolved_ago_s: float | None = None,
    severity: str = "critical",
) -> int:
    """An alert row as the watchdog writes one (watchdog/store.py ``open_alert``)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "INSERT INTO alerts (kind, dedup_key, tenant_id, job_id, severity, summary,"
            " opened_at, resolved_at) VALUES ('job_overdue', %s, %s, %s, %s, %s,"
            " now() - make_interval(secs => %s),"
            " now() - make_interval(secs => %s)) RETURNING id",
            (
                f"job/{job_id}/{opened_ago_s}",
                None if tenant is None else tenant.id,
                job_id,
                severity,
                f"{job_id} is overdue",
                opened_ago_s,
                resolved_ago_s,
            ),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_incidents_are_the_tenant_s_own_newest_first_open_or_recently_resolved(
    api: Api,
) -> None:
    async with await Store.open(api.dsn, 1, 1) as store:
        other, _ = await tenant_with_key(store)
    open_old = await _alert(api.dsn, api.tenant, "etl", opened_ago_s=600)
    open_new = await _alert(api.dsn, api.tenant, "report", opened_ago_s=60, severity="warning")
    resolved = await _alert(api.dsn, api.tenant, "backup", opened_ago_s=300, resolved_ago_s=120)
    await _alert(api.dsn, api.tenant, "ancient", opened_ago_s=200_000, resolved_ago_s=100_000)
    await _alert(api.dsn, other, "etl", opened_ago_s=30)  # another tenant's
    await _alert(api.dsn, None, "chronoshard/canary", opened_ago_s=10)  # the cluster's

    answer = await api.stub.ListIncidents(pb.ListIncidentsRequest(), metadata=api.auth())
    assert [i.id for i in answer.incidents] == [open_new, open_old]
    assert answer.incidents[0].severity == pb.SEVERITY_WARNING
    assert answer.incidents[0].summary == "report is overdue"
    assert not answer.incidents[0].HasField("resolved_at")

    recent = await api.stub.ListIncidents(
        pb.ListIncidentsRequest(include_resolved=True), metadata=api.auth()
    )
    assert [i.id for i in recent.incidents] == [open_new, resolved, open_old]
    assert recent.incidents[1].HasField("resolved_at")

    one = await api.stub.ListIncidents(pb.ListIncidentsRequest(page_size=1), metadata=api.auth())
    assert [i.id for i in one.incidents] == [open_new]


async def test_an_operator_lists_every_tenants_incidents_and_the_clusters_own(api: Api) -> None:
    operator = await asyncio.to_thread(
        create_tenant, api.dsn, f"ops-{uuid.uuid4().hex[:8]}", operator=True
    )
    async with await Store.open(api.dsn, 1, 1) as store:
        other, _ = await tenant_with_key(store)
    mine = await _alert(api.dsn, api.tenant, "etl", opened_ago_s=90)
    theirs = await _alert(api.dsn, other, "etl", opened_ago_s=60)
    cluster = await _alert(api.dsn, None, "chronoshard/canary", opened_ago_s=30)
    old = await _alert(api.dsn, other, "old", opened_ago_s=5_000, resolved_ago_s=4_000)

    every = await api.stub.ListIncidents(
        pb.ListIncidentsRequest(all_tenants=True, include_resolved=True, page_size=1000),
        metadata=api.auth(operator.api_key),
    )
    # Other tests' alerts share the module's database: ours, in their order.
    ours = [i for i in every.incidents if i.id in (mine, theirs, cluster, old)]
    assert [i.id for i in ours] == [cluster, theirs, mine, old]
    by_id = {i.id: (i.tenant_id, i.tenant_name) for i in ours}
    assert by_id[mine] == (str(api.tenant.id), api.tenant.name)
    assert by_id[theirs] == (str(other.id), other.name)
    assert by_id[cluster] == ("", "")  # the cluster's own: no tenant
    # The tenant's own listing is as before: its own, without naming the tenant.
    own = await api.stub.ListIncidents(pb.ListIncidentsRequest(), metadata=api.auth())
    assert [(i.id, i.tenant_id) for i in own.incidents] == [(mine, "")]

    code, info = await refused(
        api.stub.ListIncidents(pb.ListIncidentsRequest(all_tenants=True), metadata=api.auth())
    )
    assert code is grpc.StatusCode.PERMISSION_DENIED and info is not None
    assert info.message == (
        "ListIncidents with all_tenants needs an operator API key "
        "(chronoshard tenants create NAME --operator)"
    )
