-- 0009: a worker session row says whether the session is still open.
--
-- A node taking shards over in a planned handoff waits until every worker with a live
-- session on another node has one with it too (scheduler/handoff.py). "Seen lately" is
-- not "live": a session closed a few seconds ago (a worker that stopped) would keep the
-- successor waiting for a worker that is not coming. The liveness writer sets closed_at
-- when it records a session's close, and clears it when the worker connects again.
-- last_seen_at keeps its meaning for the reconciler (a worker is gone once no row of it
-- is younger than workers.session_timeout_s).
ALTER TABLE worker_sessions ADD COLUMN closed_at timestamptz;
