"""Commits whose outcome the scheduler cannot know, against a real PostgreSQL.

A TCP proxy between the store and the server (:class:`CommitCutter`) loses one COMMIT on
purpose, on the connection that ran a chosen statement (or that statement itself, when it
commits by itself: a submit without keys): either the server gets it and commits but its
answer never comes back (``commits=True``), or it never gets it and rolls back
(``commits=False``). Both look the same to the client, a connection lost during COMMIT:
``CommitOutcomeUnknown``. docs/architecture.md#d12: such an outcome is settled by reading
the rows back, never by writing them again.

* a submit batch, unkeyed, is answered with its tasks when it committed and with
  UNAVAILABLE (nothing written) when it did not; either way one row each at most: a
  ``SubmitBatch`` (its tenant's transaction, whose COMMIT is lost; written in one
  statement, or chunk by chunk in a pipelined transaction) and group commit's batch
  (one self-committing INSERT, lost itself);
* dispatch intents read back tell the committed ones (to be sent) from the others;
* a read-back ends the lost transaction's backend first, when it lives on;
* a whole node: a preload whose answer is lost is read back onto the wheel, an intent
  whose answer is lost is sent (token 1, never a second intent), a Complete the node
  could not commit is answered at once with a retryable Receipt, and the Complete sent
  again settles the task.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import grpc
import psycopg
import pytest
from fixtures.nodes import node_config, running_node
from fixtures.stores import (
    EPOCH,
    OWNER,
    SHARD,
    in_chunks,
    insert_tasks,
    new_task,
    new_tenant,
    prepared_task,
    tenant_with_key,
)
from fixtures.waiting import eventually
from harness.raw_worker import RawWorker, bearer, complete, grant, hello
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.models import NewTask, SubmitResult
from chronoshard.scheduler.core.runs import Intent
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.errors import CommitOutcomeUnknown, SchedulerError, StoreUnavailable
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.scheduler.store.database import Backend, Store
from chronoshard.scheduler.store.runs import RunStore
from chronoshard.scheduler.store.submits import SubmitStore
from chronoshard.services import EtcdProcess
from chronoshard.v1 import worker_service_pb2

# psycopg commits with the simple-query message; a pipelined transaction
# (Store.pipelined_transaction) with an unnamed statement of the extended protocol: its
# Parse message carries the text after the empty name.
COMMITS = (b"Q\x00\x00\x00\x0bCOMMIT\x00", b"P\x00\x00\x00\x0e\x00COMMIT\x00")
NODE_SHARDS = 4
# Distinctive text of the statements whose transaction loses its COMMIT.
INSERT_TASKS = b"INSERT INTO tasks"
LOAD_DUE = b"AS due(scheduled_at, id)"
WRITE_INTENTS = b"SET status = 'DISPATCHED'"
COMPLETE = b"SET status = 'COMPLETED'"


@dataclass
class _Armed:
    statement: bytes
    commits: bool
    self_committing: bool


@dataclass
class CommitCutter:
    """A proxy to PostgreSQL that loses one COMMIT when armed (module docstring)."""

    host: str
    port: int
    armed: _Armed | None = None
    cut = 0
    _server: asyncio.Server | None = None
    _links: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def arm(self, statement: bytes, *, commits: bool, self_committing: bool = False) -> None:
        """Lose the COMMIT of the next transaction that runs ``statement`` or, when the
        statement runs alone outside a transaction (``self_committing``), the statement
        itself: the server runs and commits it, or never gets it."""
        self.armed = _Armed(statement, commits, self_committing)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        try:
            server_r, server_w = await asyncio.open_connection(self.host, self.port)
        except OSError:
            client_w.close()
            return
        # Set once this connection ran the armed statement: its next COMMIT is lost.
        target: list[_Armed] = []
        answers_lost = asyncio.Event()

        async def upstream() -> None:
            tail = b""
            while data := await client_r.read(65536):
                window = tail + data
                tail = window[-256:]
                armed = self.armed
                if armed is not None and not target and armed.statement in window:
                    self.armed = None
                    target.append(armed)
                if target and (target[0].self_committing or any(c in window for c in COMMITS)):
                    self.cut += 1
                    if target[0].commits:
                        # The server commits; its answer is dropped, and only once it
                        # came does the client lose the connection (downstream): cut
                        # earlier, a read-back could end the backend before it had read
                        # the COMMIT, which then never happened.
                        answers_lost.set()
                        server_w.write(data)
                        await server_w.drain()
                        return
                    client_w.close()
                    server_w.close()  # the server sees the client gone: rollback
                    return
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if answers_lost.is_set():
                    # The COMMIT's answer: committed, and it never reaches the client.
                    break
                client_w.write(data)
                await client_w.drain()
            server_w.close()
            client_w.close()

        try:
            await asyncio.gather(upstream(), downstream())
        except (ConnectionError, OSError):
            pass
        finally:
            server_w.close()
            client_w.close()
            self._links.discard(task)


@pytest.fixture
async def cutter(fresh_db_dsn: str) -> AsyncIterator[tuple[CommitCutter, str]]:
    params = conninfo_to_dict(fresh_db_dsn)
    proxy = CommitCutter(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    port = await proxy.start()
    try:
        yield proxy, make_conninfo(fresh_db_dsn, host="127.0.0.1", port=port)
    finally:
        await proxy.close()


# Not the conftest's store: this one reaches the server through the proxy that cuts
# COMMITs (an own database, the shard owned, as ``store(own_database, owns_shard)``).
@pytest.fixture
async def store(cutter: tuple[CommitCutter, str]) -> AsyncIterator[Store]:
    async with await Store.open(cutter[1], min_size=1, max_size=4) as opened:
        assert await opened.claim_shard_epoch(SHARD, EPOCH, OWNER)
        yield opened


async def _submit(
    store: Store, tenant_id: uuid.UUID, news: list[NewTask], *, path: str
) -> list[SubmitResult | SchedulerError]:
    """``news`` submitted as group commit writes them (``insert_each``: one
    self-committing INSERT), as a keyed ``SubmitBatch`` does (``insert_tasks``: a tenant
    transaction), or as a keyless one does (``insert_streamed``: a pipelined tenant
    transaction, one INSERT per task here); their results."""
    if path == "group":
        return await SubmitStore(store).insert_each([(tenant_id, prepared_task(n)) for n in news])
    if path == "streamed":
        prepared = [prepared_task(n) for n in news]
        return list(await SubmitStore(store).insert_streamed(tenant_id, in_chunks(prepared, 1)))
    return list(await insert_tasks(store, tenant_id, news))


SUBMIT_PATHS = pytest.mark.parametrize("path", ["submit-batch", "group", "streamed"])


def _rows(dsn: str, task_id: uuid.UUID) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM tasks WHERE id = %s", (task_id,)).fetchone()
    assert row is not None
    return int(row[0])


@SUBMIT_PATHS
async def test_an_unkeyed_submit_whose_commit_answer_was_lost_is_read_back_once(
    store: Store, cutter: tuple[CommitCutter, str], fresh_db_dsn: str, path: str
) -> None:
    proxy, _ = cutter
    tenant = await new_tenant(store)
    news = [new_task() for _ in range(3)]
    proxy.arm(INSERT_TASKS, commits=True, self_committing=path == "group")
    results = await _submit(store, tenant.id, news, path=path)
    assert proxy.cut == 1, "the COMMIT was not intercepted: the test proves nothing"
    assert all(isinstance(r, SubmitResult) and r.created for r in results)
    assert [r.task.id for r in results if isinstance(r, SubmitResult)] == [n.id for n in news]
    assert [_rows(fresh_db_dsn, n.id) for n in news] == [1, 1, 1]


@SUBMIT_PATHS
async def test_a_submit_whose_commit_never_arrived_is_unavailable_and_wrote_nothing(
    store: Store, cutter: tuple[CommitCutter, str], fresh_db_dsn: str, path: str
) -> None:
    proxy, _ = cutter
    tenant = await new_tenant(store)
    news = [new_task() for _ in range(3)]
    proxy.arm(INSERT_TASKS, commits=False, self_committing=path == "group")
    with pytest.raises(StoreUnavailable) as raised:
        await _submit(store, tenant.id, news, path=path)
    assert proxy.cut == 1
    # Read back: known not written, so a plain retry is safe (not "outcome unknown").
    assert not isinstance(raised.value, CommitOutcomeUnknown)
    assert [_rows(fresh_db_dsn, n.id) for n in news] == [0, 0, 0]
    results = await _submit(store, tenant.id, news, path=path)
    assert all(isinstance(r, SubmitResult) and r.created for r in results)
    assert [_rows(fresh_db_dsn, n.id) for n in news] == [1, 1, 1]


async def test_a_keyed_batch_read_back_answers_new_tasks_and_repeats(
    store: Store, cutter: tuple[CommitCutter, str], fresh_db_dsn: str
) -> None:
    proxy, _ = cutter
    tenant = await new_tenant(store)
    first = new_task(idempotency_key="k-old")
    [original] = await insert_tasks(store, tenant.id, [first])
    repeat = replace(new_task(idempotency_key="k-old"), scheduled_at=first.scheduled_at)
    repeat = replace(repeat, due_at=first.due_at)
    fresh = new_task(idempotency_key="k-new")
    proxy.arm(INSERT_TASKS, commits=True)
    requests = [(tenant.id, prepared_task(n)) for n in (repeat, fresh)]
    results = await SubmitStore(store).insert_each(requests)
    assert proxy.cut == 1
    by_id = {r.task.id: r for r in results if not isinstance(r, Exception)}
    assert by_id[original.task.id].created is False
    assert by_id[fresh.id].created is True
    assert _rows(fresh_db_dsn, fresh.id) == 1 and _rows(fresh_db_dsn, repeat.id) == 0


async def test_intents_read_back_tell_committed_from_unwritten(
    store: Store, cutter: tuple[CommitCutter, str]
) -> None:
    proxy, _ = cutter
    runs = RunStore(store)
    tenant = await new_tenant(store)
    await insert_tasks(store, tenant.id, [new_task(), new_task()])
    timers, _ = await runs.load_due({SHARD: EPOCH}, datetime.now(UTC) + timedelta(minutes=1), 10)
    assert len(timers) == 2
    sent, kept = timers
    proxy.arm(WRITE_INTENTS, commits=True)
    with pytest.raises(CommitOutcomeUnknown):
        await runs.write_intents({SHARD: EPOCH}, [Intent(sent, "w1")], 30)
    assert proxy.cut == 1
    result = await runs.read_back_intents({SHARD: EPOCH}, [Intent(sent, "w1"), Intent(kept, "w1")])
    assert [t.id for t in result.dispatched] == [sent.id]
    assert result.dispatched[0].fencing_token == 1
    assert result.unwritten == frozenset({kept.id})
    # Under another epoch (the shard moved on), nothing is claimed as ours.
    moved = await runs.read_back_intents({SHARD: EPOCH + 1}, [Intent(sent, "w1")])
    assert moved.dispatched == [] and moved.lost_shards == frozenset({SHARD})


async def test_a_read_back_first_ends_the_lost_transaction_if_its_backend_lives(
    store: Store, fresh_db_dsn: str
) -> None:
    # A lost COMMIT may still be on its way to a backend that lives on (a broken network,
    # not a restart). Here that backend holds a transaction with a row inserted; the
    # store is told its outcome is unknown, as it is when COMMIT's answer never comes.
    tenant = await new_tenant(store)
    with psycopg.connect(fresh_db_dsn) as other:
        row = other.execute(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        assert row is not None
        other.execute(
            "INSERT INTO tenants (name, tier, rate_limit_rps, max_concurrent_workers,"
            " home_region, api_key_hash) VALUES (%s, 'standard', 1, 1, 'local', %s)",
            (f"lost-{tenant.id}", f"lost-{tenant.id}"),
        )
        store._lost.add(Backend(row[0], row[1]))
        await store.end_lost_transactions()
        with pytest.raises(psycopg.OperationalError):
            other.execute("SELECT 1")  # its backend was ended: the transaction is gone
    with psycopg.connect(fresh_db_dsn) as conn:
        found = conn.execute(
            "SELECT count(*) FROM tenants WHERE name = %s", (f"lost-{tenant.id}",)
        ).fetchone()
    assert found == (0,)


# ---- a whole node ------------------------------------------------------------------------


@pytest.fixture
async def node(cutter: tuple[CommitCutter, str], etcd: EtcdProcess) -> AsyncIterator[SchedulerNode]:
    config = node_config(cutter[1], etcd.endpoint, shard_count=NODE_SHARDS)
    async with running_node(config) as started:
        yield started


async def test_a_node_reads_back_what_it_could_not_learn_and_retries_what_it_could_not_commit(
    node: SchedulerNode, cutter: tuple[CommitCutter, str], fresh_db_dsn: str
) -> None:
    proxy, _ = cutter
    await eventually(
        lambda: len(node.shards.epochs()) == NODE_SHARDS, timeout_s=10, what="shards claimed"
    )
    tenant = await new_tenant(node.store)
    task_id = new_task_id()
    new = new_task(id=task_id, shard=shard_of(task_id, NODE_SHARDS), due_in_s=1.0)

    # 1. The preload commits, its answer is lost: read back onto the wheel anyway.
    proxy.arm(LOAD_DUE, commits=True)
    await insert_tasks(node.store, tenant.id, [new])
    node.preloader.wake()
    await eventually(lambda: proxy.cut == 1, timeout_s=10, what="the preload's COMMIT cut")
    await eventually(
        lambda: node.dispatcher.get_stats()["adopted"] == 1,
        timeout_s=10,
        what="read back onto the wheel",
    )

    # 2. A raw worker takes it; the intent's answer is lost: read back and sent, once.
    proxy.arm(WRITE_INTENTS, commits=True)
    _, key = await tenant_with_key(node.store)
    assert node.addresses is not None
    receipts: list[worker_service_pb2.Receipt] = []
    assignment: worker_service_pb2.Assignment | None = None
    async with (
        grpc.aio.insecure_channel(node.addresses.grpc) as channel,
        RawWorker.connect(channel, bearer(key), hello("raw-1", ["t"], slots=1), grant(1)) as worker,
        asyncio.timeout(30),
    ):
        async for message in worker:
            kind = message.WhichOneof("message")
            if kind == "assignment":
                assignment = message.assignment
                assert proxy.cut == 2, "the intent's COMMIT was not cut"
                # 3. The Complete's COMMIT never reaches the server.
                proxy.arm(COMPLETE, commits=False)
                worker.send(complete(assignment))
            elif kind == "receipt":
                receipts.append(message.receipt)
                if message.receipt.HasField("error"):
                    assert assignment is not None
                    worker.send(complete(assignment))  # what the SDK does
                else:
                    break
    assert assignment is not None
    assert (assignment.fencing_token, assignment.attempt) == (1, 1)
    first, second = receipts
    assert first.error.retryable and first.error.code == "UNAVAILABLE", first.error
    assert not second.HasField("error")
    with psycopg.connect(fresh_db_dsn) as conn:
        states = conn.execute(
            "SELECT t.status, t.fencing_token, array_agg(a.state ORDER BY a.attempt)"
            " FROM tasks t JOIN task_attempts a ON a.task_id = t.id WHERE t.id = %s"
            " GROUP BY t.status, t.fencing_token",
            (task_id,),
        ).fetchone()
    assert states == ("COMPLETED", 1, ["SUCCEEDED"])
