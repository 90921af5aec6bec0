-- WatchdogService.ListIncidents (the console's and the client's view of the watchdog's
-- alerts about a tenant's jobs): API transactions run as chronoshard_api (0014), which
-- may now read alerts. The policy of 0014 already limits it to the tenant's own; the
-- cluster's alerts (tenant_id NULL) stay invisible to it.
GRANT SELECT ON alerts TO chronoshard_api;

-- A tenant's incidents, newest first: the open ones and the recently resolved.
CREATE INDEX alerts_tenant_opened_idx ON alerts (tenant_id, opened_at DESC)
    WHERE tenant_id IS NOT NULL;
