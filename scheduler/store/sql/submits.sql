-- The statements of chronoshard.scheduler.store.submits.SubmitStore: a batch of submits
-- in one transaction (tenants checked, idempotency keys claimed and read back, the new
-- tasks inserted in one statement) or, without keys, the insert alone; and the read-back
-- of repeats' originals and of a batch whose commit outcome was unknown.

-- name: tenants_exist
SELECT id FROM tenants WHERE id = ANY(%(tenant_ids)b::uuid[]);

-- name: claim_idempotency_keys
-- One statement for the whole batch (which may hold several tenants' submits, coalesced
-- by group commit), in (tenant, key) order, so two batches sharing keys lock them in the
-- same order (no deadlock). ON CONFLICT DO NOTHING waits for a concurrent insert of the
-- same key to commit or abort, then skips: whoever committed first owns the key. A key
-- repeated inside one batch is claimed by its first occurrence.
INSERT INTO idempotency_keys (tenant_id, key, task_id, scheduled_at, request_fingerprint)
SELECT k.tenant_id, k.key, k.task_id, k.scheduled_at, k.fingerprint
FROM unnest(%(tenant_ids)b::uuid[], %(keys)b::text[], %(task_ids)b::uuid[],
            %(scheduled_ats)b::timestamptz[], %(fingerprints)b::text[])
     WITH ORDINALITY AS k(tenant_id, key, task_id, scheduled_at, fingerprint, ord)
ORDER BY k.ord
ON CONFLICT (tenant_id, key) DO NOTHING;

-- name: get_idempotency_keys
SELECT i.tenant_id, i.key, i.task_id, i.scheduled_at, i.request_fingerprint
FROM idempotency_keys AS i
JOIN unnest(%(tenant_ids)b::uuid[], %(keys)b::text[]) AS k(tenant_id, key)
  ON i.tenant_id = k.tenant_id AND i.key = k.key;

-- name: insert_tasks
-- A whole batch in one statement: one array per column, unnested into rows. One parse,
-- one plan and one round trip however many rows; PostgreSQL routes each row to its day
-- partition. Payloads and trace contexts arrive as JSON text and are cast per row. The
-- arrays are bound in binary format (the b placeholders): psycopg dumps them several
-- times faster than as text. Rows of tenants that do not exist are left out (not an
-- error): a batch without idempotency keys runs this alone, self-committing, and tells
-- an unknown tenant by its rows missing from RETURNING. RETURNING holds only what the
-- server chose or may have rewritten: the time, and the payload (jsonb writes numbers
-- out in full: 1e+16 comes back 10000000000000000, an int); the store builds the rest of
-- each task from what it sent (core.models.inserted_task): parsing all 40 columns of
-- every row back cost more CPU than the insert.
INSERT INTO tasks (
    id, tenant_id, type, scheduled_at, due_at, status, idempotency_key, max_retries,
    backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode, payload, shard,
    priority, queue, strict_timing, idempotent, timeout_s, job_id, workflow_id,
    unresolved_dependencies, schedule_id, logical_date, trace_context, submitted_by
)
SELECT t.id, t.tenant_id, t.type, t.scheduled_at, t.due_at, 'SCHEDULED', t.idempotency_key,
       t.max_retries, t.backoff_initial_s, t.backoff_max_s, t.backoff_multiplier,
       t.jitter_mode, t.payload::jsonb, t.shard, t.priority, t.queue, t.strict_timing,
       t.idempotent, t.timeout_s, t.job_id, t.workflow_id, t.unresolved_dependencies,
       t.schedule_id, t.logical_date, t.trace_context::jsonb, t.submitted_by
FROM unnest(
    %(id)b::uuid[], %(tenant_id)b::uuid[], %(type)b::text[], %(scheduled_at)b::timestamptz[],
    %(due_at)b::timestamptz[], %(idempotency_key)b::text[], %(max_retries)b::integer[],
    %(backoff_initial_s)b::double precision[], %(backoff_max_s)b::double precision[],
    %(backoff_multiplier)b::double precision[], %(jitter_mode)b::text[],
    %(payload)b::text[], %(shard)b::smallint[], %(priority)b::text[], %(queue)b::text[],
    %(strict_timing)b::boolean[], %(idempotent)b::boolean[],
    %(timeout_s)b::double precision[], %(job_id)b::text[], %(workflow_id)b::uuid[],
    %(unresolved_dependencies)b::integer[], %(schedule_id)b::uuid[],
    %(logical_date)b::timestamptz[], %(trace_context)b::text[], %(submitted_by)b::text[]
) AS t(id, tenant_id, type, scheduled_at, due_at, idempotency_key, max_retries,
       backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode, payload, shard,
       priority, queue, strict_timing, idempotent, timeout_s, job_id, workflow_id,
       unresolved_dependencies, schedule_id, logical_date, trace_context, submitted_by)
WHERE EXISTS (SELECT FROM tenants AS k WHERE k.id = t.tenant_id)
RETURNING id, created_at, payload;

-- name: insert_task
-- insert_tasks for a batch of one (a lone single submit, the common case of one producer):
-- the same row from scalar parameters. Dumping insert_tasks' 25 one-element arrays cost
-- more of the node's CPU than anything else a submit does (each list is inspected for its
-- element type before it is written); scalars go out through psycopg's C dumpers.
INSERT INTO tasks (
    id, tenant_id, type, scheduled_at, due_at, status, idempotency_key, max_retries,
    backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode, payload, shard,
    priority, queue, strict_timing, idempotent, timeout_s, job_id, workflow_id,
    unresolved_dependencies, schedule_id, logical_date, trace_context, submitted_by
)
SELECT %(id)b::uuid, %(tenant_id)b::uuid, %(type)b::text, %(scheduled_at)b::timestamptz,
       %(due_at)b::timestamptz, 'SCHEDULED', %(idempotency_key)b::text,
       %(max_retries)b::integer, %(backoff_initial_s)b::double precision,
       %(backoff_max_s)b::double precision, %(backoff_multiplier)b::double precision,
       %(jitter_mode)b::text, %(payload)b::text::jsonb, %(shard)b::smallint,
       %(priority)b::text, %(queue)b::text, %(strict_timing)b::boolean,
       %(idempotent)b::boolean, %(timeout_s)b::double precision, %(job_id)b::text,
       %(workflow_id)b::uuid, %(unresolved_dependencies)b::integer, %(schedule_id)b::uuid,
       %(logical_date)b::timestamptz, %(trace_context)b::text::jsonb, %(submitted_by)b::text
WHERE EXISTS (SELECT FROM tenants AS k WHERE k.id = %(tenant_id)b::uuid)
RETURNING id, created_at, payload;

-- name: get_tasks_by_ref
-- Originals of idempotent repeats: scheduled_at = ANY prunes to their partitions.
SELECT *
FROM tasks
WHERE tenant_id = ANY(%(tenant_ids)b::uuid[])
  AND scheduled_at = ANY(%(scheduled_ats)b::timestamptz[])
  AND id = ANY(%(ids)b::uuid[]);
