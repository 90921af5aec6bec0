-- The statements over the tenants table, one named block each: the operator's
-- (chronoshard.scheduler.store.tenants.create_tenant, list_tenants, over a direct
-- connection) and the node's (TenantStore, over the Store's pool).

-- name: insert_tenant
INSERT INTO tenants (name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash)
VALUES (%(name)s, %(tier)s, %(rate_limit_rps)s, %(max_concurrent_workers)s, %(home_region)s,
        %(api_key_hash)s)
RETURNING id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
          created_at, operator, submit_rate_limit_rps;

-- name: rotate_tenant_key
-- A new API key for an existing tenant (by name); the old key stops working once the
-- nodes' authentication caches expire.
UPDATE tenants SET api_key_hash = %(api_key_hash)s
WHERE name = %(name)s
RETURNING id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
          created_at, operator, submit_rate_limit_rps;

-- name: set_tenant_operator
-- Operator rights (AdminService.DrainNode) for a tenant, by id; `chronoshard tenants`.
UPDATE tenants SET operator = %(operator)s
WHERE id = %(tenant_id)s
RETURNING id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
          created_at, operator, submit_rate_limit_rps;

-- name: update_tenant_limits
-- `chronoshard tenants update` (and `create --rotate` with limit flags): each limit given
-- (or the home region) is set, the others are left as they are; clear_submit_rate takes
-- the submit limit away.
-- The nodes hear of it through notify_tenants_changed in the same transaction.
UPDATE tenants
SET rate_limit_rps = coalesce(%(rate_limit_rps)s, rate_limit_rps),
    max_concurrent_workers = coalesce(%(max_concurrent_workers)s, max_concurrent_workers),
    submit_rate_limit_rps = CASE
        WHEN %(clear_submit_rate)s THEN NULL
        ELSE coalesce(%(submit_rate_limit_rps)s, submit_rate_limit_rps)
    END,
    home_region = coalesce(%(home_region)s, home_region)
WHERE name = %(name)s
RETURNING id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
          created_at, operator, submit_rate_limit_rps;

-- name: notify_tenants_changed
-- Every node refreshes its tenant cache at once (scheduler/cluster/signals.py: the
-- channel and the "tenants" payload are its). Sent when the transaction commits.
SELECT pg_notify('chronoshard_shards', 'tenants');

-- name: get_tenant
SELECT id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
       created_at, operator, submit_rate_limit_rps
FROM tenants
WHERE id = %(tenant_id)s;

-- name: get_tenant_by_key_hash
-- Authentication: the unique index on api_key_hash answers it.
SELECT id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
       created_at, operator, submit_rate_limit_rps
FROM tenants
WHERE api_key_hash = %(api_key_hash)s;

-- name: get_tenant_by_name
-- Authentication by client certificate (grpc.tls_client_identities names tenants).
SELECT id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
       created_at, operator, submit_rate_limit_rps
FROM tenants
WHERE name = %(name)s;

-- name: list_tenants
SELECT id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
       created_at, operator, submit_rate_limit_rps
FROM tenants
ORDER BY name;
