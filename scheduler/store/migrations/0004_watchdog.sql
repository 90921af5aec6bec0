-- What the watchdog (DESIGN §10) needs beyond the tables of 0001.

-- The check reads the newest completion of every watched (tenant, job) with one
-- LATERAL probe each. Expectations are per tenant, and two tenants may use the same
-- job_id: the (job_id, completed_at) index would walk the other tenant's rows, this one
-- finds the newest matching row at once, however long the ledger grows.
CREATE INDEX task_completions_tenant_job_idx
    ON task_completions (tenant_id, job_id, completed_at DESC);

-- Where an expectation came from: the API (CreateExpectation, `chronoshard expect add`)
-- or the watchdog's own config file. The watchdog deletes config expectations that left
-- its file, and never touches the ones registered through the API.
ALTER TABLE expectations
    ADD COLUMN source text NOT NULL DEFAULT 'api' CHECK (source IN ('api', 'config'));

-- A resolve is recorded (resolved_at) before it is delivered; resolve_notified_at says the
-- delivery happened. A watchdog that dies in between leaves the resolve pending, and the
-- replica that takes over delivers it: no incident stays open at the receiver forever.
ALTER TABLE alerts
    ADD COLUMN resolve_notified_at timestamptz,
    ADD COLUMN notifications integer NOT NULL DEFAULT 0 CHECK (notifications >= 0),
    ADD CONSTRAINT alerts_resolve_notified_after_resolved
        CHECK (resolve_notified_at IS NULL OR resolved_at IS NOT NULL);
UPDATE alerts SET resolve_notified_at = resolved_at WHERE resolved_at IS NOT NULL;
CREATE INDEX alerts_pending_resolve_idx ON alerts (resolved_at)
    WHERE resolved_at IS NOT NULL AND resolve_notified_at IS NULL;

-- Canaries still waiting for their completion are re-read on every check.
CREATE INDEX canary_executions_open_idx ON canary_executions (scheduled_time)
    WHERE completed_time IS NULL;
ALTER TABLE canary_executions
    ADD COLUMN error text;
