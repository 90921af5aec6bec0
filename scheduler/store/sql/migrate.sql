-- Bookkeeping statements of chronoshard.scheduler.store.migrate (sync, one connection).
-- The advisory lock keys are (classid, objid) = ('chro' as an int32, n):
-- n = 1 for migrations here, n = 2 for partition maintenance (0002_partition_maintenance.sql).

-- name: lock
SELECT pg_advisory_lock(1667789423, 1);

-- name: unlock
SELECT pg_advisory_unlock(1667789423, 1);

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: applied_migrations
SELECT version, name, checksum FROM schema_migrations ORDER BY version;

-- name: record_migration
INSERT INTO schema_migrations (version, name, checksum) VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: ensure_partitions
-- from_day NULL means today in UTC.
SELECT chronoshard_ensure_partitions(
    COALESCE(%(from_day)s::date, (now() AT TIME ZONE 'UTC')::date),
    %(days_ahead)s::integer
);

-- name: detach_old_partitions
SELECT chronoshard_detach_old_partitions(make_interval(days => %(retention_days)s::integer));

-- name: maintenance_lock_timeout
-- `chronoshard partitions` waits up to 10 s for the table lock (the node waits less).
SET LOCAL lock_timeout = '10s';
