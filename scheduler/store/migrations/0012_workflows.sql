-- 0012: workflows as the WorkflowService serves them, and schedules that create one per
-- occurrence (docs/architecture.md#d9).
--
-- 0001 had the run and edge tables but nothing wrote them. A run now records the
-- instant all of its tasks are scheduled at (one partition key for the whole DAG, so
-- every read of a workflow's tasks is pruned to one partition), its size, and the
-- client's idempotency key for the create. A task's place in its workflow (its local
-- ref and trigger rule) lives beside it in workflow_tasks, not in `tasks`: the submit
-- path's insert, the hottest statement, stays as it was.

ALTER TABLE workflow_runs
    ADD COLUMN scheduled_at         timestamptz NOT NULL,
    ADD COLUMN task_count           integer NOT NULL CHECK (task_count BETWEEN 1 AND 10000),
    ADD COLUMN edge_count           integer NOT NULL CHECK (edge_count BETWEEN 0 AND 50000),
    ADD COLUMN idempotency_key      text CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    -- Tells a repeat of the same create from a reuse of the key for another workflow.
    ADD COLUMN request_fingerprint  text,
    ADD COLUMN submitted_by         text,
    -- The watchdog's job the run completes when it succeeds (a task_completions row
    -- keyed by the run's id), and the schedule occurrence that created it, if any.
    ADD COLUMN job_id               text CHECK (length(job_id) BETWEEN 1 AND 200),
    ADD COLUMN schedule_id          uuid,
    ADD COLUMN logical_date         timestamptz,
    ADD CONSTRAINT workflow_runs_key_fingerprint
        CHECK ((idempotency_key IS NULL) = (request_fingerprint IS NULL)),
    ADD CONSTRAINT workflow_runs_name_length CHECK (length(name) <= 200);

CREATE UNIQUE INDEX workflow_runs_idempotency_idx ON workflow_runs (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- ListWorkflows: newest first, paged by (created_at, id).
DROP INDEX workflow_runs_tenant_idx;
CREATE INDEX workflow_runs_tenant_idx ON workflow_runs (tenant_id, created_at, id);

CREATE TABLE workflow_tasks (
    task_id       uuid PRIMARY KEY,
    workflow_id   uuid NOT NULL REFERENCES workflow_runs (id) ON DELETE CASCADE,
    ref           text NOT NULL CHECK (length(ref) BETWEEN 1 AND 100),
    trigger_rule  text NOT NULL CHECK (trigger_rule IN ('all_success', 'all_done')),
    -- The position in the run's topological order: GetWorkflow lists parents first.
    position      integer NOT NULL CHECK (position >= 0),
    UNIQUE (workflow_id, ref),
    UNIQUE (workflow_id, position)
);

-- Written once, with UPSTREAM_FAILED, by the transaction of the failure it names (the
-- task that ended DEAD_LETTER or CANCELLED); never recomputed.
ALTER TABLE tasks ADD COLUMN upstream_cause uuid;

-- "Is any task of this run not terminal yet?", asked by every terminal write of a
-- workflow task and by the reconciler: only the run's live tasks are in this index.
CREATE INDEX tasks_workflow_open_idx ON tasks (workflow_id)
    WHERE workflow_id IS NOT NULL
      AND status NOT IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER', 'UPSTREAM_FAILED');


-- A schedule may create a workflow per occurrence instead of one task: exactly one
-- template, a SubmitTaskRequest or a CreateWorkflowRequest, as protobuf bytes.
ALTER TABLE schedules
    ALTER COLUMN task_template DROP NOT NULL,
    ADD COLUMN workflow_template bytea,
    -- The newest run an occurrence created: what the overlap policy asks about next.
    ADD COLUMN last_workflow_id uuid,
    ADD CONSTRAINT schedules_one_template
        CHECK ((task_template IS NULL) <> (workflow_template IS NULL));

-- The run a workflow schedule's occurrence created (task_id is NULL then); neither set:
-- the overlap policy skipped the occurrence.
ALTER TABLE schedule_occurrences
    ADD COLUMN workflow_id uuid,
    ADD CONSTRAINT schedule_occurrences_one_run
        CHECK (task_id IS NULL OR workflow_id IS NULL);
