-- The statements of chronoshard.scheduler.store.schedules.ScheduleStore: the schedules
-- of the ScheduleService (create, read, change, withdraw what was created ahead) and the
-- materialiser's pass (the due schedules of the fenced shards, their occurrences keyed
-- (schedule_id, logical_date), the schedules' new instants).

-- name: insert_schedule
-- A name the tenant already uses inserts nothing (ALREADY_EXISTS).
INSERT INTO schedules (
    id, tenant_id, name, shard, cron, interval_s, timezone, anchor_at, start_at, end_at,
    task_template, workflow_template, catchup_policy, catchup_limit, misfire_grace_s,
    overlap_policy, job_id, watch, expected_duration_s, tolerance_s, severity, cursor_at, next_at, materialise_at
)
VALUES (
    %(id)s, %(tenant_id)s, %(name)s, %(shard)s, %(cron)s, %(interval_s)s, %(timezone)s,
    %(anchor_at)s, %(start_at)s, %(end_at)s, %(task_template)s, %(workflow_template)s,
    %(catchup_policy)s,
    %(catchup_limit)s, %(misfire_grace_s)s, %(overlap_policy)s, %(job_id)s, %(watch)s,
    %(expected_duration_s)s, %(tolerance_s)s, %(severity)s, %(cursor_at)s, %(next_at)s,
    %(materialise_at)s
)
ON CONFLICT (tenant_id, name) DO NOTHING
RETURNING *;

-- name: get_schedule
-- By id or by name: the API accepts either wherever it takes a schedule.
SELECT *
FROM schedules
WHERE tenant_id = %(tenant_id)s
  AND (id = %(id)s OR name = %(name)s)
ORDER BY id = %(id)s DESC
LIMIT 1;

-- name: lock_schedule
SELECT *
FROM schedules
WHERE tenant_id = %(tenant_id)s
  AND (id = %(id)s OR name = %(name)s)
ORDER BY id = %(id)s DESC
LIMIT 1
FOR UPDATE;

-- name: list_schedules
-- Keyset paging by name (unique per tenant): the UNIQUE (tenant_id, name) index.
SELECT *
FROM schedules
WHERE tenant_id = %(tenant_id)s
  AND (%(after)s::text IS NULL OR name > %(after)s::text)
ORDER BY name
LIMIT %(limit)s;

-- name: update_spec
UPDATE schedules
SET name = %(name)s, cron = %(cron)s, interval_s = %(interval_s)s, timezone = %(timezone)s,
    anchor_at = %(anchor_at)s, start_at = %(start_at)s, end_at = %(end_at)s,
    task_template = %(task_template)s, workflow_template = %(workflow_template)s,
    catchup_policy = %(catchup_policy)s,
    catchup_limit = %(catchup_limit)s, misfire_grace_s = %(misfire_grace_s)s,
    overlap_policy = %(overlap_policy)s, job_id = %(job_id)s, watch = %(watch)s,
    expected_duration_s = %(expected_duration_s)s, tolerance_s = %(tolerance_s)s,
    severity = %(severity)s, cursor_at = %(cursor_at)s, next_at = %(next_at)s,
    materialise_at = %(materialise_at)s, buffered_at = NULL, updated_at = now()
WHERE id = %(id)s
RETURNING *;

-- name: set_paused
UPDATE schedules
SET paused = %(paused)s, cursor_at = %(cursor_at)s, next_at = %(next_at)s,
    materialise_at = %(materialise_at)s, buffered_at = NULL, updated_at = now()
WHERE id = %(id)s
RETURNING *;

-- name: delete_schedule
-- Its occurrence rows go with it (ON DELETE CASCADE); its tasks stay as history.
DELETE FROM schedules WHERE id = %(id)s;

-- name: withdraw_ahead
-- Occurrences created ahead that have not started: their tasks become CANCELLED (a
-- PRELOADED one still on some node's wheel is then skipped by the intent, which takes
-- only PRELOADED rows) and their rows go, so they can be decided again under a new spec.
-- A workflow occurrence has not started while none of its run's tasks has; its waiting
-- tasks are cancelled the same way (the caller then finishes the run). Occurrences
-- skipped ahead (no task, no run) go too. One that started stays: it is running.
WITH ahead AS (
    SELECT o.logical_date, o.task_id, o.task_scheduled_at, o.workflow_id, w.scheduled_at
    FROM schedule_occurrences AS o
    LEFT JOIN workflow_runs AS w ON w.id = o.workflow_id
    WHERE o.schedule_id = %(schedule_id)s
      AND o.logical_date > %(after)s
), unstarted_runs AS (
    SELECT a.logical_date, a.workflow_id, a.scheduled_at
    FROM ahead AS a
    WHERE a.workflow_id IS NOT NULL
      AND NOT EXISTS (
          SELECT 1 FROM tasks AS s
          WHERE s.workflow_id = a.workflow_id
            AND s.scheduled_at = a.scheduled_at
            AND s.status NOT IN ('SCHEDULED', 'PRELOADED')
      )
), withdrawn AS (
    UPDATE tasks AS t
    SET status = 'CANCELLED',
        finished_at = now(),
        last_error = %(reason)s,
        cancel_requested_at = now(),
        cancel_reason = %(reason)s,
        updated_at = now()
    FROM (
        SELECT logical_date, task_id AS id, task_scheduled_at AS scheduled_at, NULL::uuid AS run
        FROM ahead
        WHERE task_id IS NOT NULL
        UNION ALL
        SELECT r.logical_date, m.id, m.scheduled_at, r.workflow_id
        FROM unstarted_runs AS r
        JOIN tasks AS m ON m.workflow_id = r.workflow_id AND m.scheduled_at = r.scheduled_at
    ) AS o
    WHERE t.id = o.id
      AND t.scheduled_at = o.scheduled_at
      AND t.status IN ('SCHEDULED', 'PRELOADED')
    RETURNING t.id, t.shard, o.logical_date, o.run
), gone AS (
    DELETE FROM schedule_occurrences AS o
    WHERE o.schedule_id = %(schedule_id)s
      AND o.logical_date > %(after)s
      AND ((o.task_id IS NULL AND o.workflow_id IS NULL)
           OR o.logical_date IN (SELECT logical_date FROM withdrawn)
           OR o.logical_date IN (SELECT logical_date FROM unstarted_runs))
)
SELECT id, shard, run FROM withdrawn;

