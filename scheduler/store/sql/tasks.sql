-- The statements of chronoshard.scheduler.store.tasks.TaskQueries: ListTasks, CancelTask,
-- RetryTask and ResolveTask (submit and GetTask use the Store's database.sql).
--
-- Rules (as in database.sql): every statement names the caller's tenant; a write names its
-- row by (scheduled_at, id) and the states it may start from (%(sources)s, from
-- chronoshard.scheduler.core.states), so a row that moved on changes nothing.

-- name: list_tasks
-- One page of a tenant's tasks in (scheduled_at, id) order, keyset-paged: the row
-- comparison and the order are those of tasks_tenant_idx (tenant_id, scheduled_at, id),
-- so each page is an index range scan however deep the listing goes, and the
-- scheduled_at bounds prune partitions. The other filters are checked on the rows the
-- index yields. The column list is spelled out so that, without include_payloads, the
-- large columns are not even read (the Task model needs every other column listed).
SELECT id, tenant_id, type, scheduled_at, due_at, status, fencing_token, idempotency_key,
       retry_count, max_retries, backoff_initial_s, backoff_max_s, backoff_multiplier,
       jitter_mode,
       CASE WHEN %(include_payloads)s THEN payload ELSE '{}'::jsonb END AS payload,
       CASE WHEN %(include_payloads)s THEN result_payload END AS result_payload,
       CASE WHEN %(include_payloads)s THEN checkpoint END AS checkpoint,
       shard, priority, queue, strict_timing, idempotent, timeout_s, lease_expires_at,
       worker_id, attempt, job_id, workflow_id, unresolved_dependencies, schedule_id,
       logical_date, trace_context, last_error, submitted_by, created_at, updated_at,
       started_at, finished_at, cancel_requested_at, cancel_reason, upstream_cause
FROM tasks
WHERE tenant_id = %(tenant_id)s
  AND (scheduled_at, id) > (COALESCE(%(after_at)s::timestamptz, '-infinity'),
                            COALESCE(%(after_id)s::uuid, '00000000-0000-0000-0000-000000000000'))
  AND scheduled_at >= COALESCE(%(scheduled_from)s::timestamptz, '-infinity')
  AND scheduled_at < COALESCE(%(scheduled_before)s::timestamptz, 'infinity')
  AND due_at >= COALESCE(%(due_from)s::timestamptz, '-infinity')
  AND due_at < COALESCE(%(due_before)s::timestamptz, 'infinity')
  AND (cardinality(%(statuses)s::text[]) = 0 OR status = ANY(%(statuses)s::text[]))
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s::text)
ORDER BY scheduled_at, id
LIMIT %(limit)s;

-- name: cancel_task
-- One statement for both kinds of cancel, decided on the row as it is when the UPDATE
-- locks it (SET expressions read the old row): an %(immediate)s state becomes CANCELLED
-- at once, with its live attempt; RUNNING stays RUNNING with the request recorded, and
-- the worker's acknowledgement finishes it (handled by the worker gateway). A repeated
-- request keeps the first request's time and reason. One task (CancelTask) or every
-- live task of a workflow (CancelWorkflow: its tasks share one scheduled_at).
WITH moved AS (
    UPDATE tasks AS t
    SET status = CASE WHEN t.status = ANY(%(immediate)s::text[]) THEN 'CANCELLED'
                      ELSE t.status END,
        finished_at = CASE WHEN t.status = ANY(%(immediate)s::text[]) THEN now()
                           ELSE t.finished_at END,
        last_error = CASE WHEN t.status = ANY(%(immediate)s::text[]) THEN %(reason)s::text
                          ELSE t.last_error END,
        lease_expires_at = CASE WHEN t.status = ANY(%(immediate)s::text[]) THEN NULL
                                ELSE t.lease_expires_at END,
        cancel_requested_at = COALESCE(t.cancel_requested_at, now()),
        cancel_reason = COALESCE(t.cancel_reason, %(reason)s::text),
        updated_at = now()
    WHERE t.scheduled_at = %(scheduled_at)s
      AND t.id = ANY(%(ids)s::uuid[])
      AND t.tenant_id = %(tenant_id)s
      AND t.status = ANY(%(sources)s::text[])
    RETURNING t.*
), attempts AS (
    UPDATE task_attempts AS ta
    SET state = 'CANCELLED', finished_at = now()
    FROM moved
    WHERE moved.status = 'CANCELLED'
      AND ta.task_id = moved.id
      AND ta.attempt = moved.attempt
      AND ta.state IN ('DISPATCHED', 'RUNNING')
)
SELECT * FROM moved;

-- name: retry_task
-- Operator retry: DEAD_LETTER -> SCHEDULED with a fresh retry budget, due at %(due_at)s.
-- attempt and fencing_token are kept, so the next dispatch continues their numbering;
-- last_error is kept as the record of why it had died.
UPDATE tasks
SET status = 'SCHEDULED',
    due_at = %(due_at)s,
    retry_count = 0,
    worker_id = NULL,
    lease_expires_at = NULL,
    finished_at = NULL,
    cancel_requested_at = NULL,
    cancel_reason = NULL,
    updated_at = now()
WHERE scheduled_at = %(scheduled_at)s
  AND id = %(id)s
  AND tenant_id = %(tenant_id)s
  AND status = ANY(%(sources)s::text[])
RETURNING *;

-- name: resolve_task
-- Operator resolution of an OUTCOME_UNKNOWN task: to SCHEDULED due at %(due_at)s (RETRY:
-- the next intent gives it token + 1, so a late write of the unknown attempt is fenced)
-- or to DEAD_LETTER (MARK_FAILED), with the note as last_error. Its current attempt, the
-- one whose outcome is unknown, keeps that state and records the resolution and the note.
-- attempt, fencing_token and retry_count are kept (the unknown attempt was no failure).
WITH moved AS (
    UPDATE tasks AS t
    SET status = %(target)s::text,
        due_at = CASE WHEN %(target)s::text = 'SCHEDULED' THEN %(due_at)s ELSE t.due_at END,
        worker_id = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN %(target)s::text = 'DEAD_LETTER' THEN now() END,
        last_error = %(note)s::text,
        updated_at = now()
    WHERE t.scheduled_at = %(scheduled_at)s
      AND t.id = %(id)s
      AND t.tenant_id = %(tenant_id)s
      AND t.status = 'OUTCOME_UNKNOWN'
    RETURNING t.*
), attempts AS (
    UPDATE task_attempts AS ta
    SET resolution = %(resolution)s::text,
        finished_at = COALESCE(ta.finished_at, now()),
        error = concat_ws('; ', ta.error, %(note)s::text)
    FROM moved
    WHERE ta.task_id = moved.id
      AND ta.attempt = moved.attempt
      AND ta.state = 'OUTCOME_UNKNOWN'
)
SELECT * FROM moved;
