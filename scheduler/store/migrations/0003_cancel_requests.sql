-- Cooperative cancel of a RUNNING task (DESIGN §4: RUNNING -> CANCELLED once the worker
-- acknowledges). CancelTask records the request here; the node that holds the worker's
-- stream tells it at once, and every node answers the worker's next heartbeat with a
-- Cancel, so the request reaches the worker wherever its stream is. A failure reported
-- for a task with a pending request ends it CANCELLED instead of RETRYING.
ALTER TABLE tasks
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN cancel_reason text;
