-- The statements of chronoshard.scheduler.store.database.Store, one named block each.
--
-- Rules every statement here follows:
-- * a statement that changes a task names its row by (scheduled_at, id), so PostgreSQL
--   prunes to one partition, and names the states it may start from, so a stale or
--   invalid move changes 0 rows;
-- * a write for a shard runs in a transaction that first takes the fence
--   (lock_shard_epochs, through Store.owned_shards) and writes only for the shards it returns;
-- * predicates that must match a partial index are spelled literally (a bound parameter
--   cannot prove the index predicate, and the planner would not use the index).


-- name: enter_tenant
-- The first statement of every API transaction (Store.tenant_transaction): the role that
-- row-level security applies to, and the tenant its policies admit (migration 0014). Both
-- local to the transaction (is_local = true, as SET LOCAL): they end with it, committed
-- or rolled back, and the pooled connection is the node's again.
-- The role is chronoshard_api, the setting chronoshard.tenant_id (database.API_ROLE and
-- database.TENANT_SETTING, bound as parameters).
SELECT set_config('role', %(role)s::text, true),
       set_config(%(setting)s::text, %(tenant_id)s::text, true);

-- name: get_task
-- By id alone (GetTask): probes the id index of every partition. The tenant is part of
-- the predicate, so another tenant's task is simply not found.
SELECT *
FROM tasks
WHERE id = %(id)s AND tenant_id = %(tenant_id)s;

-- name: get_attempts
SELECT task_id, attempt, scheduled_at, fencing_token, state, worker_id, entered_at,
       finished_at, error, resolution
FROM task_attempts
WHERE task_id = %(task_id)s
ORDER BY attempt;

-- name: claim_shard_epoch
-- Only forward: a lower or equal epoch from another node changes nothing. The same node
-- repeating its own claim (a retry after a lost commit acknowledgement) is answered yes.
INSERT INTO shard_owners (shard, epoch, node_id, claimed_at)
VALUES (%(shard)s, %(epoch)s, %(node_id)s, now())
ON CONFLICT (shard) DO UPDATE
    SET epoch = EXCLUDED.epoch, node_id = EXCLUDED.node_id, claimed_at = EXCLUDED.claimed_at
    WHERE shard_owners.epoch < EXCLUDED.epoch
       OR (shard_owners.epoch = EXCLUDED.epoch AND shard_owners.node_id = EXCLUDED.node_id)
RETURNING epoch;

-- name: highest_shard_epoch
-- The floor of a new etcd's epochs (EtcdCoordinator.ensure_epoch_base): every epoch it
-- hands out rises above every epoch already recorded, whatever its revisions.
SELECT coalesce(max(epoch), 0) FROM shard_owners;

-- name: lock_shard_epochs
-- The shard fence (Store.owned_shards): FOR SHARE on the owner rows of every shard the
-- transaction writes for, in shard order (a fixed lock order: two transactions never
-- deadlock on these rows). Many writes of the owner run at once, but a new owner's claim
-- (an UPDATE of a row) waits until they commit, and every later write sees the new epoch.
SELECT shard, epoch
FROM shard_owners
WHERE shard = ANY(%(shards)s::smallint[])
ORDER BY shard
FOR SHARE;

-- name: database_clock
-- PostgreSQL's clock for the node's cluster clock (cluster/clock.py): the instant the
-- function runs, where now() would be the start of the transaction.
SELECT clock_timestamp()
