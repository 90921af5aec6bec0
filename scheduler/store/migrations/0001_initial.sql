-- 0001: every table of DESIGN §3.
--
-- Applied by `chronoshard migrate` in one transaction (never add BEGIN/COMMIT here).
-- Conventions: timestamptz everywhere, enum-like text columns guarded by CHECK
-- constraints whose values are exactly what chronoshard.scheduler.states stores, and no
-- foreign key that points INTO the partitioned `tasks` table: its primary key must
-- contain the partition key (scheduled_at), and a reference into it would stop
-- retention from dropping partitions. Rows that belong to a task (attempts, keys,
-- dependencies) are removed together with its partition by
-- chronoshard_detach_old_partitions (0002), which also creates the day partitions.

CREATE TABLE tenants (
    id                      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name                    text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    tier                    text NOT NULL CHECK (length(tier) BETWEEN 1 AND 64),
    rate_limit_rps          double precision NOT NULL CHECK (rate_limit_rps > 0),
    max_concurrent_workers  integer NOT NULL CHECK (max_concurrent_workers > 0),
    home_region             text NOT NULL CHECK (length(home_region) BETWEEN 1 AND 64),
    -- Only a hash is stored; lookups at authentication go through this unique index.
    api_key_hash            text NOT NULL UNIQUE CHECK (length(api_key_hash) > 0),
    created_at              timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE workflow_runs (
    id           uuid PRIMARY KEY,
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    name         text NOT NULL DEFAULT '',
    state        text NOT NULL DEFAULT 'RUNNING'
                 CHECK (state IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
-- The reconciler looks for runs still marked running (DESIGN §8 step 3).
CREATE INDEX workflow_runs_active_idx ON workflow_runs (state, created_at)
    WHERE state = 'RUNNING';
CREATE INDEX workflow_runs_tenant_idx ON workflow_runs (tenant_id, created_at);

CREATE TABLE schedules (
    id                 uuid PRIMARY KEY,
    tenant_id          uuid NOT NULL REFERENCES tenants (id),
    name               text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    cron               text NOT NULL CHECK (length(cron) > 0),
    timezone           text NOT NULL CHECK (length(timezone) > 0),
    -- What each occurrence submits (type, payload, priority, ...), a JSON object.
    task_template      jsonb NOT NULL CHECK (jsonb_typeof(task_template) = 'object'),
    catchup_policy     text NOT NULL DEFAULT 'SKIP'
                       CHECK (catchup_policy IN ('SKIP', 'LATEST', 'ALL')),
    -- Bound on how many missed occurrences catchup ALL may create at once.
    catchup_limit      integer NOT NULL DEFAULT 100 CHECK (catchup_limit > 0),
    overlap_policy     text NOT NULL DEFAULT 'ALLOW'
                       CHECK (overlap_policy IN ('ALLOW', 'SKIP', 'BUFFER_ONE')),
    next_logical_date  timestamptz NOT NULL,
    paused             boolean NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
-- The materialiser scans unpaused schedules whose next occurrence is near.
CREATE INDEX schedules_due_idx ON schedules (next_logical_date) WHERE NOT paused;

CREATE TABLE tasks (
    id                       uuid NOT NULL,
    tenant_id                uuid NOT NULL REFERENCES tenants (id),
    type                     text NOT NULL CHECK (length(type) BETWEEN 1 AND 200),
    -- The time the client asked for: the partition key, never moved (retries move due_at).
    scheduled_at             timestamptz NOT NULL,
    -- scheduled_at + jitter, computed once at submit; moved only by retry backoff.
    due_at                   timestamptz NOT NULL,
    status                   text NOT NULL DEFAULT 'SCHEDULED'
                             CHECK (status IN ('SCHEDULED', 'PRELOADED', 'DISPATCHED',
                                               'RUNNING', 'COMPLETED', 'RETRYING',
                                               'DEAD_LETTER', 'CANCELLED', 'UPSTREAM_FAILED')),
    fencing_token            bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
    idempotency_key          text,
    retry_count              integer NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    max_retries              integer NOT NULL CHECK (max_retries >= 0),
    backoff_initial_s        double precision NOT NULL CHECK (backoff_initial_s > 0),
    backoff_max_s            double precision NOT NULL,
    backoff_multiplier       double precision NOT NULL CHECK (backoff_multiplier >= 1),
    jitter_mode              text NOT NULL
                             CHECK (jitter_mode IN ('SYMMETRIC', 'DELAY_ONLY', 'NONE')),
    payload                  jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    result_payload           jsonb,
    shard                    smallint NOT NULL CHECK (shard >= 0),
    priority                 text NOT NULL CHECK (priority IN ('critical', 'standard', 'bulk')),
    queue                    text NOT NULL,
    strict_timing            boolean NOT NULL DEFAULT false,
    -- Safe to re-run after a lost lease while the old worker may still be alive (§7).
    idempotent               boolean NOT NULL DEFAULT false,
    -- NULL: no limit on a single attempt.
    timeout_s                double precision CHECK (timeout_s > 0),
    lease_expires_at         timestamptz,
    worker_id                text,
    attempt                  integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    -- Opaque to the scheduler (the API carries checkpoints as bytes), hence bytea.
    checkpoint               bytea,
    job_id                   text,
    workflow_id              uuid REFERENCES workflow_runs (id),
    unresolved_dependencies  integer NOT NULL DEFAULT 0 CHECK (unresolved_dependencies >= 0),
    -- No foreign key: deleting a schedule must not need to touch task history.
    schedule_id              uuid,
    logical_date             timestamptz,
    trace_context            jsonb CHECK (jsonb_typeof(trace_context) = 'object'),
    last_error               text,
    submitted_by             text,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now(),
    started_at               timestamptz,
    finished_at              timestamptz,
    PRIMARY KEY (scheduled_at, id),
    CHECK (backoff_max_s >= backoff_initial_s)
) PARTITION BY RANGE (scheduled_at);

CREATE TABLE tasks_default PARTITION OF tasks DEFAULT;

-- Partitioned indexes: every partition, present and future, gets its own copy.
-- GetTask knows only the id.
CREATE INDEX tasks_id_idx ON tasks (id);
-- The preloader: due work of one shard. Tasks still waiting for workflow parents are
-- left out so a blocked child is not rescanned on every pass.
CREATE INDEX tasks_preload_idx ON tasks (shard, due_at)
    WHERE status IN ('SCHEDULED', 'RETRYING') AND unresolved_dependencies = 0;
-- The reconciler: in-flight rows of one shard, oldest lease first (PRELOADED rows
-- have no lease and sort last; a new owner reloads them into its wheel).
CREATE INDEX tasks_inflight_idx ON tasks (shard, lease_expires_at)
    WHERE status IN ('PRELOADED', 'DISPATCHED', 'RUNNING');
-- ListTasks: one tenant's tasks in time order, paged by (scheduled_at, id).
CREATE INDEX tasks_tenant_idx ON tasks (tenant_id, scheduled_at, id);
-- Workflow completion and the "any non-terminal task left?" check.
CREATE INDEX tasks_workflow_idx ON tasks (workflow_id) WHERE workflow_id IS NOT NULL;
-- Overlap policies ask whether a schedule's previous occurrence is still running.
CREATE INDEX tasks_schedule_idx ON tasks (schedule_id, logical_date)
    WHERE schedule_id IS NOT NULL;

-- True submit idempotency (a partitioned table cannot enforce a unique key that omits
-- scheduled_at). request_fingerprint tells a repeat of the same request (answered with
-- the original task) from a reuse of the key for a different one (refused).
CREATE TABLE idempotency_keys (
    tenant_id            uuid NOT NULL REFERENCES tenants (id),
    key                  text NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    task_id              uuid NOT NULL,
    -- Where the task lives: lets the original be read with partition pruning.
    scheduled_at         timestamptz NOT NULL,
    request_fingerprint  text NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
-- Retention deletes the keys of the tasks it drops.
CREATE INDEX idempotency_keys_task_idx ON idempotency_keys (task_id);

-- One row per attempt: a retry inserts, history is never updated away.
CREATE TABLE task_attempts (
    task_id        uuid NOT NULL,
    attempt        integer NOT NULL CHECK (attempt >= 1),
    scheduled_at   timestamptz NOT NULL,
    fencing_token  bigint NOT NULL CHECK (fencing_token >= 1),
    state          text NOT NULL
                   CHECK (state IN ('DISPATCHED', 'RUNNING', 'SUCCEEDED', 'FAILED',
                                    'TIMED_OUT', 'ABANDONED', 'RELEASED', 'FENCED',
                                    'CANCELLED')),
    worker_id      text,
    entered_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    error          text,
    PRIMARY KEY (task_id, attempt)
);

-- Edges of a workflow DAG. child_scheduled_at lets a completion decrement its children
-- by (scheduled_at, id), pruned to one partition like every hot-path write.
CREATE TABLE task_dependencies (
    workflow_id         uuid NOT NULL REFERENCES workflow_runs (id),
    parent_task_id      uuid NOT NULL,
    child_task_id       uuid NOT NULL,
    child_scheduled_at  timestamptz NOT NULL,
    PRIMARY KEY (parent_task_id, child_task_id),
    CHECK (parent_task_id <> child_task_id)
);
CREATE INDEX task_dependencies_child_idx ON task_dependencies (child_task_id);
CREATE INDEX task_dependencies_workflow_idx ON task_dependencies (workflow_id);

-- The append-only ledger the watchdog reads: one row per completed task with a job_id.
-- Kept across task retention: it is how "the job last ran at" survives.
CREATE TABLE task_completions (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id        text NOT NULL CHECK (length(job_id) > 0),
    task_id       uuid NOT NULL UNIQUE,
    tenant_id     uuid NOT NULL,
    completed_at  timestamptz NOT NULL
);
CREATE INDEX task_completions_job_idx ON task_completions (job_id, completed_at DESC);

-- The ledger is written once per completion and never changed; a trigger makes a
-- buggy UPDATE fail loudly instead of rewriting when a job last ran.
CREATE FUNCTION chronoshard_reject_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER task_completions_append_only
    BEFORE UPDATE ON task_completions
    FOR EACH ROW EXECUTE FUNCTION chronoshard_reject_update();

CREATE TABLE expectations (
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    job_id       text NOT NULL CHECK (length(job_id) > 0),
    interval_s   double precision NOT NULL CHECK (interval_s > 0),
    tolerance_s  double precision NOT NULL DEFAULT 0 CHECK (tolerance_s >= 0),
    description  text NOT NULL DEFAULT '',
    severity     text NOT NULL DEFAULT 'critical'
                 CHECK (severity IN ('critical', 'error', 'warning', 'info')),
    enabled      boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, job_id)
);
CREATE INDEX expectations_job_idx ON expectations (job_id);

CREATE TABLE alerts (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- What fired: an overdue job, a late canary, the watchdog's own lost database, ...
    kind              text NOT NULL CHECK (length(kind) > 0),
    -- Deduplicates while open: one open alert per dedup_key (index below).
    dedup_key         text NOT NULL CHECK (length(dedup_key) > 0),
    tenant_id         uuid,
    job_id            text,
    severity          text NOT NULL DEFAULT 'critical'
                      CHECK (severity IN ('critical', 'error', 'warning', 'info')),
    summary           text NOT NULL,
    details           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(details) = 'object'),
    opened_at         timestamptz NOT NULL DEFAULT now(),
    resolved_at       timestamptz,
    last_notified_at  timestamptz,
    CHECK (resolved_at IS NULL OR resolved_at >= opened_at)
);
CREATE UNIQUE INDEX alerts_open_dedup_idx ON alerts (dedup_key) WHERE resolved_at IS NULL;
CREATE INDEX alerts_opened_idx ON alerts (opened_at);

CREATE TABLE canary_executions (
    id               uuid PRIMARY KEY,
    -- The task the canary submitted, once the submit succeeded.
    task_id          uuid,
    scheduled_time   timestamptz NOT NULL,
    dispatched_time  timestamptz,
    completed_time   timestamptz,
    status           text NOT NULL DEFAULT 'SUBMITTED'
                     CHECK (status IN ('SUBMITTED', 'DISPATCHED', 'COMPLETED', 'LATE',
                                       'FAILED')),
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX canary_executions_scheduled_idx ON canary_executions (scheduled_time);

-- The scheduler-level fence (DESIGN §5): a shard's owner raises epoch to its etcd claim
-- revision, and every shard write first reads this row FOR SHARE and checks it.
CREATE TABLE shard_owners (
    shard       smallint PRIMARY KEY CHECK (shard >= 0),
    epoch       bigint NOT NULL CHECK (epoch >= 0),
    node_id     text NOT NULL CHECK (length(node_id) > 0),
    claimed_at  timestamptz NOT NULL DEFAULT now()
);
