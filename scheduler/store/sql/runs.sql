-- The run-state statements of chronoshard.scheduler.store.runs.RunStore: the
-- preloader, the dispatch intent, and what workers send back (ack, heartbeat, complete,
-- fail, release). Each takes a whole batch (arrays bound as parameters, unnest()ed), so a
-- group commit is one statement per kind, not one per message. The arrays are bound in
-- binary (%(name)b): psycopg writes a text array element by element in Python, which was
-- a tenth of the node's CPU in a dispatch round of a thousand tasks (issue 14).
--
-- Rules (as in database.sql): a task row is named by (scheduled_at, id); a write names the
-- states it may start from and, for worker messages, the fencing token of the attempt,
-- so a stale write changes 0 rows. Shard writes (preload, intent, release back into the
-- wheel) run after lock_shard_epochs in the same transaction.
--
-- Partition pruning: a statement's key lookups (the lateral per key, below) name both key
-- columns, so each probe reads only its own partition (pruned at run time); the lookup
-- also says `t.scheduled_at = ANY(<the batch's distinct instants>)` (runs.py batch_keys:
-- one entry per key would be compared against every row read). The UPDATE that follows
-- joins the locked rows by key alone, with no such condition: under statistics older
-- than a stampede, any condition on scheduled_at alone is believed to match one row,
-- and PostgreSQL scanned the whole key for it (5,000 keys x 100,000 rows: 264 s).
--
-- Key by key: every statement handed a batch of keys reads or locks each key's row on its
-- own, a CROSS JOIN LATERAL (... LIMIT 1 [FOR UPDATE]) per key in (scheduled_at, id) order,
-- which PostgreSQL cannot turn into a scan. The token and state a write starts from are
-- checked on the row as locked, outside the lookup (inside, the state would let it choose
-- a partial index of that state), and the UPDATE then names the locked rows by key alone.
-- That is safe: the lock follows a concurrent update to the row's newest version and this
-- transaction holds it, so the UPDATE (which re-reads the newest version of a row changed
-- since its snapshot) writes exactly the row that was checked. Every task of a stampede
-- shares one instant; planned as joins, with statistics older than the stampede, each
-- batch walked all of it (tests/integration/test_hot_plans.py, issue 14). The primary key
-- leads with id (migration 0010), so no index can read a whole instant either.
--
-- Lock order: every batch write first locks its task rows in (scheduled_at, id) order
-- (the MATERIALIZED "locked" CTE, or lock_for_failure), then updates them, then their
-- task_attempts rows. Batches of different kinds touch the same tasks at once (a
-- completion overtaking its ack, a heartbeat); one order for all means no deadlock.

-- name: due_refs
-- Preloader, all owned shards at once, step 1: lock the due SCHEDULED/RETRYING rows,
-- earliest first. The partial index tasks_preload_idx serves each shard's range, so
-- finished history is never read.
SELECT scheduled_at, id
FROM tasks
WHERE shard = ANY(%(shards)b::smallint[])
  AND status IN ('SCHEDULED', 'RETRYING')
  AND unresolved_dependencies = 0
  AND due_at < %(horizon)s
ORDER BY due_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: load_due
-- Step 2 (same transaction): those rows become PRELOADED. A separate statement because
-- the rows' scheduled_at must be known when the UPDATE is planned: joined to rows found
-- by a subquery, PostgreSQL hashed every partition of tasks (all history) to find them.
-- The rows are locked already (step 1); the state is checked on the row as locked.
WITH due AS (
    SELECT *
    FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[]) AS due(scheduled_at, id)
), locked AS MATERIALIZED (
    SELECT t.scheduled_at, t.id
    FROM (SELECT * FROM due ORDER BY scheduled_at, id) AS d
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id, t.status
        FROM tasks AS t
        WHERE t.scheduled_at = d.scheduled_at AND t.id = d.id
          AND t.scheduled_at = ANY(%(instants)b::timestamptz[])
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
    WHERE t.status IN ('SCHEDULED', 'RETRYING')
)
UPDATE tasks AS t
SET status = 'PRELOADED', updated_at = now()
FROM locked AS due
WHERE t.scheduled_at = due.scheduled_at
  AND t.id = due.id
RETURNING t.id, t.scheduled_at, t.shard, t.tenant_id, t.priority, t.queue, t.type, t.due_at,
          t.strict_timing;