-- name: newest_occurrence
SELECT max(logical_date) FROM schedule_occurrences WHERE schedule_id = %(schedule_id)s;

-- name: runs
-- The newest occurrences with what their tasks are now (a task dropped by retention
-- reads as NULL).
SELECT o.logical_date, o.origin, o.task_id, t.status, t.finished_at, o.workflow_id,
       w.state AS run_state, w.finished_at AS run_finished_at
FROM schedule_occurrences AS o
LEFT JOIN LATERAL (
    SELECT t.status, t.finished_at
    FROM tasks AS t
    WHERE t.id = o.task_id AND t.scheduled_at = o.task_scheduled_at
) AS t ON true
LEFT JOIN workflow_runs AS w ON w.id = o.workflow_id
WHERE o.schedule_id = %(schedule_id)s
ORDER BY o.logical_date DESC
LIMIT %(limit)s;

-- name: insert_occurrences
-- The idempotency key of an occurrence: one that exists is left alone and not returned,
-- so its task is not inserted (a retried pass, a backfill over runs that happened).
INSERT INTO schedule_occurrences (schedule_id, logical_date, tenant_id, origin, task_id,
                                  task_scheduled_at, workflow_id)
SELECT o.schedule_id, o.logical_date, o.tenant_id, o.origin, o.task_id, o.task_scheduled_at,
       o.workflow_id
FROM unnest(%(schedule_ids)s::uuid[], %(logical_dates)s::timestamptz[],
            %(tenant_ids)s::uuid[], %(origins)s::text[], %(task_ids)s::uuid[],
            %(task_scheduled_ats)s::timestamptz[], %(workflow_ids)s::uuid[])
     AS o(schedule_id, logical_date, tenant_id, origin, task_id, task_scheduled_at,
          workflow_id)
ORDER BY o.schedule_id, o.logical_date
ON CONFLICT (schedule_id, logical_date) DO NOTHING
RETURNING schedule_id, logical_date;

-- name: due_schedules
-- The materialiser's pass: schedules of the fenced shards whose time to look has come,
-- soonest first, each with whether its newest occurrence still runs (overlap): its task,
-- or its workflow run.
-- SKIP LOCKED: a schedule an API call holds is looked at next pass, not waited for.
SELECT s.*,
       ((t.status IS NOT NULL
         AND t.status NOT IN ('COMPLETED', 'DEAD_LETTER', 'CANCELLED', 'UPSTREAM_FAILED'))
        OR w.state = 'RUNNING') AS previous_running
FROM schedules AS s
LEFT JOIN LATERAL (
    SELECT t.status
    FROM tasks AS t
    WHERE t.id = s.last_task_id AND t.scheduled_at = s.last_task_scheduled_at
) AS t ON true
LEFT JOIN workflow_runs AS w ON w.id = s.last_workflow_id
WHERE s.shard = ANY(%(shards)s::smallint[])
  AND NOT s.paused
  AND s.materialise_at <= %(now)s
ORDER BY s.materialise_at
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED;

-- name: advance_schedules
UPDATE schedules AS s
SET cursor_at = a.cursor_at, next_at = a.next_at, materialise_at = a.materialise_at,
    buffered_at = a.buffered_at,
    last_task_id = COALESCE(a.last_task_id, s.last_task_id),
    last_task_scheduled_at = COALESCE(a.last_task_scheduled_at, s.last_task_scheduled_at),
    last_workflow_id = COALESCE(a.last_workflow_id, s.last_workflow_id)
FROM unnest(%(ids)s::uuid[], %(cursor_ats)s::timestamptz[], %(next_ats)s::timestamptz[],
            %(materialise_ats)s::timestamptz[], %(buffered_ats)s::timestamptz[],
            %(last_task_ids)s::uuid[], %(last_task_scheduled_ats)s::timestamptz[],
            %(last_workflow_ids)s::uuid[])
     AS a(id, cursor_at, next_at, materialise_at, buffered_at, last_task_id,
          last_task_scheduled_at, last_workflow_id)
WHERE s.id = a.id;

