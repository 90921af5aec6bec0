-- The statements of chronoshard.scheduler.store.sessions.WorkerSessionStore: which
-- workers have a session with which node (worker_sessions), written by the node's
-- liveness loop (cluster/liveness.py), read by a node warming up shards for a planned
-- handoff, and aged out by partition maintenance (cluster/maintenance.py).

-- name: touch_worker_sessions
-- This node has (or just had: closed) a session of each worker: it was seen now.
INSERT INTO worker_sessions (worker_id, node_id, last_seen_at, closed_at)
SELECT worker_id, %(node_id)s, now(), CASE WHEN closed THEN now() END
FROM unnest(%(worker_ids)s::text[], %(closed)s::boolean[]) AS w(worker_id, closed)
ORDER BY worker_id
ON CONFLICT (worker_id, node_id) DO UPDATE
    SET last_seen_at = now(), closed_at = EXCLUDED.closed_at;

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
