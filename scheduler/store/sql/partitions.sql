-- The statements of chronoshard.scheduler.store.partitions: partition maintenance, by
-- hand (`chronoshard partitions`, sync) and on the nodes (cluster/maintenance.py, async),
-- sharing these statements. The partition functions are migration 0002's; each takes a
-- transaction advisory lock ('chro', 2) so concurrent runs take turns, and runs under the
-- caller's lock_timeout (migration 0006). Advisory lock keys as in migrate.sql.

-- name: try_maintenance_lock
-- Session-level: one node runs partition maintenance at a time; the others skip a round.
-- Keys as in migrate.sql: ('chro', 3).
SELECT pg_try_advisory_lock(1667789423, 3);

-- name: maintenance_unlock
SELECT pg_advisory_unlock(1667789423, 3);

-- name: set_lock_timeout
-- How long partition DDL may wait for the `tasks` lock, for this transaction only.
-- Statements on `tasks` queue behind the DDL's lock request while it waits, so a node
-- keeps this short and tries again next round; `chronoshard partitions` waits longer.
SELECT set_config('lock_timeout', %(lock_timeout)s, true);

-- name: ensure_partitions
-- from_day NULL means today in UTC.
SELECT chronoshard_ensure_partitions(
    COALESCE(%(from_day)s::date, (now() AT TIME ZONE 'UTC')::date),
    %(days_ahead)s::integer
);

-- name: detach_old_partitions
-- The schedules' occurrence records go by the same retention, by age (their tasks are in
-- the partitions dropped; a record whose task's partition is kept goes all the same).
WITH dropped AS (
    SELECT chronoshard_detach_old_partitions(make_interval(days => %(retention_days)s::integer))
        AS name
), occurrences AS (
    DELETE FROM schedule_occurrences
    WHERE created_at < now() - make_interval(days => %(retention_days)s::integer)
)
SELECT name FROM dropped;

-- name: never_analyzed_tables
-- The hot tables (every partition of `tasks`, and `task_attempts`) that took rows but
-- never had statistics: a new day partition until autovacuum first analyzes it (up to a
-- minute). Without statistics the planner guesses, and for the batched hot statements it
-- guesses scans of the whole partition or of the in-flight index per row. Each is then
-- analyzed by name (ANALYZE takes an identifier, composed in partitions.py).
SELECT s.schemaname, s.relname
FROM pg_stat_user_tables AS s
WHERE (s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass('tasks'))
       OR s.relid = to_regclass('task_attempts'))
  AND s.last_analyze IS NULL
  AND s.last_autoanalyze IS NULL
  AND s.n_mod_since_analyze >= %(min_changes)s
ORDER BY s.n_mod_since_analyze DESC;
