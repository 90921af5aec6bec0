-- 0011: recurring schedules (docs/architecture.md#d13), as the ScheduleService and the
-- materialiser use them.
--
-- The schedules table of 0001 was a placeholder no code ever wrote (no API served it):
-- it is replaced, not altered, because its template was JSON (jsonb rewrites numbers,
-- and a payload must come back as it was sent) and it had no shard, bounds or watch.
DROP TABLE schedules;

CREATE TABLE schedules (
    id                   uuid PRIMARY KEY,
    tenant_id            uuid NOT NULL REFERENCES tenants (id),
    name                 text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- shard_of(id): only the owner of this shard materialises the schedule, under its epoch.
    shard                smallint NOT NULL CHECK (shard >= 0),
    -- Exactly one rule: a cron expression in `timezone`, or a fixed interval from `anchor_at`.
    cron                 text CHECK (length(cron) BETWEEN 1 AND 200),
    interval_s           double precision CHECK (interval_s >= 1),
    timezone             text NOT NULL CHECK (length(timezone) BETWEEN 1 AND 100),
    -- An interval's occurrences are anchor_at + k * interval (start_at, else creation).
    anchor_at            timestamptz NOT NULL,
    start_at             timestamptz,
    end_at               timestamptz,
    -- The SubmitTaskRequest every occurrence submits, as protobuf bytes: validated at
    -- create and update, and re-read per occurrence by the same validation as a submit.
    task_template        bytea NOT NULL,
    catchup_policy       text NOT NULL CHECK (catchup_policy IN ('SKIP', 'LATEST', 'ALL')),
    catchup_limit        integer NOT NULL CHECK (catchup_limit BETWEEN 1 AND 10000),
    misfire_grace_s      double precision NOT NULL CHECK (misfire_grace_s >= 0),
    overlap_policy       text NOT NULL CHECK (overlap_policy IN ('ALLOW', 'SKIP', 'BUFFER_ONE')),
    -- The watchdog's view (derived expectation): each occurrence must complete by its
    -- logical date + expected_duration_s + tolerance_s, unless watch is false.
    job_id               text NOT NULL CHECK (length(job_id) BETWEEN 1 AND 200),
    watch                boolean NOT NULL DEFAULT true,
    expected_duration_s  double precision NOT NULL CHECK (expected_duration_s >= 0),
    tolerance_s          double precision NOT NULL CHECK (tolerance_s >= 0),
    severity             text NOT NULL DEFAULT 'critical'
                         CHECK (severity IN ('critical', 'error', 'warning', 'info')),
    paused               boolean NOT NULL DEFAULT false,
    -- Every occurrence at or before cursor_at is decided (created, skipped or missed).
    cursor_at            timestamptz NOT NULL,
    -- The first occurrence after cursor_at; NULL once the schedule has ended. The
    -- watchdog reads it: a next_at long past means nobody materialised it.
    next_at              timestamptz,
    -- When the materialiser must look at the schedule again (next_at - lookahead, or
    -- - the overlap lead, or soon while an occurrence is buffered); NULL: never (ended).
    materialise_at       timestamptz,
    -- BUFFER_ONE: the occurrence held until the previous one finishes.
    buffered_at          timestamptz,
    -- The newest occurrence task the materialiser created (overlap reads its status).
    last_task_id         uuid,
    last_task_scheduled_at timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name),
    CHECK ((cron IS NULL) <> (interval_s IS NULL)),
    CHECK (end_at IS NULL OR start_at IS NULL OR end_at > start_at),
    CHECK ((last_task_id IS NULL) = (last_task_scheduled_at IS NULL))
);
-- The materialiser: schedules of its shards that need a look, soonest first.
CREATE INDEX schedules_materialise_idx ON schedules (shard, materialise_at)
    WHERE NOT paused AND materialise_at IS NOT NULL;

-- One row per decided occurrence: the idempotency key (schedule_id, logical_date) as a
-- real primary key, so no two nodes, no handoff and no retry of a lost commit can
-- create one occurrence twice. (The tasks table cannot hold it: a unique key of a
-- partitioned table must include scheduled_at, and a backfilled or late occurrence
-- runs at another instant than its logical date.)
-- It is also the schedule's history (GetSchedule's last runs) and what the watchdog
-- reads for the latest occurrence past its deadline.
CREATE TABLE schedule_occurrences (
    schedule_id        uuid NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    logical_date       timestamptz NOT NULL,
    tenant_id          uuid NOT NULL,
    -- SCHEDULE: on time; CATCHUP: missed and run late; TRIGGER: TriggerSchedule;
    -- BACKFILL: BackfillSchedule; BUFFERED: held by BUFFER_ONE, run after the previous.
    origin             text NOT NULL
                       CHECK (origin IN ('SCHEDULE', 'CATCHUP', 'TRIGGER', 'BACKFILL',
                                         'BUFFERED')),
    -- The task it created; NULL when the overlap policy skipped it.
    task_id            uuid,
    task_scheduled_at  timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, logical_date),
    CHECK ((task_id IS NULL) = (task_scheduled_at IS NULL))
);
-- Retention (partition maintenance) drops occurrences as old as the task partitions.
CREATE INDEX schedule_occurrences_created_idx ON schedule_occurrences (created_at);