-- name: load_preloaded
-- A new owner (or a restarted node) reloads what the previous owner had preloaded:
-- nearest due first, a chunk at a time (keyset on (due_at, id), after_due NULL: from the
-- start; limit NULL: all), so the first dispatches need not wait for a whole shard.
SELECT id, scheduled_at, shard, tenant_id, priority, queue, type, due_at, strict_timing
FROM tasks
WHERE shard = ANY(%(shards)b::smallint[])
  AND status = 'PRELOADED'
  AND (%(after_due)s::timestamptz IS NULL
       OR (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::uuid))
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: read_warm
-- Planned handoff, the incoming owner's warm-up (scheduler/core/handoff.py): the shard's rows
-- due before the horizon that the old owner preloaded or will, nearest first, a chunk at
-- a time. Read only: the shard is not ours yet, so nothing is locked or changed.
SELECT id, scheduled_at, shard, tenant_id, priority, queue, type, due_at, strict_timing
FROM tasks
WHERE shard = %(shard)s
  AND (status = 'PRELOADED'
       OR (status IN ('SCHEDULED', 'RETRYING') AND unresolved_dependencies = 0))
  AND due_at < %(horizon)s
  AND (%(after_due)s::timestamptz IS NULL
       OR (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::uuid))
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: unload_preloaded
-- Handing a shard over without a warm successor: its PRELOADED rows (those after a
-- keyset position, when given) go back to SCHEDULED for whoever preloads next.
UPDATE tasks
SET status = 'SCHEDULED', updated_at = now()
WHERE shard = ANY(%(shards)b::smallint[])
  AND status = 'PRELOADED'
  AND (%(after_due)s::timestamptz IS NULL
       OR (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::uuid));

-- name: write_intents
-- The dispatch intent (docs/architecture.md#d6): PRELOADED -> DISPATCHED with token+1 and attempt+1,
-- the worker and the lease, plus one task_attempts row each, in one statement. Rows that
-- are no longer PRELOADED (cancelled meanwhile) are simply not returned.
WITH chosen AS (
    SELECT *
    FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[], %(worker_ids)b::text[])
         AS c(scheduled_at, id, worker_id)
), locked AS MATERIALIZED (
    SELECT t.scheduled_at, t.id, c.worker_id
    FROM (SELECT * FROM chosen ORDER BY scheduled_at, id) AS c
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id, t.status, t.shard
        FROM tasks AS t
        WHERE t.scheduled_at = c.scheduled_at AND t.id = c.id
          AND t.scheduled_at = ANY(%(instants)b::timestamptz[])
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
    WHERE t.status = 'PRELOADED'
      AND t.shard = ANY(%(shards)b::smallint[])
), moved AS (
    UPDATE tasks AS t
    SET status = 'DISPATCHED',
        fencing_token = t.fencing_token + 1,
        attempt = t.attempt + 1,
        worker_id = c.worker_id,
        lease_expires_at = now() + make_interval(secs => %(lease_s)s),
        updated_at = now()
    FROM locked AS c
    WHERE t.scheduled_at = c.scheduled_at
      AND t.id = c.id
    RETURNING t.*
), attempts AS (
    -- shard_owners is locked FOR SHARE by this transaction and its epoch checked: the
    -- epoch recorded is the one the write went through under. entered_at is the instant
    -- of this statement, not of the transaction's start: the quota check before it may
    -- have waited for another round's lock (store/quotas.py), and an attempt admitted
    -- because another one finished must not seem to have started before that one ended.
    INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token, state, worker_id,
                               epoch, entered_at)
    SELECT m.id, m.attempt, m.scheduled_at, m.fencing_token, 'DISPATCHED', m.worker_id, o.epoch,
           clock_timestamp()
    FROM moved AS m
    JOIN shard_owners AS o ON o.shard = m.shard
)
SELECT * FROM moved;

