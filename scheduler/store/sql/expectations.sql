-- The statements of chronoshard.scheduler.store.expectations.ExpectationStore: the
-- watchdog's expectation registry as the API sees it (WatchdogService).
-- Every statement is scoped by tenant_id, which comes from the caller's API key.
-- Expectations with source = 'config' belong to the watchdog's config file: the API
-- reads them but never changes or removes them.

-- name: upsert_expectation
-- Create, or replace an API-registered one keeping created_at. A config expectation
-- under the same key makes the conflict branch update nothing, so no row comes back.
-- (xmax = 0) is true only for a freshly inserted row version.
INSERT INTO expectations AS e
    (tenant_id, job_id, interval_s, tolerance_s, severity, enabled, description, source)
VALUES
    (%(tenant_id)s, %(job_id)s, %(interval_s)s, %(tolerance_s)s, %(severity)s, %(enabled)s,
     %(description)s, 'api')
ON CONFLICT (tenant_id, job_id) DO UPDATE
SET interval_s = EXCLUDED.interval_s,
    tolerance_s = EXCLUDED.tolerance_s,
    severity = EXCLUDED.severity,
    enabled = EXCLUDED.enabled,
    description = EXCLUDED.description,
    updated_at = now()
WHERE e.source = 'api'
RETURNING e.job_id, e.interval_s, e.tolerance_s, e.severity, e.enabled, e.description,
          e.created_at, e.updated_at, e.source, (xmax = 0) AS created;

-- name: get_expectation
SELECT job_id, interval_s, tolerance_s, severity, enabled, description, created_at,
       updated_at, source
FROM expectations
WHERE tenant_id = %(tenant_id)s AND job_id = %(job_id)s;

-- name: list_expectations
-- Keyset pages over the primary key (tenant_id, job_id).
SELECT job_id, interval_s, tolerance_s, severity, enabled, description, created_at,
       updated_at, source
FROM expectations
WHERE tenant_id = %(tenant_id)s AND job_id > %(after)s
ORDER BY job_id
LIMIT %(limit)s;

-- name: delete_expectation
DELETE FROM expectations
WHERE tenant_id = %(tenant_id)s AND job_id = %(job_id)s AND source = 'api'
RETURNING job_id, interval_s, tolerance_s, severity, enabled, description, created_at,
          updated_at, source;

-- name: list_incidents
-- WatchdogService.ListIncidents: the tenant's alerts, newest first, the open ones and
-- (include_resolved) those resolved within resolved_within_s by PostgreSQL's clock
-- (alerts_tenant_opened_idx).
SELECT id, kind, job_id, severity, summary, opened_at, resolved_at
FROM alerts
WHERE tenant_id = %(tenant_id)s
  AND (resolved_at IS NULL
       OR (%(include_resolved)s
           AND resolved_at >= now() - make_interval(secs => %(resolved_within_s)s)))
ORDER BY opened_at DESC, id DESC
LIMIT %(limit)s;

-- name: list_all_incidents
-- WatchdogService.ListIncidents(all_tenants), an operator's: every tenant's alerts and
-- the cluster's own (tenant_id NULL), with the tenant's name, as list_incidents orders
-- and bounds them. Run as the node's role: no tenant's row policy applies.
SELECT a.id, a.kind, a.job_id, a.severity, a.summary, a.opened_at, a.resolved_at,
       a.tenant_id, COALESCE(t.name, '') AS tenant_name
FROM alerts AS a
LEFT JOIN tenants AS t ON t.id = a.tenant_id
WHERE a.resolved_at IS NULL
   OR (%(include_resolved)s
       AND a.resolved_at >= now() - make_interval(secs => %(resolved_within_s)s))
ORDER BY a.opened_at DESC, a.id DESC
LIMIT %(limit)s;
