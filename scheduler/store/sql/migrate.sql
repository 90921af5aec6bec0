-- Bookkeeping statements of chronoshard.scheduler.store.migrate (sync, one connection).
-- The advisory lock keys are (classid, objid) = ('chro' as an int32, n):
-- n = 1 for migrations here, n = 2 inside the partition functions
-- (0002_partition_maintenance.sql), n = 3 for a node's maintenance round (partitions.sql).

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
