-- 0006: what the reconciler needs beyond 0001-0004 (DESIGN §7, §8).
--
-- Worker liveness across nodes. A worker holds one stream to every node, so no single
-- node can tell that a worker is gone. Each node upserts a row per live session (on
-- connect, on close, and every few seconds for all of them in one statement); the
-- reconciler counts a worker as gone once no node has seen it for
-- workers.session_timeout_s. A node that dies leaves its rows behind, and they simply age
-- out. Rows nobody has refreshed for a day are deleted by partition maintenance.
CREATE TABLE worker_sessions (
    worker_id     text NOT NULL CHECK (length(worker_id) BETWEEN 1 AND 200),
    node_id       text NOT NULL CHECK (length(node_id) > 0),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_id, node_id)
);
CREATE INDEX worker_sessions_seen_idx ON worker_sessions (last_seen_at);

-- Partition maintenance runs on a scheduler node, next to dispatch, and must not hold up
-- its statements: DDL on `tasks` queues every other statement behind its lock request.
-- The caller now chooses how long to wait (the node: a fraction of a second, then it
-- tries again later; `chronoshard partitions`: 10 s), instead of the fixed 10 s of 0002.
ALTER FUNCTION chronoshard_ensure_partitions(date, integer) RESET lock_timeout;
ALTER FUNCTION chronoshard_detach_old_partitions(interval) RESET lock_timeout;
