-- The statements of chronoshard.scheduler.store.repairs.ReconcileStore: the reconcile
-- loop (docs/architecture.md#d8).
--
-- Rules as in runs.sql: a task row is named by (scheduled_at, id); every write is a
-- compare-and-set on the row as the reconciler read it (status, fencing_token,
-- updated_at) and runs after lock_shard_epochs (database.sql) in the same transaction;
-- task rows are locked in (scheduled_at, id) order before they are updated, then their
-- task_attempts rows (the lock order every batch write keeps).

-- name: pass_state
-- What a pass needs besides the rows, on the database's clock (the one that wrote the
-- leases, so node clock skew cannot expire a lease early): now; the earliest lease of an
-- in-flight row of the shards not yet due for action (later than now - margin), one
-- probe of tasks_inflight_idx per shard, so the reconciler wakes at that expiry plus the
-- margin; the OUTCOME_UNKNOWN tasks of the shards (tasks_outcome_unknown_idx), the
-- gauge operators watch; and when the next DISPATCHED row, untouched since, reaches the
-- ack timeout (served by tasks_inflight_idx): an intent a crashed owner committed and
-- never delivered is then given back at intent + ack timeout, not up to a whole
-- reconcile interval later (rows already past it are the regular passes' business).
-- And how long PostgreSQL has been up: no touch of a row was recorded before it started
-- (core/repairs.py, Scan.steady_s).
SELECT now() AS now,
       extract(epoch FROM now() - pg_postmaster_start_time())::float8 AS up_s,
       (SELECT min(n.lease_expires_at)
        FROM unnest(%(shards)s::smallint[]) AS s(shard)
        CROSS JOIN LATERAL (
            SELECT t.lease_expires_at
            FROM tasks AS t
            WHERE t.shard = s.shard
              AND t.status IN ('DISPATCHED', 'RUNNING')
              AND t.lease_expires_at > now() - make_interval(secs => %(margin_s)s)
            ORDER BY t.lease_expires_at
            LIMIT 1
        ) AS n) AS next_expiry,
       (SELECT count(*)
        FROM tasks AS u
        WHERE u.shard = ANY(%(shards)s::smallint[])
          AND u.status = 'OUTCOME_UNKNOWN') AS outcome_unknown,
       (SELECT min(d.updated_at) + make_interval(secs => %(ack_timeout_s)s)
        FROM tasks AS d
        WHERE d.shard = ANY(%(shards)s::smallint[])
          AND d.status = 'DISPATCHED'
          AND d.updated_at > now() - make_interval(secs => %(ack_timeout_s)s)) AS next_ack_due;

-- name: scan_inflight
-- The in-flight rows of the owned shards that may need the reconciler: a lease expired
-- at least margin_s ago, or a DISPATCHED row untouched for ack_timeout_s. Served by the
-- partial index tasks_inflight_idx (shard, lease_expires_at): only live rows are read,
-- however much finished history the table holds. A lease is set to now + lease_s by the
-- intent and by every heartbeat, so a row untouched for ack_timeout_s has
-- lease_expires_at <= now + lease_s - ack_timeout_s: that bound (%(horizon_s)s) keeps
-- the index range short.
SELECT t.scheduled_at, t.id, t.shard, t.tenant_id, t.priority, t.queue, t.type, t.due_at,
       t.strict_timing, t.status, t.fencing_token, t.attempt, t.worker_id, t.idempotent,
       t.cancel_requested_at IS NOT NULL AS cancel_requested, t.lease_expires_at,
       t.updated_at
FROM tasks AS t
WHERE t.shard = ANY(%(shards)s::smallint[])
  AND t.status IN ('DISPATCHED', 'RUNNING')
  AND t.lease_expires_at < now() + make_interval(secs => %(horizon_s)s)
  AND (t.status = 'DISPATCHED'
       OR t.lease_expires_at <= now() - make_interval(secs => %(margin_s)s))
ORDER BY t.lease_expires_at
LIMIT %(limit)s;

-- name: repair
-- The reconciler's decisions, as one compare-and-set per row: only a row still exactly as
-- read (status, token, updated_at) moves, to PRELOADED (the next intent gives it a new
-- token), CANCELLED or OUTCOME_UNKNOWN; its attempt records ABANDONED, CANCELLED or
-- OUTCOME_UNKNOWN and why. A row that a completion, heartbeat or another reconciler
-- changed meanwhile is left alone. An OUTCOME_UNKNOWN row keeps its worker_id (who may
-- have run it) and its token (its late settlement is still accepted).
WITH decided AS (
    SELECT *
    FROM unnest(%(scheduled_ats)s::timestamptz[], %(ids)s::uuid[], %(statuses)s::text[],
                %(tokens)s::bigint[], %(updated_ats)s::timestamptz[], %(targets)s::text[],
                %(attempt_states)s::text[], %(reasons)s::text[])
         AS d(scheduled_at, id, status, token, updated_at, target, attempt_state, reason)
), locked AS MATERIALIZED (
    -- Key by key, in key order (as in runs.sql): one primary-key probe per row whatever
    -- the statistics say, pruned to the batch's day partitions; a join of the whole
    -- array could scan every row of an instant shared by a stampede.
    SELECT t.scheduled_at, t.id, d.status, d.token, d.updated_at, d.target,
           d.attempt_state, d.reason
    FROM (SELECT * FROM decided ORDER BY scheduled_at, id) AS d
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id
        FROM tasks AS t
        WHERE t.scheduled_at = d.scheduled_at AND t.id = d.id
          AND t.scheduled_at = ANY(%(instants)s::timestamptz[])
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
), moved AS (
    UPDATE tasks AS t
    SET status = d.target,
        worker_id = CASE WHEN d.target = 'PRELOADED' THEN NULL ELSE t.worker_id END,
        lease_expires_at = NULL,
        finished_at = CASE WHEN d.target = 'CANCELLED' THEN now() ELSE t.finished_at END,
        last_error = CASE WHEN d.target = 'CANCELLED' THEN COALESCE(t.cancel_reason, d.reason)
                          WHEN d.target = 'OUTCOME_UNKNOWN' THEN d.reason
                          ELSE t.last_error END,
        updated_at = now()
    FROM locked AS d
    WHERE t.scheduled_at = d.scheduled_at
      AND t.id = d.id
      AND t.status = d.status
      AND t.fencing_token = d.token
      AND t.updated_at = d.updated_at
      AND t.shard = ANY(%(shards)s::smallint[])
    RETURNING t.id, t.scheduled_at, t.shard, t.tenant_id, t.priority, t.queue, t.type,
              t.due_at, t.strict_timing, t.status, t.attempt, t.workflow_id, d.attempt_state,
              d.reason
), attempts AS (
    UPDATE task_attempts AS ta
    SET state = moved.attempt_state, finished_at = now(), error = moved.reason
    FROM moved
    WHERE ta.task_id = moved.id
      AND ta.attempt = moved.attempt
      AND ta.state IN ('DISPATCHED', 'RUNNING')
)
SELECT id, scheduled_at, shard, tenant_id, priority, queue, type, due_at, strict_timing,
       status, workflow_id
FROM moved;

-- name: scan_runs
-- Workflow runs still marked RUNNING, a page at a time in (created_at, id) order (the
-- partial index workflow_runs_active_idx holds only those). For a run with no task left
-- that is not terminal, the distinct statuses of its tasks; NULL while one is still live.
SELECT w.id, w.created_at,
       CASE WHEN NOT EXISTS (
                SELECT 1 FROM tasks AS n
                WHERE n.workflow_id = w.id
                  AND n.status NOT IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER', 'UPSTREAM_FAILED')
            )
            THEN ARRAY(SELECT DISTINCT t.status FROM tasks AS t WHERE t.workflow_id = w.id)
       END AS statuses
FROM workflow_runs AS w
WHERE w.state = 'RUNNING'
  AND (w.created_at, w.id) > (%(after_created_at)s::timestamptz, %(after_id)s::uuid)
ORDER BY w.created_at, w.id
LIMIT %(limit)s;
