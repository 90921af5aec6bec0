"""The shared fixtures run real servers, and clean up after themselves.

Every integration and e2e test leans on these guarantees: etcd and PostgreSQL are real
processes reached over loopback, a restarted etcd keeps its data, a killed one leaves no
process behind, each test module gets its own migrated database, and async tests run
on uvloop.
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import urllib.request
from pathlib import Path

import psutil
import psycopg
import pytest
import uvloop
from etcd3aio import Etcd3Client
from fixtures.etcd import EtcdFactory

from chronoshard.services import EtcdProcess, PostgresServer, ServiceError, find_etcd_binary

CALL_TIMEOUT_S = 5.0
CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
# Straight to loopback, whatever proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _health(member: EtcdProcess, timeout_s: float) -> bool:
    with _DIRECT.open(f"{member.client_url}/health", timeout=timeout_s) as response:
        return bool(json.loads(response.read())["health"] == "true")


def _process_tree(pid: int) -> list[int]:
    parent = psutil.Process(pid)
    return [pid, *(child.pid for child in parent.children(recursive=True))]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _put(endpoint: str, key: str, value: str) -> None:
    async with Etcd3Client([endpoint]) as client:
        assert client.kv is not None
        await client.kv.put(key, value, timeout=CALL_TIMEOUT_S)


async def _get(endpoint: str, key: str) -> list[bytes]:
    async with Etcd3Client([endpoint]) as client:
        assert client.kv is not None
        response = await client.kv.get(key, timeout=CALL_TIMEOUT_S)
        return [kv.value for kv in response.kvs]


# --- asyncio ---------------------------------------------------------------------


async def test_async_tests_run_on_uvloop() -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)


# --- etcd ------------------------------------------------------------------------


def test_session_etcd_is_a_real_etcd_process(etcd: EtcdProcess) -> None:
    process = psutil.Process(etcd.pid)
    assert process.name() == "etcd"
    assert Path(process.exe()).resolve() == Path(find_etcd_binary()).resolve()
    assert etcd.endpoint == f"127.0.0.1:{etcd.client_port}"
    assert _health(etcd, CALL_TIMEOUT_S)


async def test_etcd_put_get_and_lease(etcd: EtcdProcess, etcd_cluster_prefix: str) -> None:
    key = f"{etcd_cluster_prefix}/plain"
    leased_key = f"{etcd_cluster_prefix}/leased"
    async with Etcd3Client([etcd.endpoint]) as client:
        assert client.kv is not None and client.lease is not None
        await client.kv.put(key, "hello", timeout=CALL_TIMEOUT_S)
        assert [kv.value for kv in (await client.kv.get(key, timeout=CALL_TIMEOUT_S)).kvs] == [
            b"hello"
        ]

        lease = await client.lease.grant(30, timeout=CALL_TIMEOUT_S)
        assert lease.ID != 0 and lease.TTL > 0
        await client.kv.put(leased_key, "bound", lease=lease.ID, timeout=CALL_TIMEOUT_S)
        alive = await client.lease.time_to_live(lease.ID, keys=True, timeout=CALL_TIMEOUT_S)
        assert list(alive.keys) == [leased_key.encode()]

        await client.lease.revoke(lease.ID, timeout=CALL_TIMEOUT_S)
        assert (await client.kv.get(leased_key, timeout=CALL_TIMEOUT_S)).count == 0
        assert (await client.kv.get(key, timeout=CALL_TIMEOUT_S)).count == 1


async def test_etcd_restart_keeps_data_and_ports(etcd_factory: EtcdFactory) -> None:
    member = etcd_factory()
    endpoint, old_pid = member.endpoint, member.pid
    await _put(endpoint, "/restart/key", "survives")

    await asyncio.to_thread(member.restart)

    assert member.endpoint == endpoint
    assert member.pid != old_pid and _gone(old_pid)
    assert await _get(endpoint, "/restart/key") == [b"survives"]


async def test_etcd_kill_leaves_no_process_and_data_survives(
    etcd_factory: EtcdFactory,
) -> None:
    member = etcd_factory()
    await _put(member.endpoint, "/crash/key", "written before the crash")
    pid = member.pid

    member.kill()

    assert not member.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    await asyncio.to_thread(member.restart)
    assert await _get(member.endpoint, "/crash/key") == [b"written before the crash"]


def test_etcd_pause_stops_answers_until_resume(etcd_factory: EtcdFactory) -> None:
    member = etcd_factory()
    member.pause()
    assert psutil.Process(member.pid).status() == psutil.STATUS_STOPPED
    with pytest.raises(TimeoutError):
        _health(member, timeout_s=0.3)

    member.resume()

    assert _health(member, CALL_TIMEOUT_S)


def test_etcd_close_ends_a_paused_member_and_deletes_its_temp_dir() -> None:
    member = EtcdProcess(fsync=False)
    member.start()
    pid, data_dir = member.pid, member.data_dir
    assert (data_dir / "etcd.log").exists()
    member.pause()  # a stopped process acts on nothing but SIGKILL: close must cope

    member.close()

    assert _gone(pid)
    assert not data_dir.exists()


def test_etcd_never_mistakes_another_server_on_its_port_for_itself(
    etcd_factory: EtcdFactory,
) -> None:
    holder = etcd_factory()
    intruder = EtcdProcess(client_port=holder.client_port, peer_port=holder.client_port + 1)

    try:
        with pytest.raises(ServiceError, match="in use"):
            intruder.start()
        assert not intruder.running
    finally:
        intruder.close()

    assert holder.running and _health(holder, CALL_TIMEOUT_S)


# --- PostgreSQL ------------------------------------------------------------------


def test_server_version_is_at_least_14(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        assert conn.info.server_version >= 140000


def test_db_dsn_has_migrations_applied(db_dsn: str, template_database: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        (database,) = conn.execute("SELECT current_database()").fetchone() or (None,)
        (applied,) = conn.execute("SELECT count(*) FROM schema_migrations").fetchone() or (0,)
    assert database != template_database
    assert applied > 0


def test_fresh_db_dsn_is_isolated_from_the_module_database(db_dsn: str, fresh_db_dsn: str) -> None:
    assert fresh_db_dsn != db_dsn
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE only_in_fresh (id int)")
    with psycopg.connect(db_dsn) as conn:
        (found,) = conn.execute("SELECT to_regclass('only_in_fresh') IS NOT NULL").fetchone() or (
            True,
        )
    assert found is False


def test_each_module_gets_its_own_database_and_all_are_dropped(
    pytester: pytest.Pytester,
    postgres_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run a two-module session against this session's server, through our conftest."""
    monkeypatch.setenv("CHRONOSHARD_TEST_DSN", postgres_server.admin_dsn)
    before = _database_names(postgres_server)
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    record = pytester.path / "databases.txt"
    monkeypatch.setenv("PROBE_RECORD", str(record))
    probe = textwrap.dedent(
        """
        import os
        import psycopg

        def test_record(db_dsn, request):
            with psycopg.connect(db_dsn) as conn:
                name = conn.execute("SELECT current_database()").fetchone()[0]
                applied = conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0]
            with open(os.environ["PROBE_RECORD"], "a") as out:
                out.write(f"{request.module.__name__} {name} {applied}\\n")
        """
    )
    pytester.makepyfile(test_first=probe, test_second=probe)

    result = pytester.runpytest_inprocess()

    result.assert_outcomes(passed=2)
    rows = [line.split() for line in record.read_text().splitlines()]
    assert sorted(module for module, _, _ in rows) == ["test_first", "test_second"]
    assert len({database for _, database, _ in rows}) == 2
    assert all(int(applied) > 0 for _, _, applied in rows)
    assert _database_names(postgres_server) == before


