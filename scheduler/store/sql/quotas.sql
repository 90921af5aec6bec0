-- Tenant quotas that hold across the cluster (store/quotas.py, docs/operations.md#tenants-and-quotas).
-- The dispatch round's three statements run inside the transaction that writes its
-- intents, in this order: lock the tenants' buckets (creating the missing ones first),
-- then read limits, buckets and in-flight counts in a statement of their own (a new
-- snapshot: under READ COMMITTED the statement that waited for a lock would still count
-- with the snapshot it started with, missing what the lock holder committed), then store
-- the buckets the round drew from.

-- name: create_dispatch_buckets
-- First round of a tenant this node has not seen: its bucket starts full.
INSERT INTO tenant_dispatch_buckets (tenant_id, tokens, refilled_at)
SELECT t.id, greatest(1.0, t.rate_limit_rps), clock_timestamp()
FROM tenants AS t
WHERE t.id = ANY(%(tenant_ids)s::uuid[])
ORDER BY t.id
ON CONFLICT (tenant_id) DO NOTHING;

-- name: lock_dispatch_buckets
-- In tenant order: two rounds never deadlock on these rows. Held until the intents
-- commit, so the rounds of one tenant take turns cluster-wide.
SELECT tenant_id
FROM tenant_dispatch_buckets
WHERE tenant_id = ANY(%(tenant_ids)s::uuid[])
ORDER BY tenant_id
FOR UPDATE;

-- name: dispatch_quotas
-- Each tenant's limits as they are now (a `tenants update` applies at the next round),
-- its bucket, the seconds since the bucket was refilled by PostgreSQL's clock, and its
-- attempts in flight (tasks_tenant_inflight_idx: the predicate is spelled literally).
SELECT t.id AS tenant_id,
       t.rate_limit_rps,
       t.max_concurrent_workers,
       b.tokens,
       b.refilled_at,
       clock_timestamp() AS now,
       extract(epoch FROM clock_timestamp() - b.refilled_at)::double precision AS elapsed_s,
       (SELECT count(*)
        FROM tasks AS x
        WHERE x.tenant_id = t.id AND x.status IN ('DISPATCHED', 'RUNNING')) AS in_flight
FROM tenants AS t
JOIN tenant_dispatch_buckets AS b ON b.tenant_id = t.id
WHERE t.id = ANY(%(tenant_ids)s::uuid[]);

-- name: store_dispatch_buckets
-- The buckets the round drew from, and the rounds that refused a tenant's tasks (and
-- why). held_by NULL keeps the last refusal recorded.
UPDATE tenant_dispatch_buckets AS b
SET tokens = u.tokens,
    refilled_at = u.refilled_at,
    held_by = coalesce(u.held_by, b.held_by),
    held_at = CASE WHEN u.held_by IS NULL THEN b.held_at ELSE u.held_at END
FROM unnest(%(tenant_ids)s::uuid[], %(tokens)s::double precision[],
            %(refilled_ats)s::timestamptz[], %(held_bys)s::text[], %(held_ats)s::timestamptz[])
     AS u(tenant_id, tokens, refilled_at, held_by, held_at)
WHERE b.tenant_id = u.tenant_id;

-- name: tenant_quota_now
-- GetTask's waiting reason: the tenant's limits, bucket, last refusal and in-flight count
-- right now.
SELECT t.rate_limit_rps,
       t.max_concurrent_workers,
       b.tokens,
       extract(epoch FROM clock_timestamp() - b.refilled_at)::double precision AS elapsed_s,
       b.held_by,
       extract(epoch FROM clock_timestamp() - b.held_at)::double precision AS held_s_ago,
       (SELECT count(*)
        FROM tasks AS x
        WHERE x.tenant_id = t.id AND x.status IN ('DISPATCHED', 'RUNNING')) AS in_flight
FROM tenants AS t
LEFT JOIN tenant_dispatch_buckets AS b ON b.tenant_id = t.id
WHERE t.id = %(tenant_id)s;
