"""Fixtures for every test tier: a real PostgreSQL, a real etcd, asyncio on uvloop.

PostgreSQL is the server named by CHRONOSHARD_TEST_DSN when that is set, else an
embedded one started once per session. Migrations run once per session into a template
database; each module gets its own copy (`db_dsn`), and a test that needs a database of
its own asks for `fresh_db_dsn`. etcd is one process per session (`etcd`) shared through
unique key prefixes (`etcd_cluster_prefix`); tests that kill or restart etcd start their
own members with `etcd_factory`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator, Mapping

import pytest
import uvloop
from fixtures.databases import database_from_template, migrated_template
from fixtures.etcd import EtcdFactory
from harness.processes import run_lifeline

from chronoshard.services import EtcdProcess, PostgresServer

TEST_DSN_ENV = "CHRONOSHARD_TEST_DSN"

# pytester runs nested sessions: used to check what a second test module sees.
pytest_plugins = ("pytester",)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run every async test on uvloop, the loop Chronoshard runs on in production."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    # fsync off is safe for throwaway test data; it only matters for the embedded server.
    # The embedded server makes its own temp dir: pytest's tmp dirs are mode 0700 and the
    # unprivileged PostgreSQL user (when we run as root) could not reach them.
    dsn = os.environ.get(TEST_DSN_ENV) or None
    with PostgresServer(dsn=dsn, fsync=False, lifeline=run_lifeline()) as server:
        yield server


@pytest.fixture(scope="session")
def template_database(postgres_server: PostgresServer) -> Iterator[str]:
    """Name of a database with every migration applied, marked as a template."""
    with migrated_template(postgres_server) as name:
        yield name


@pytest.fixture(scope="module")
def db_dsn(postgres_server: PostgresServer, template_database: str) -> Iterator[str]:
    """DSN of a migrated database of this test module's own."""
    with database_from_template(postgres_server, template_database) as dsn:
        yield dsn


@pytest.fixture
def fresh_db_dsn(postgres_server: PostgresServer, template_database: str) -> Iterator[str]:
    """DSN of a migrated database of this test's own."""
    with database_from_template(postgres_server, template_database) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdProcess]:
    with EtcdProcess(fsync=False, lifeline=run_lifeline()) as member:
        yield member


@pytest.fixture
def etcd_cluster_prefix() -> str:
    """A key prefix no other test uses, so tests can share the session's etcd."""
    return f"/test-{uuid.uuid4().hex}"


@pytest.fixture
def etcd_factory() -> Iterator[EtcdFactory]:
    factory = EtcdFactory()
    try:
        yield factory
    finally:
        factory.close()