-- name: intent_outcomes
-- Reading back intents whose commit outcome is unknown (docs/architecture.md#d12): the rows as they are
-- now, with the epoch their current attempt was written under (NULL before any attempt).
SELECT t.*, a.epoch AS attempt_epoch
FROM tasks AS t
LEFT JOIN task_attempts AS a ON a.task_id = t.id AND a.attempt = t.attempt
WHERE t.scheduled_at = ANY(%(instants)b::timestamptz[])
  AND t.id = ANY(%(ids)b::uuid[])
  AND t.shard = ANY(%(shards)b::smallint[]);

-- name: ack
-- DISPATCHED -> RUNNING for the attempt holding the token.
WITH acked AS (
    SELECT *
    FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[], %(tokens)b::bigint[])
         AS a(scheduled_at, id, token)
), locked AS MATERIALIZED (
    SELECT t.scheduled_at, t.id
    FROM (SELECT * FROM acked ORDER BY scheduled_at, id) AS a
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id, t.fencing_token, t.status
        FROM tasks AS t
        WHERE t.scheduled_at = a.scheduled_at AND t.id = a.id
          AND t.scheduled_at = ANY(%(instants)b::timestamptz[])
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
    WHERE t.fencing_token = a.token
      AND t.status = 'DISPATCHED'
), moved AS (
    UPDATE tasks AS t
    SET status = 'RUNNING', started_at = now(), updated_at = now()
    FROM locked AS a
    WHERE t.scheduled_at = a.scheduled_at
      AND t.id = a.id
    RETURNING t.id, t.attempt
), attempts AS (
    UPDATE task_attempts AS ta
    SET state = 'RUNNING'
    FROM moved
    WHERE ta.task_id = moved.id AND ta.attempt = moved.attempt AND ta.state = 'DISPATCHED'
)
SELECT id FROM moved;

-- name: extend_leases
-- Heartbeat: extend every listed lease still held by its token; store new checkpoints.
-- A lease that ran out more than margin_s ago is not extended even if the reconciler
-- has not got to it yet: from then on the attempt is the reconciler's (re-dispatch, or
-- OUTCOME_UNKNOWN), and its worker has stopped it on its own (worker self-fencing). The
-- beat is refused, so a worker that did not fence itself is told to stop.
-- The hot path of a node with many running tasks (bench/heartbeats.py), so it answers
-- only the exceptions: the beats whose lease was NOT extended (stale token, task no
-- longer in flight, row gone) and the extended ones whose cancel was requested. The
-- common case, every lease extended, returns no row. Ids, times and tokens are bound in
-- binary (the b placeholders): dumping thousands of datetimes and UUIDs as text costs
-- the node several times more CPU than the statement itself.
WITH beats AS (
    SELECT *
    FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[], %(tokens)b::bigint[],
                %(checkpoints)b::bytea[])
         AS h(scheduled_at, id, token, checkpoint)
), locked AS MATERIALIZED (
    SELECT t.scheduled_at, t.id, h.token, h.checkpoint
    FROM (SELECT * FROM beats ORDER BY scheduled_at, id) AS h
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id, t.fencing_token, t.status, t.lease_expires_at
        FROM tasks AS t
        WHERE t.scheduled_at = h.scheduled_at AND t.id = h.id
          AND t.scheduled_at = ANY(%(instants)b::timestamptz[])
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
    WHERE t.fencing_token = h.token
      AND t.status IN ('DISPATCHED', 'RUNNING')
      AND t.lease_expires_at > now() - make_interval(secs => %(margin_s)s)
), extended AS (
    UPDATE tasks AS t
    SET lease_expires_at = now() + make_interval(secs => %(lease_s)s),
        checkpoint = COALESCE(h.checkpoint, t.checkpoint),
        updated_at = now()
    FROM locked AS h
    WHERE t.scheduled_at = h.scheduled_at
      AND t.id = h.id
    RETURNING t.id, t.fencing_token, t.cancel_requested_at IS NOT NULL AS cancel_requested,
              t.cancel_reason
)
SELECT h.id, h.token, e.id IS NOT NULL AS extended, e.cancel_requested, e.cancel_reason
FROM beats AS h
LEFT JOIN extended AS e ON e.id = h.id AND e.fencing_token = h.token
WHERE e.id IS NULL OR e.cancel_requested;

