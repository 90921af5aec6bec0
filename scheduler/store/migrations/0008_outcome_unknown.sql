-- 0008: unknown outcomes of non-idempotent attempts are not guessed (issue 12).
--
-- A non-idempotent attempt whose lease ran out (plus workers.lease_margin_s) with no
-- settlement may or may not have run its side effect: a dead worker, a partitioned one
-- and a paused one look the same from here. The reconciler no longer re-runs it once the
-- worker "looks gone" (a partition broke that rule: tasks ran twice); the task is held as
-- OUTCOME_UNKNOWN, its attempt recorded as such, until a late settlement of that attempt
-- makes the outcome known or an operator resolves it (ResolveTask: RETRY or
-- MARK_FAILED, recorded in task_attempts.resolution).
--
-- The new CHECK constraints are supersets of the old ones; PostgreSQL validates them
-- with one scan of each table (a partitioned table cannot take NOT VALID checks).
ALTER TABLE tasks
    DROP CONSTRAINT tasks_status_check,
    ADD CONSTRAINT tasks_status_check
        CHECK (status IN ('SCHEDULED', 'PRELOADED', 'DISPATCHED', 'RUNNING', 'COMPLETED',
                          'RETRYING', 'DEAD_LETTER', 'CANCELLED', 'UPSTREAM_FAILED',
                          'OUTCOME_UNKNOWN'));

ALTER TABLE task_attempts
    DROP CONSTRAINT task_attempts_state_check,
    ADD CONSTRAINT task_attempts_state_check
        CHECK (state IN ('DISPATCHED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'TIMED_OUT',
                         'ABANDONED', 'RELEASED', 'FENCED', 'CANCELLED', 'OUTCOME_UNKNOWN')),
    ADD COLUMN resolution text CHECK (resolution IN ('RETRY', 'MARK_FAILED'));

-- The held tasks of one shard: the reconciler's gauge counts them every pass, and an
-- operator lists them (they are few; this keeps both from reading all history).
CREATE INDEX tasks_outcome_unknown_idx ON tasks (shard) WHERE status = 'OUTCOME_UNKNOWN';
