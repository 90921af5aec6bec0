-- The statements over the tenants table, one named block each: the operator's
-- (chronoshard.scheduler.store.tenants.create_tenant, list_tenants, over a direct
-- connection) and the node's (TenantStore, over the Store's pool).

-- name: insert_tenant
INSERT INTO tenants (name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash)
VALUES (%(name)s, %(tier)s, %(rate_limit_rps)s, %(max_concurrent_workers)s, %(home_region)s,
        %(api_key_hash)s)
RETURNING id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
          created_at, operator;

-- name: rotate_tenant_key
-- A new API key for an existing tenant (by name); the old key stops working once the
-- nodes' authentication caches expire.
UPDATE tenants SET api_key_hash = %(api_key_hash)s
WHERE name = %(name)s
RETURNING id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
          created_at, operator;

-- name: set_tenant_operator
-- Operator rights (AdminService.DrainNode) for a tenant, by id; `chronoshard tenants`.
UPDATE tenants SET operator = %(operator)s
WHERE id = %(tenant_id)s
RETURNING id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
          created_at, operator;

-- name: get_tenant
SELECT id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
       created_at, operator
FROM tenants
WHERE id = %(tenant_id)s;

-- name: get_tenant_by_key_hash
-- Authentication: the unique index on api_key_hash answers it.
SELECT id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
       created_at, operator
FROM tenants
WHERE api_key_hash = %(api_key_hash)s;

-- name: list_tenants
SELECT id, name, tier, rate_limit_rps, max_concurrent_workers, home_region, api_key_hash,
       created_at, operator
FROM tenants
ORDER BY name;