-- name: complete
-- DISPATCHED/RUNNING -> COMPLETED for the token's attempt (docs/architecture.md#d5; DISPATCHED too: a
-- completion may overtake its group-committed ack), and OUTCOME_UNKNOWN too: the late
-- completion of the attempt whose outcome was unknown makes it known. Appends the
-- watchdog's ledger. The state lists of the settlement statements are
-- chronoshard.scheduler.core.states.sources(event, implied_ack=True), checked by a test.
WITH done AS (
    SELECT *
    FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[], %(tokens)b::bigint[],
                %(results)b::text[])
         AS c(scheduled_at, id, token, result)
), locked AS MATERIALIZED (
    SELECT t.scheduled_at, t.id, c.result
    FROM (SELECT * FROM done ORDER BY scheduled_at, id) AS c
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id, t.fencing_token, t.status
        FROM tasks AS t
        WHERE t.scheduled_at = c.scheduled_at AND t.id = c.id
          AND t.scheduled_at = ANY(%(instants)b::timestamptz[])
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
    WHERE t.fencing_token = c.token
      AND t.status IN ('DISPATCHED', 'RUNNING', 'OUTCOME_UNKNOWN')
), moved AS (
    UPDATE tasks AS t
    SET status = 'COMPLETED',
        result_payload = c.result::jsonb,
        lease_expires_at = NULL,
        started_at = COALESCE(t.started_at, now()),
        finished_at = now(),
        updated_at = now()
    FROM locked AS c
    WHERE t.scheduled_at = c.scheduled_at
      AND t.id = c.id
    RETURNING t.id, t.attempt, t.job_id, t.tenant_id, t.finished_at, t.shard, t.scheduled_at,
              t.workflow_id
), attempts AS (
    UPDATE task_attempts AS ta
    SET state = 'SUCCEEDED', finished_at = now()
    FROM moved
    WHERE ta.task_id = moved.id AND ta.attempt = moved.attempt
), ledger AS (
    INSERT INTO task_completions (job_id, task_id, tenant_id, completed_at)
    SELECT job_id, id, tenant_id, finished_at
    FROM moved
    WHERE job_id IS NOT NULL
)
-- workflow_id: a workflow task's completion settles its run in this transaction
-- (store/workflow_progress.py).
SELECT id, shard, scheduled_at, workflow_id FROM moved;

-- name: lock_for_failure
-- Failure needs the row's retry budget and backoff to decide RETRYING or DEAD_LETTER:
-- lock the rows whose token still holds, decide in Python, then apply_failures.
SELECT t.id, t.scheduled_at, t.fencing_token, t.attempt, t.retry_count, t.max_retries,
       t.backoff_initial_s, t.backoff_max_s, t.backoff_multiplier, t.shard,
       t.cancel_requested_at IS NOT NULL AS cancel_requested
FROM (
    SELECT *
    FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[], %(tokens)b::bigint[])
         AS f(scheduled_at, id, token)
    ORDER BY scheduled_at, id
) AS f
CROSS JOIN LATERAL (
    SELECT *
    FROM tasks AS t
    WHERE t.scheduled_at = f.scheduled_at AND t.id = f.id
    LIMIT 1
    FOR UPDATE OF t
) AS t
-- Outside the lookup, on the row as locked: inside, the state would let it choose a
-- partial index of that state. A stale token's row is locked too, until the commit.
WHERE t.fencing_token = f.token
  AND t.status IN ('DISPATCHED', 'RUNNING', 'OUTCOME_UNKNOWN');

-- name: apply_failures
-- The decisions on rows lock_for_failure locked in this transaction; token and state are
-- checked again on the row as locked (a no-op lock: this transaction holds it).
WITH decided AS (
    SELECT *
    FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[], %(tokens)b::bigint[],
                %(statuses)b::text[], %(due_ats)b::timestamptz[], %(errors)b::text[],
                %(attempt_states)b::text[], %(retry_counts)b::integer[])
         AS d(scheduled_at, id, token, status, due_at, error, attempt_state, retry_count)
), locked AS MATERIALIZED (
    SELECT t.scheduled_at, t.id, d.status, d.due_at, d.error, d.attempt_state, d.retry_count
    FROM (SELECT * FROM decided ORDER BY scheduled_at, id) AS d
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id, t.fencing_token, t.status
        FROM tasks AS t
        WHERE t.scheduled_at = d.scheduled_at AND t.id = d.id
          AND t.scheduled_at = ANY(%(instants)b::timestamptz[])
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
    WHERE t.fencing_token = d.token
      AND t.status IN ('DISPATCHED', 'RUNNING', 'OUTCOME_UNKNOWN')
), moved AS (
    UPDATE tasks AS t
    SET status = d.status,
        due_at = COALESCE(d.due_at, t.due_at),
        retry_count = d.retry_count,
        last_error = d.error,
        worker_id = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN d.status IN ('DEAD_LETTER', 'CANCELLED') THEN now() END,
        updated_at = now()
    FROM locked AS d
    WHERE t.scheduled_at = d.scheduled_at
      AND t.id = d.id
    RETURNING t.id, t.attempt, t.shard, t.status, t.due_at, t.scheduled_at, t.workflow_id,
              d.attempt_state, d.error
)
UPDATE task_attempts AS ta
SET state = moved.attempt_state, finished_at = now(), error = moved.error
FROM moved
WHERE ta.task_id = moved.id AND ta.attempt = moved.attempt
RETURNING moved.id, moved.shard, moved.status, moved.due_at, moved.scheduled_at,
          moved.workflow_id;

