"""Every statement the scheduler sends PostgreSQL, and the schema they run against.

:mod:`.database` holds the pool (connections checked, waits bounded, a commit of unknown
outcome told apart) and the submit and read statements; :mod:`.runs` the run state of
the hot path (preload, intent, acks, heartbeats, settlements) under the shard fence;
:mod:`.repairs` the reconciler's scans and repairs; :mod:`.tasks` the TaskService's
lists, cancels and retries; :mod:`.submits` the batched submit's key resolution and
column arrays; :mod:`.tenants` the operator's tenant writes; :mod:`.migrate` the
numbered migrations in ``migrations/``. Statements live in ``sql/*.sql``, one file per
owner, loaded by :mod:`.queries`.
"""
