-- 0013: tenant quotas that hold across the cluster (docs/operations.md#tenants-and-quotas,
-- docs/architecture.md, decision "cluster-wide tenant quotas").
--
-- A tenant's dispatch rate and concurrency were counted by each node for itself, so N
-- nodes allowed N times the limit. Both are now decided in the transaction that writes
-- the dispatch intents: it locks the tenant's row of tenant_dispatch_buckets (the token
-- bucket of its dispatch rate, one for the whole cluster, refilled by PostgreSQL's
-- clock) and counts the tenant's DISPATCHED/RUNNING rows, which are what survives a
-- node's crash: nothing is released by a stream closing, nothing leaks.

-- Submits per second the tenant may make (SubmitTask, SubmitBatch: tasks, not calls),
-- split over the live nodes; NULL is no limit.
ALTER TABLE tenants
    ADD COLUMN submit_rate_limit_rps double precision
        CHECK (submit_rate_limit_rps IS NULL OR submit_rate_limit_rps > 0);

-- One row per tenant that has dispatched: the bucket's tokens as of refilled_at (the
-- bucket holds max(1, rate_limit_rps) at most). Created by the first dispatch round
-- that locks it; a row's lock is what orders the rounds of one tenant cluster-wide.
-- held_by/held_at: the last round that refused some of the tenant's tasks, and which
-- quota did (GetTask's waiting reason).
CREATE TABLE tenant_dispatch_buckets (
    tenant_id    uuid PRIMARY KEY REFERENCES tenants (id),
    tokens       double precision NOT NULL,
    refilled_at  timestamptz NOT NULL,
    held_by      text CHECK (held_by IN ('rate', 'concurrency')),
    held_at      timestamptz,
    CHECK ((held_by IS NULL) = (held_at IS NULL))
);

-- A tenant's attempts in flight, counted by every dispatch round of that tenant. The
-- predicate's `tenant_id IS NOT NULL` (always true) keeps the index to statements that
-- name a tenant: the reconciler's scan of its shards' in-flight rows would otherwise find
-- this smaller index cheaper on small tables, and read every shard's rows instead of its
-- own in lease order (tasks_inflight_idx).
CREATE INDEX tasks_tenant_inflight_idx ON tasks (tenant_id)
    WHERE status IN ('DISPATCHED', 'RUNNING') AND tenant_id IS NOT NULL;