-- name: release
-- The worker gives the task back (drain with checkpoint, cannot run it, or the node
-- could not deliver the assignment): back to PRELOADED for another dispatch. The retry
-- budget is untouched; the attempt row records why. From OUTCOME_UNKNOWN too: the worker
-- says what became of the attempt (never started, or stopped at its checkpoint).
WITH released AS (
    SELECT *
    FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[], %(tokens)b::bigint[],
                %(checkpoints)b::bytea[], %(attempt_states)b::text[], %(details)b::text[])
         AS r(scheduled_at, id, token, checkpoint, attempt_state, detail)
), locked AS MATERIALIZED (
    SELECT t.scheduled_at, t.id, r.checkpoint, r.attempt_state, r.detail
    FROM (SELECT * FROM released ORDER BY scheduled_at, id) AS r
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id, t.fencing_token, t.status
        FROM tasks AS t
        WHERE t.scheduled_at = r.scheduled_at AND t.id = r.id
          AND t.scheduled_at = ANY(%(instants)b::timestamptz[])
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
    WHERE t.fencing_token = r.token
      AND t.status IN ('DISPATCHED', 'RUNNING', 'OUTCOME_UNKNOWN')
), moved AS (
    UPDATE tasks AS t
    SET status = 'PRELOADED',
        checkpoint = COALESCE(r.checkpoint, t.checkpoint),
        worker_id = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    FROM locked AS r
    WHERE t.scheduled_at = r.scheduled_at
      AND t.id = r.id
    RETURNING t.id, t.scheduled_at, t.shard, t.tenant_id, t.priority, t.queue, t.type,
              t.due_at, t.strict_timing, t.attempt, r.attempt_state, r.detail
), attempts AS (
    UPDATE task_attempts AS ta
    SET state = moved.attempt_state, finished_at = now(), error = NULLIF(moved.detail, '')
    FROM moved
    WHERE ta.task_id = moved.id AND ta.attempt = moved.attempt
)
SELECT id, scheduled_at, shard, tenant_id, priority, queue, type, due_at, strict_timing
FROM moved;

-- name: settlement_state
-- What became of tasks whose settlement changed nothing: tells an idempotent repeat
-- (same token, already past that step) from a stale token.
SELECT t.id, t.fencing_token, t.status
FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[]) AS s(scheduled_at, id)
CROSS JOIN LATERAL (
    SELECT t.id, t.fencing_token, t.status
    FROM tasks AS t
    WHERE t.scheduled_at = s.scheduled_at AND t.id = s.id
    LIMIT 1
) AS t;

-- name: load_preloaded_refs
-- Tasks another node put back to PRELOADED (a release it accepted for our shard): the
-- owner reloads just those rows into its wheel.
SELECT t.id, t.scheduled_at, t.shard, t.tenant_id, t.priority, t.queue, t.type, t.due_at,
       t.strict_timing
FROM unnest(%(scheduled_ats)b::timestamptz[], %(ids)b::uuid[]) AS r(scheduled_at, id)
CROSS JOIN LATERAL (
    SELECT *
    FROM tasks AS t
    WHERE t.scheduled_at = r.scheduled_at AND t.id = r.id
    LIMIT 1
) AS t
-- Outside the lookup: inside, these would let it choose a partial index of the state.
WHERE t.shard = ANY(%(shards)b::smallint[])
  AND t.status = 'PRELOADED';

-- name: mark_fenced
-- An attempt the scheduler gave up (ABANDONED: lease expired, never acknowledged) whose
-- worker then settled or heartbeated with its superseded token: it ran after all and was
-- refused. The attempt row keeps why it was given up and adds that it was fenced.
UPDATE task_attempts AS ta
SET state = 'FENCED',
    error = concat_ws('; ', ta.error, 'its worker reported after the token was superseded')
FROM unnest(%(ids)b::uuid[], %(tokens)b::bigint[]) AS f(task_id, token)
WHERE ta.task_id = f.task_id
  AND ta.fencing_token = f.token
  AND ta.state = 'ABANDONED';
