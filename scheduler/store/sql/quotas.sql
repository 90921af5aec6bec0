-- Tenant quotas that hold across the cluster (store/quotas.py, docs/operations.md#tenants-and-quotas).
-- A dispatch round's statements run inside the transaction that writes its intents, in
-- this order: lock its tenants (creating the missing buckets first; exclusively for the
-- tenants it checks, shared for those it dispatches under an allowance), then read, in
-- statements of their own (a new snapshot: under READ COMMITTED a statement that waited
-- for a lock would still count with the snapshot it started with, missing what the lock
-- holder committed), the checked tenants' limits, buckets, in-flight counts and the other
-- nodes' allowances, and whether the allowances spent are still valid; then store the
-- buckets the round drew from and the allowances it granted.

-- name: create_dispatch_buckets
-- First round of a tenant this node has not seen: its bucket starts full.
INSERT INTO tenant_dispatch_buckets (tenant_id, tokens, refilled_at)
SELECT t.id, greatest(1.0, t.rate_limit_rps), clock_timestamp()
FROM tenants AS t
WHERE t.id = ANY(%(tenant_ids)s::uuid[])
ORDER BY t.id
ON CONFLICT (tenant_id) DO NOTHING;

-- name: lock_dispatch_quotas
-- Transaction-scoped advisory locks in key order (migration 0017's function): two rounds
-- never deadlock on them. Held until the intents commit: the checks of one tenant take
-- turns cluster-wide, and wait for the rounds under allowances in flight.
SELECT chronoshard_lock_dispatch_quotas(%(checked)s::uuid[], %(allowed)s::uuid[]);

-- name: dispatch_quotas
-- Each checked tenant's limits as they are now (a `tenants update` applies at the next
-- check), its bucket, the seconds since the bucket was refilled by PostgreSQL's clock, its
-- attempts in flight (tasks_tenant_inflight_idx: the predicate is spelled literally), the
-- attempts the other nodes' live allowances may still start (all of each: what they
-- already started counts twice, on the safe side), and how many nodes own shards.
SELECT t.id AS tenant_id,
       t.rate_limit_rps,
       t.max_concurrent_workers,
       b.tokens,
       b.refilled_at,
       clock_timestamp() AS now,
       extract(epoch FROM clock_timestamp() - b.refilled_at)::double precision AS elapsed_s,
       (SELECT count(*)
        FROM tasks AS x
        WHERE x.tenant_id = t.id AND x.status IN ('DISPATCHED', 'RUNNING')) AS in_flight,
       (SELECT coalesce(sum(a.attempts), 0)::integer
        FROM tenant_dispatch_allowances AS a
        WHERE a.tenant_id = t.id AND a.node_id <> %(node_id)s
          AND a.expires_at > clock_timestamp()) AS reserved,
       (SELECT count(DISTINCT o.node_id)::integer FROM shard_owners AS o) AS nodes
FROM tenants AS t
JOIN tenant_dispatch_buckets AS b ON b.tenant_id = t.id
WHERE t.id = ANY(%(tenant_ids)s::uuid[]);

-- name: allowances_valid
-- The tenants whose allowance the round spends that are still this node's current grant
-- and unexpired. Read after the lock: a check that replaced the grant, or found it
-- expired, has committed by then, and a check that comes later waits for this round.
SELECT a.tenant_id
FROM tenant_dispatch_allowances AS a
JOIN unnest(%(tenant_ids)s::uuid[], %(grant_ids)s::uuid[]) AS g(tenant_id, grant_id)
  ON g.tenant_id = a.tenant_id AND g.grant_id = a.grant_id
WHERE a.node_id = %(node_id)s AND a.expires_at > clock_timestamp();

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

-- name: store_allowances
-- The node's new allowance per tenant, valid for valid_s from now (PostgreSQL's clock);
-- it replaces the node's old one, whatever was left of that.
INSERT INTO tenant_dispatch_allowances AS a (tenant_id, node_id, grant_id, attempts, expires_at)
SELECT u.tenant_id, %(node_id)s, u.grant_id, u.attempts,
       clock_timestamp() + make_interval(secs => %(valid_s)s)
FROM unnest(%(tenant_ids)s::uuid[], %(grant_ids)s::uuid[], %(attempts)s::integer[])
     AS u(tenant_id, grant_id, attempts)
ORDER BY u.tenant_id
ON CONFLICT (tenant_id, node_id) DO UPDATE
SET grant_id = excluded.grant_id,
    attempts = excluded.attempts,
    expires_at = excluded.expires_at;

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
