-- The statements of chronoshard.scheduler.store.workflows (docs/architecture.md#d9):
-- creating a workflow, reading it, cancelling and retrying it, and what every terminal
-- write of one of its tasks does in its own transaction (release the children, fail the
-- doomed ones, finish the run). Every task of a run is scheduled at the run's
-- scheduled_at, so each read of a run's tasks names that one instant: one partition.

-- name: insert_run
-- ON CONFLICT on the idempotency key: a concurrent create with the same key waits for
-- this one, then inserts nothing; the caller reads the original (run_by_key).
INSERT INTO workflow_runs (id, tenant_id, name, scheduled_at, task_count, edge_count,
                           idempotency_key, request_fingerprint, submitted_by, job_id,
                           schedule_id, logical_date)
VALUES (%(id)s, %(tenant_id)s, %(name)s, %(scheduled_at)s, %(task_count)s, %(edge_count)s,
        %(idempotency_key)s, %(fingerprint)s, %(submitted_by)s, %(job_id)s, %(schedule_id)s,
        %(logical_date)s)
ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: run_by_key
SELECT *
FROM workflow_runs
WHERE tenant_id = %(tenant_id)s
  AND idempotency_key = %(idempotency_key)s;

-- name: insert_workflow_tasks
INSERT INTO workflow_tasks (task_id, workflow_id, ref, trigger_rule, position)
SELECT w.task_id, %(workflow_id)s, w.ref, w.trigger_rule, w.position
FROM unnest(%(task_ids)s::uuid[], %(refs)s::text[], %(trigger_rules)s::text[],
            %(positions)s::integer[]) AS w(task_id, ref, trigger_rule, position);

-- name: insert_edges
INSERT INTO task_dependencies (workflow_id, parent_task_id, child_task_id, child_scheduled_at)
SELECT %(workflow_id)s, e.parent, e.child, %(scheduled_at)s
FROM unnest(%(parents)s::uuid[], %(children)s::uuid[]) AS e(parent, child);

-- name: get_run
SELECT *
FROM workflow_runs
WHERE tenant_id = %(tenant_id)s
  AND id = %(id)s;

-- name: run_tasks
-- GetWorkflow: every task of the run with its ref and rule, parents first; the ref of an
-- UPSTREAM_FAILED task's cause.
SELECT t.*, w.ref AS workflow_ref, w.trigger_rule, c.ref AS upstream_cause_ref
FROM workflow_tasks AS w
JOIN tasks AS t ON t.scheduled_at = %(scheduled_at)s AND t.id = w.task_id
LEFT JOIN workflow_tasks AS c ON c.task_id = t.upstream_cause
WHERE w.workflow_id = %(workflow_id)s
ORDER BY w.position;

-- name: run_edges
SELECT p.ref AS parent, c.ref AS child
FROM task_dependencies AS d
JOIN workflow_tasks AS p ON p.task_id = d.parent_task_id
JOIN workflow_tasks AS c ON c.task_id = d.child_task_id
WHERE d.workflow_id = %(workflow_id)s
ORDER BY p.position, c.position;

-- name: list_runs
-- Newest first, paged by (created_at, id) on workflow_runs_tenant_idx.
SELECT *
FROM workflow_runs
WHERE tenant_id = %(tenant_id)s
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(after_created_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(after_created_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: graph_tasks
-- The graph as a failure's propagation and a retry read it: each task's rule and status.
SELECT w.task_id, w.trigger_rule, t.status
FROM workflow_tasks AS w
JOIN tasks AS t ON t.scheduled_at = %(scheduled_at)s AND t.id = w.task_id
WHERE w.workflow_id = %(workflow_id)s
ORDER BY w.position;

-- name: graph_edges
SELECT parent_task_id, child_task_id
FROM task_dependencies
WHERE workflow_id = %(workflow_id)s;

-- name: open_task_ids
-- The run's tasks that are not terminal (tasks_workflow_open_idx), for a cancel.
SELECT id
FROM tasks
WHERE workflow_id = %(workflow_id)s
  AND scheduled_at = %(scheduled_at)s
  AND status NOT IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER', 'UPSTREAM_FAILED')
ORDER BY id;

-- name: release_children
-- A parent became terminal: one off each child still waiting, per edge from the parents
-- given (those this transaction made terminal, and the tasks it failed upstream). Rows
-- are locked in key order, so concurrent releases of one child queue instead of
-- deadlocking, and each decrement reads the count the previous one committed: none is
-- lost, none doubled (the parents' own status guards let each become terminal once; the
-- CHECK on unresolved_dependencies >= 0 would refuse a doubled one). A child reaching 0
-- is due now: it enters tasks_preload_idx, which the preloader and its shard signal read.
WITH released AS (
    SELECT d.child_scheduled_at AS scheduled_at, d.child_task_id AS id, count(*)::integer AS n
    FROM task_dependencies AS d
    WHERE d.parent_task_id = ANY(%(parents)s::uuid[])
    GROUP BY 1, 2
), locked AS MATERIALIZED (
    SELECT t.scheduled_at, t.id, r.n
    FROM (SELECT * FROM released ORDER BY scheduled_at, id) AS r
    CROSS JOIN LATERAL (
        SELECT t.scheduled_at, t.id
        FROM tasks AS t
        WHERE t.scheduled_at = r.scheduled_at AND t.id = r.id
        LIMIT 1
        FOR UPDATE OF t
    ) AS t
)
UPDATE tasks AS t
SET unresolved_dependencies = t.unresolved_dependencies - l.n,
    due_at = CASE WHEN t.unresolved_dependencies = l.n THEN now() ELSE t.due_at END,
    updated_at = now()
FROM locked AS l
WHERE t.scheduled_at = l.scheduled_at
  AND t.id = l.id
  AND t.status = 'SCHEDULED'
RETURNING t.id, t.shard, t.due_at, t.unresolved_dependencies;

-- name: fail_upstream
-- SCHEDULED -> UPSTREAM_FAILED with the cause the propagation decided. The status guard
-- is what makes concurrent failures safe: the first to lock a shared descendant writes
-- it; the other's update passes over it (and so does not release its children twice).
WITH doomed AS (
    SELECT *
    FROM unnest(%(ids)s::uuid[], %(causes)s::uuid[], %(errors)s::text[]) AS d(id, cause, error)
    ORDER BY id
)
UPDATE tasks AS t
SET status = 'UPSTREAM_FAILED',
    upstream_cause = d.cause,
    last_error = d.error,
    finished_at = now(),
    updated_at = now()
FROM doomed AS d
WHERE t.scheduled_at = %(scheduled_at)s
  AND t.id = d.id
  AND t.status = 'SCHEDULED'
RETURNING t.id;

-- name: lock_runs
-- Taken after the task rows: terminal writes of one run queue here, so the next
-- statement (a new snapshot) sees every write that finished before this one.
SELECT id
FROM workflow_runs
WHERE id = ANY(%(ids)s::uuid[])
  AND state = 'RUNNING'
ORDER BY id
FOR UPDATE;

-- name: finished_runs
-- Of the runs given, those with no task left that is not terminal, with the distinct
-- statuses of their tasks.
SELECT w.id, ARRAY(SELECT DISTINCT t.status FROM tasks AS t
                   WHERE t.workflow_id = w.id AND t.scheduled_at = w.scheduled_at) AS statuses
FROM workflow_runs AS w
WHERE w.id = ANY(%(ids)s::uuid[])
  AND NOT EXISTS (
      SELECT 1 FROM tasks AS n
      WHERE n.workflow_id = w.id
        AND n.scheduled_at = w.scheduled_at  -- one partition
        AND n.status NOT IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER', 'UPSTREAM_FAILED')
  );

-- name: set_run_states
-- A run that SUCCEEDED completes its job: one ledger row keyed by the run's id (the
-- watchdog's view of "the job ran", as a task's completion is; ids never collide).
WITH moved AS (
    UPDATE workflow_runs AS w
    SET state = f.state,
        finished_at = CASE WHEN f.state = 'RUNNING' THEN NULL ELSE now() END
    FROM unnest(%(ids)s::uuid[], %(states)s::text[], %(expected)s::text[])
         AS f(id, state, expected)
    WHERE w.id = f.id
      AND w.state = f.expected
    RETURNING w.*
), ledger AS (
    INSERT INTO task_completions (job_id, task_id, tenant_id, completed_at)
    SELECT job_id, id, tenant_id, finished_at
    FROM moved
    WHERE state = 'SUCCEEDED' AND job_id IS NOT NULL
    ON CONFLICT (task_id) DO NOTHING
)
SELECT * FROM moved;

-- name: reopen_tasks
-- RetryWorkflow: each task as the plan read it (its status compared, so a concurrent
-- retry or cancel changes nothing here) back to SCHEDULED with its parents that are
-- reopened too as its count, a fresh retry budget, no cause and no cancel request.
-- attempt and fencing_token continue; last_error stays as the record of the failure.
WITH plan AS (
    SELECT *
    FROM unnest(%(ids)s::uuid[], %(statuses)s::text[], %(unresolved)s::integer[])
         AS p(id, status, unresolved)
    ORDER BY id
)
UPDATE tasks AS t
SET status = 'SCHEDULED',
    unresolved_dependencies = p.unresolved,
    due_at = now(),
    retry_count = 0,
    upstream_cause = NULL,
    worker_id = NULL,
    lease_expires_at = NULL,
    finished_at = NULL,
    cancel_requested_at = NULL,
    cancel_reason = NULL,
    updated_at = now()
FROM plan AS p
WHERE t.scheduled_at = %(scheduled_at)s
  AND t.id = p.id
  AND t.status = p.status
RETURNING t.id, t.shard, t.due_at, t.unresolved_dependencies;

-- name: places
-- A dispatched workflow task's place in its run, for its assignment: its own ref, and
-- its parents with what they returned, in the run's order (a task without parents: one
-- row, its parent columns NULL). The caller bounds the results' total size.
SELECT c.task_id, c.ref, p.id AS parent_id, pw.ref AS parent_ref, p.status AS parent_status,
       p.result_payload::text AS result_json
FROM workflow_tasks AS c
LEFT JOIN task_dependencies AS d ON d.child_task_id = c.task_id
LEFT JOIN workflow_tasks AS pw ON pw.task_id = d.parent_task_id
LEFT JOIN tasks AS p ON p.scheduled_at = d.child_scheduled_at AND p.id = d.parent_task_id
WHERE c.task_id = ANY(%(ids)s::uuid[])
ORDER BY c.task_id, pw.position;
