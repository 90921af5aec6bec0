-- The statements of chronoshard.scheduler.store.sessions.WorkerSessionStore: which
-- workers have a session with which node (worker_sessions), written by the node's
-- liveness loop (cluster/liveness.py), read by a node warming up shards for a planned
-- handoff, and aged out by partition maintenance (cluster/maintenance.py).

-- name: touch_worker_sessions
-- This node has a session of each worker: it was seen now, and this is what the session
-- is (0016). %(sessions)s is a JSON array of objects with the columns below; arrays are
-- aggregated in order (none is NULL).
INSERT INTO worker_sessions (worker_id, node_id, last_seen_at, closed_at, session_id,
                             tenant_id, queues, task_types, slots, credits, running,
                             draining, connected_at)
SELECT s.worker_id, %(node_id)s, now(), NULL, s.session_id, s.tenant_id,
       (SELECT array_agg(q ORDER BY q) FROM jsonb_array_elements_text(s.queues) AS q),
       (SELECT array_agg(t ORDER BY t) FROM jsonb_array_elements_text(s.task_types) AS t),
       s.slots, s.credits, s.running, s.draining, s.connected_at
FROM jsonb_to_recordset(%(sessions)s::jsonb) AS s(
    worker_id text, session_id text, tenant_id uuid, queues jsonb, task_types jsonb,
    slots integer, credits integer, running integer, draining boolean,
    connected_at timestamptz)
ORDER BY s.worker_id
ON CONFLICT (worker_id, node_id) DO UPDATE
    SET last_seen_at = now(), closed_at = NULL,
        session_id = EXCLUDED.session_id, tenant_id = EXCLUDED.tenant_id,
        queues = EXCLUDED.queues, task_types = EXCLUDED.task_types,
        slots = EXCLUDED.slots, credits = EXCLUDED.credits, running = EXCLUDED.running,
        draining = EXCLUDED.draining, connected_at = EXCLUDED.connected_at;

-- name: close_worker_sessions
-- This node just had a session of each of these workers, now closed: seen now, and
-- closed. The row keeps what the session was. A session whose opening was never
-- recorded has no row, and needs none (it is not open).
UPDATE worker_sessions
SET last_seen_at = now(), closed_at = now()
WHERE node_id = %(node_id)s AND worker_id = ANY(%(worker_ids)s::text[]);

-- name: workers_seen
-- Workers with an open session on any of these nodes, refreshed within the window (a
-- node that died leaves its rows open): a node taking shards over waits until each of
-- them has a session with it too.
SELECT DISTINCT worker_id
FROM worker_sessions
WHERE node_id = ANY(%(node_ids)s::text[])
  AND closed_at IS NULL
  AND last_seen_at > now() - make_interval(secs => %(within_s)s);

-- name: forget_old_worker_sessions
DELETE FROM worker_sessions
WHERE last_seen_at < now() - make_interval(secs => %(older_than_s)s);

-- name: list_worker_sessions
-- The open sessions refreshed within the window (a node that died leaves its rows open),
-- of one tenant or (NULL) of all, of one worker and of one node or of all, after the
-- previous page's last (worker_id, node_id), in that order (the primary key's). Run as
-- chronoshard_api for a tenant, where the policy of 0016 holds it to that tenant too.
SELECT worker_id, node_id, session_id, tenant_id, queues, task_types, slots, credits,
       running, draining, connected_at, last_seen_at
FROM worker_sessions
WHERE closed_at IS NULL
  AND last_seen_at > now() - make_interval(secs => %(within_s)s)
  AND (%(tenant_id)s::uuid IS NULL OR tenant_id = %(tenant_id)s::uuid)
  AND (%(worker_id)s::text IS NULL OR worker_id = %(worker_id)s::text)
  AND (%(node_id)s::text IS NULL OR node_id = %(node_id)s::text)
  AND (%(after_worker_id)s::text IS NULL
       OR (worker_id, node_id) > (%(after_worker_id)s::text, %(after_node_id)s::text))
ORDER BY worker_id, node_id
LIMIT %(limit)s;

-- name: tenant_names
-- The names of these tenants (an operator's listing of every tenant's sessions).
SELECT id, name FROM tenants WHERE id = ANY(%(tenant_ids)s::uuid[]);
