"""Every statement the scheduler sends PostgreSQL, one pool, one fence, and the schema.

:mod:`.database` holds the pool (connections checked, waits bounded, a commit of unknown
outcome told apart), the shard fence (``Store.owned_shards``) and the tenant and read
statements. Over that pool, one class per owner: :mod:`.submits` the submit write path
(batches, idempotency keys, the read-back of an unknown commit); :mod:`.runs` the run
state of the hot path (preload, intent, acks, heartbeats, settlements) under the fence;
:mod:`.repairs` the reconciler's scans and repairs; :mod:`.tasks` the TaskService's
lists, cancels and retries; :mod:`.expectations` the WatchdogService's expectation
registry; :mod:`.sessions` the worker-sessions record (liveness, the handoff's wait for
workers); :mod:`.partitions` partition maintenance, for the node's loop and,
synchronously, for ``chronoshard partitions``. :mod:`.tenants` holds the operator's
tenant writes, :mod:`.migrate` the numbered migrations in ``migrations/`` and nothing
else, and :mod:`.direct` the one unpooled synchronous connection that migrations and the
partition commands use. Statements live in ``sql/*.sql``, one file per owner, loaded
by :mod:`.queries`.

One pair of statements stays outside: the cross-node signals' ``LISTEN`` and
``pg_notify`` in :mod:`chronoshard.scheduler.cluster.signals`, because ``LISTEN``
belongs to a dedicated connection that lives as long as the listener (a pooled one
would go back to the pool and take the subscription with it) and both are the channel's
wire protocol, kept beside its encoding.
"""
