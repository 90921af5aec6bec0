-- The shard epoch each dispatch intent was written under. The intent's transaction holds
-- the shard's shard_owners row FOR SHARE and has checked the epoch, so this records the
-- fence that let the write through; fault tests check that, per shard, attempts never go
-- back to an older epoch (no dispatch under a superseded owner). NULL for attempts
-- written before this migration.
ALTER TABLE task_attempts ADD COLUMN epoch bigint;
