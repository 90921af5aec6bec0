"""Fixtures the integration modules share: the scheduler's store, its dispatch path, a
tenant (rows built by :mod:`fixtures.stores`).

``store`` opens the scheduler's ``Store`` (1..4 connections) on this module's database.
A module (or test) whose store must be different says how with the ``store`` marker:

- ``pytest.mark.store(own_database=True)``: on a database of the test's own
  (``fresh_db_dsn``), for tests that change what other tests would see (partitions,
  shard epochs).
- ``pytest.mark.store(own_database=True, owns_shard=True)``: that, and the store owns
  ``fixtures.stores.SHARD`` at ``EPOCH`` (as ``OWNER``): the dispatch path's statements
  (``runs``) are fenced on ownership, and tests move the shard to other epochs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from fixtures.stores import EPOCH, OWNER, SHARD, new_tenant

from chronoshard import cli
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.runs import RunStore


@dataclass(frozen=True)
class StoreMarker:
    """The keyword arguments of ``pytest.mark.store``."""

    own_database: bool = False
    owns_shard: bool = False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "store(own_database=False, owns_shard=False): how the"
        " `store` fixture opens (tests/integration/conftest.py)",
    )


@pytest.fixture
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    marker = request.node.get_closest_marker("store")
    options = StoreMarker(**marker.kwargs) if marker is not None else StoreMarker()
    if options.owns_shard and not options.own_database:
        raise pytest.UsageError("store(owns_shard=True) needs own_database=True")
    dsn: str = request.getfixturevalue("fresh_db_dsn" if options.own_database else "db_dsn")
    async with await Store.open(dsn, min_size=1, max_size=4) as opened:
        if options.owns_shard:
            assert await opened.claim_shard_epoch(SHARD, EPOCH, OWNER)
        yield opened


@pytest.fixture
def runs(store: Store) -> RunStore:
    """The dispatch path's statements (preload, intents, settlements) on ``store``."""
    return RunStore(store)


@pytest.fixture
async def tenant(store: Store) -> Tenant:
    return await new_tenant(store)


@pytest.fixture
def no_cli_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CHRONOSHARD_* variable of the CLI's reaches a test that runs it."""
    for name in (cli.TARGET_ENV, cli.API_KEY_ENV, cli.DSN_ENV):
        monkeypatch.delenv(name, raising=False)
