-- 0014: row-level security on the tenant tables, as defence in depth
-- (docs/operations.md#row-level-security, docs/schema.md#row-level-security).
--
-- Every API statement already names the caller's tenant (tenant_id = %(tenant_id)s).
-- From here on the database enforces it as well: the API's transactions run as the role
-- chronoshard_api with the setting chronoshard.tenant_id naming the caller's tenant
-- (Store.tenant_transaction: SET LOCAL both, so they end with the transaction), and the
-- policies below admit only that tenant's rows, for reading and for writing (WITH CHECK).
-- Without the setting chronoshard_current_tenant() is NULL, so such a session sees no
-- row and can write none.
--
-- The role the node connects as (the one that ran this migration and owns the tables) is
-- not restricted: RLS never applies to a table's owner (no FORCE ROW LEVEL SECURITY
-- here), to superusers or to BYPASSRLS roles. The dispatch path (preload, intents,
-- settlements, the reconciler, the materialiser, workflow progress) works across
-- tenants by shard and keeps running as that role; the shard fence guards it, not the
-- tenant (docs/operations.md#row-level-security).
--
-- Roles belong to the whole server, not to one database: many databases on one server
-- (test databases, a staging copy) share chronoshard_api, so it is created only if
-- missing, and a concurrent migration elsewhere that made it first is no error. Creating
-- it needs CREATEROLE (or a superuser) for the migration's user; where that is not
-- granted, a DBA creates the role beforehand (NOLOGIN NOBYPASSRLS) and grants it to the
-- node's user, and this migration only checks it.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'chronoshard_api') THEN
        BEGIN
            CREATE ROLE chronoshard_api NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database's migration on this server created it meanwhile
        END;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'chronoshard_api'
               AND (rolsuper OR rolbypassrls)) THEN
        RAISE EXCEPTION 'role chronoshard_api exists with SUPERUSER or BYPASSRLS: '
            'row-level security would not apply to it'
            USING ERRCODE = 'invalid_role_specification';
    END IF;
    -- The node enters the role per transaction (SET LOCAL ROLE): it must be a member.
    -- A superuser is a member of every role already.
    IF NOT pg_has_role(current_user, 'chronoshard_api', 'MEMBER') THEN
        EXECUTE format('GRANT chronoshard_api TO %I', current_user);
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO chronoshard_api', current_schema());
END
$$;

-- The caller's tenant, or NULL when the transaction named none. A custom setting read
-- after the transaction that set it ended is '' rather than missing: NULLIF makes both
-- mean "no tenant". A plain SQL function, inlined by the planner into each policy: the
-- comparison stays an index condition.
CREATE FUNCTION chronoshard_current_tenant() RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT NULLIF(current_setting('chronoshard.tenant_id', true), '')::uuid $$;

-- One policy per table, for every command (USING filters what is read, updated and
-- deleted; WITH CHECK refuses a row written for another tenant). Not limited to
-- chronoshard_api: any role RLS applies to gets the same rule.
ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenants
    USING (id = chronoshard_current_tenant())
    WITH CHECK (id = chronoshard_current_tenant());

ALTER TABLE tasks ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tasks
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON idempotency_keys
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

ALTER TABLE workflow_runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON workflow_runs
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

ALTER TABLE schedules ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON schedules
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

ALTER TABLE schedule_occurrences ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON schedule_occurrences
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

ALTER TABLE task_completions ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON task_completions
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

ALTER TABLE expectations ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON expectations
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

-- The dispatch path's cluster-wide quota buckets (0013): no API statement touches them
-- as a tenant, so chronoshard_api is granted nothing on them either.
ALTER TABLE tenant_dispatch_buckets ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenant_dispatch_buckets
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

-- The watchdog's alerts: chronoshard_api is granted nothing on them (no API reads them),
-- and a role that is granted them later still sees only its tenant's (never the
-- cluster's own alerts, whose tenant_id is NULL).
ALTER TABLE alerts ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON alerts
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

-- Tables without a tenant_id belong to a row that has one: an attempt to its task (by
-- its partition key, so the lookup is pruned to one partition), a workflow's tasks and
-- edges to its run. The subquery reads that table under its own policy.
ALTER TABLE task_attempts ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON task_attempts
    USING (EXISTS (SELECT FROM tasks AS t
                   WHERE t.id = task_attempts.task_id
                     AND t.scheduled_at = task_attempts.scheduled_at))
    WITH CHECK (EXISTS (SELECT FROM tasks AS t
                        WHERE t.id = task_attempts.task_id
                          AND t.scheduled_at = task_attempts.scheduled_at));

ALTER TABLE workflow_tasks ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON workflow_tasks
    USING (EXISTS (SELECT FROM workflow_runs AS w WHERE w.id = workflow_tasks.workflow_id))
    WITH CHECK (EXISTS (SELECT FROM workflow_runs AS w
                        WHERE w.id = workflow_tasks.workflow_id));

ALTER TABLE task_dependencies ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON task_dependencies
    USING (EXISTS (SELECT FROM workflow_runs AS w WHERE w.id = task_dependencies.workflow_id))
    WITH CHECK (EXISTS (SELECT FROM workflow_runs AS w
                        WHERE w.id = task_dependencies.workflow_id));

-- What the API's statements need, and no more. Not granted at all: the cluster's own
-- tables (shard_owners, worker_sessions, canary_executions, alerts,
-- tenant_dispatch_buckets, schema_migrations) and the partitions of tasks one by one
-- (the API reads them through tasks, whose policy applies; a partition named directly
-- would have none).
GRANT SELECT (id) ON tenants TO chronoshard_api;
GRANT SELECT, INSERT, UPDATE ON tasks TO chronoshard_api;
GRANT SELECT, INSERT ON idempotency_keys TO chronoshard_api;
GRANT SELECT, UPDATE ON task_attempts TO chronoshard_api;
GRANT SELECT, INSERT, UPDATE ON workflow_runs TO chronoshard_api;
GRANT SELECT, INSERT ON workflow_tasks, task_dependencies TO chronoshard_api;
GRANT SELECT, INSERT ON task_completions TO chronoshard_api;
GRANT USAGE ON SEQUENCE task_completions_id_seq TO chronoshard_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON schedules TO chronoshard_api;
GRANT SELECT, INSERT, DELETE ON schedule_occurrences TO chronoshard_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON expectations TO chronoshard_api;
