-- 0010: the primary key of tasks leads with id: (id, scheduled_at), and tasks_id_idx,
-- which it now covers, is dropped.
--
-- Every task of a stampede shares one scheduled_at (every :00 is one). With the key
-- (scheduled_at, id), a batch statement told `scheduled_at = ANY(...)` (for partition
-- pruning) could walk the key's scheduled_at prefix: every task of the instant, for every
-- batch of 200. PostgreSQL chose that plan whenever the partition's statistics were taken
-- before the stampede's rows existed (issue 14: 3 of 22 stampede runs fell to 30-330
-- tasks/s; autovacuum is off there). Led by id, no index reads a whole instant, so the
-- plans left are per-key probes or a scan costed by the partition's real size
-- (tests/integration/test_hot_plans.py). GetTask by id alone probes the key's id prefix
-- in each partition, as it probed tasks_id_idx.
ALTER TABLE tasks DROP CONSTRAINT tasks_pkey;
ALTER TABLE tasks ADD CONSTRAINT tasks_pkey PRIMARY KEY (id, scheduled_at);
DROP INDEX tasks_id_idx;
