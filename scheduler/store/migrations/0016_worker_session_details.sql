-- 0016: a worker session row says what the session is, so that any node can list the
-- cluster's sessions (AdminService.ListWorkerSessions, the console's workers page).
--
-- Each node knows only its own streams. It already records each of them here every
-- workers.session_timeout_s / 3 (cluster/liveness.py); it now writes what the session
-- is along with it: the stream's id, the tenant whose key opened it, the queues and
-- task types it serves, its slots, and, as of that refresh, its unused credits, the
-- tasks it runs and whether the worker drains. A closed session's row keeps what was
-- last written of it. Old rows and rows written by an older node have NULLs: they are
-- listed with what they have.
ALTER TABLE worker_sessions
    ADD COLUMN session_id    text,
    ADD COLUMN tenant_id     uuid,
    ADD COLUMN queues        text[],
    ADD COLUMN task_types    text[],
    ADD COLUMN slots         integer CHECK (slots >= 0),
    ADD COLUMN credits       integer CHECK (credits >= 0),
    ADD COLUMN running       integer CHECK (running >= 0),
    ADD COLUMN draining      boolean,
    ADD COLUMN connected_at  timestamptz;

-- A tenant's key lists the sessions its own workers opened: the API reads them as
-- chronoshard_api (0014), under the same policy as every tenant table, so another
-- tenant's sessions (and those of no tenant) stay invisible to it. An operator's key
-- lists every session: that read runs as the node's own role, like the cluster views
-- it serves from etcd. The node writes the rows as their owner, which no policy limits.
-- No foreign key to tenants: a session row is a cluster record that ages out, and the
-- liveness refresh must not lock tenant rows.
ALTER TABLE worker_sessions ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON worker_sessions
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());
GRANT SELECT ON worker_sessions TO chronoshard_api;