def test_drop_database_ends_open_sessions(postgres_server: PostgresServer) -> None:
    postgres_server.create_database("chronoshard_test_drop_probe")
    lingering = psycopg.connect(postgres_server.dsn_for("chronoshard_test_drop_probe"))
    try:
        postgres_server.drop_database("chronoshard_test_drop_probe")
        assert "chronoshard_test_drop_probe" not in _database_names(postgres_server)
        with pytest.raises(psycopg.OperationalError):
            lingering.execute("SELECT 1")
    finally:
        lingering.close()


def test_embedded_postgres_runs_unprivileged_and_stops_completely() -> None:
    server = PostgresServer(fsync=False)
    server.start()
    try:
        assert server.pid is not None
        tree = _process_tree(server.pid)
        assert len(tree) > 1  # the postmaster and its background workers
        if os.geteuid() == 0:
            assert psutil.Process(server.pid).username() != "root"
        assert server.admin_dsn.startswith("postgresql://postgres@127.0.0.1:")
        with psycopg.connect(server.admin_dsn) as conn:
            (fsync,) = conn.execute("SHOW fsync").fetchone() or (None,)
            (max_connections,) = conn.execute("SHOW max_connections").fetchone() or (None,)
        assert (fsync, max_connections) == ("off", "200")
        base_dir = server.base_dir

        # A second server on the same port must fail, not take the first one for itself.
        intruder = PostgresServer(port=server.port, fsync=False)
        try:
            with pytest.raises(ServiceError, match="in use"):
                intruder.start()
            assert intruder.pid is not None and _gone(intruder.pid)
        finally:
            intruder.close()
    finally:
        server.close()

    assert all(_gone(pid) for pid in tree)
    assert not base_dir.exists()


def _database_names(server: PostgresServer) -> set[str]:
    with psycopg.connect(server.admin_dsn) as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database").fetchall()}
