-- 0002: day partitions of `tasks`, created ahead and dropped by retention.
--
-- Partitions are named tasks_pYYYYMMDD and cover one UTC day [00:00, next 00:00).
-- Both functions take the same transaction-scoped advisory lock, so two nodes running
-- maintenance at once take turns instead of racing to create (or drop) the same table,
-- and both run with a lock_timeout: they need the parent table's ACCESS EXCLUSIVE lock
-- for a moment, and waiting behind a long transaction would queue every other query on
-- `tasks` behind them. A timeout just fails this round; the next one retries.
-- `SET search_path FROM CURRENT` pins the schema the migration ran in.

CREATE FUNCTION chronoshard_task_partition_name(day date) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'tasks_p' || to_char(day, 'YYYYMMDD')
$$;

-- Create the missing day partitions for from_day .. from_day + days_ahead (inclusive).
-- Returns the names it created; a second call creates nothing.
--
-- PostgreSQL refuses to create a partition whose range already has rows in the DEFAULT
-- partition (tasks scheduled beyond the pre-created days land there). Such rows are
-- moved: deleted from DEFAULT into a temporary table, the partition created, and
-- re-inserted through the parent, all in the caller's transaction, so they are never
-- missing for anyone else. The parent lock is taken first so no submit can put a new
-- row into DEFAULT between the move and the CREATE.
CREATE FUNCTION chronoshard_ensure_partitions(from_day date, days_ahead integer)
RETURNS SETOF text
LANGUAGE plpgsql
SET lock_timeout = '10s'
SET search_path FROM CURRENT
AS $$
DECLARE
    day   date;
    part  text;
    lo    text;
    hi    text;
BEGIN
    IF from_day IS NULL OR days_ahead IS NULL OR days_ahead < 0 THEN
        RAISE EXCEPTION 'chronoshard_ensure_partitions: need a day and days_ahead >= 0, got %, %',
            from_day, days_ahead USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock(1667789423, 2);
    FOR day IN SELECT d::date FROM generate_series(from_day, from_day + days_ahead, interval '1 day') AS d
    LOOP
        part := chronoshard_task_partition_name(day);
        CONTINUE WHEN to_regclass(quote_ident(part)) IS NOT NULL;
        -- Bounds spelled with an explicit UTC offset: independent of the session TimeZone.
        lo := to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00';
        hi := to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00';
        LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE;
        IF EXISTS (SELECT 1 FROM tasks_default
                   WHERE scheduled_at >= lo::timestamptz AND scheduled_at < hi::timestamptz) THEN
            CREATE TEMP TABLE IF NOT EXISTS chronoshard_moving (LIKE tasks) ON COMMIT DROP;
            WITH gone AS (
                DELETE FROM tasks_default
                WHERE scheduled_at >= lo::timestamptz AND scheduled_at < hi::timestamptz
                RETURNING *
            )
            INSERT INTO chronoshard_moving SELECT * FROM gone;
            EXECUTE format('CREATE TABLE %I PARTITION OF tasks FOR VALUES FROM (%L) TO (%L)',
                           part, lo, hi);
            INSERT INTO tasks SELECT * FROM chronoshard_moving;
            TRUNCATE chronoshard_moving;
        ELSE
            EXECUTE format('CREATE TABLE %I PARTITION OF tasks FOR VALUES FROM (%L) TO (%L)',
                           part, lo, hi);
        END IF;
        RETURN NEXT part;
    END LOOP;
END;
$$;

-- Detach and drop day partitions that ended more than `retention` ago, together with
-- the rows that describe their tasks (idempotency keys, attempts, dependency edges).
-- A partition that still holds a task that is not finished, or a DEAD_LETTER task an
-- operator may still retry, is kept (DESIGN §3). Returns the names it dropped.
--
-- Each candidate is first locked in SHARE mode: readers go on, but no write can move a
-- row out of a terminal state (or add one) between the check and the drop. The
-- partition's dependents are deleted before the DETACH, so the parent's ACCESS
-- EXCLUSIVE lock (taken by DETACH) is held only for the detach and drop themselves.
-- task_completions is kept: it is the watchdog's history of when each job last ran.
CREATE FUNCTION chronoshard_detach_old_partitions(retention interval)
RETURNS SETOF text
LANGUAGE plpgsql
SET lock_timeout = '10s'
SET search_path FROM CURRENT
AS $$
DECLARE
    cutoff   timestamptz;
    part     record;
    busy     boolean;
    doomed   text[] := '{}';
    victim   text;
BEGIN
    IF retention IS NULL OR retention < interval '0' THEN
        RAISE EXCEPTION 'chronoshard_detach_old_partitions: retention must be >= 0, got %',
            retention USING ERRCODE = 'invalid_parameter_value';
    END IF;
    cutoff := now() - retention;
    PERFORM pg_advisory_xact_lock(1667789423, 2);
    FOR part IN
        SELECT c.relname::text AS relname,
               to_date(substr(c.relname, 8), 'YYYYMMDD') AS day
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'tasks'::regclass
          AND c.relname ~ '^tasks_p[0-9]{8}$'
        ORDER BY 2
    LOOP
        -- Only partitions whose whole day is older than the cutoff.
        EXIT WHEN ((part.day + 1)::timestamp AT TIME ZONE 'UTC') > cutoff;
        EXECUTE format('LOCK TABLE %I IN SHARE MODE', part.relname);
        EXECUTE format(
            'SELECT EXISTS (SELECT 1 FROM %I WHERE status NOT IN '
            '(''COMPLETED'', ''CANCELLED'', ''UPSTREAM_FAILED''))', part.relname)
            INTO busy;
        CONTINUE WHEN busy;
        EXECUTE format('DELETE FROM idempotency_keys k USING %I t '
                       'WHERE k.task_id = t.id AND k.tenant_id = t.tenant_id', part.relname);
        EXECUTE format('DELETE FROM task_attempts a USING %I t WHERE a.task_id = t.id',
                       part.relname);
        EXECUTE format('DELETE FROM task_dependencies d USING %I t WHERE d.parent_task_id = t.id',
                       part.relname);
        EXECUTE format('DELETE FROM task_dependencies d USING %I t WHERE d.child_task_id = t.id',
                       part.relname);
        doomed := doomed || part.relname;
    END LOOP;
    FOREACH victim IN ARRAY doomed LOOP
        EXECUTE format('ALTER TABLE tasks DETACH PARTITION %I', victim);
        EXECUTE format('DROP TABLE %I', victim);
        RETURN NEXT victim;
    END LOOP;
END;
$$;

SELECT chronoshard_ensure_partitions((now() AT TIME ZONE 'UTC')::date, 7);
