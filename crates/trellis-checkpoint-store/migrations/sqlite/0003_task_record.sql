-- The task record: when each attempt was handed to the task queue (`started_at_unix_ms` is now
-- when a worker took it) and the attempts before the current one, as a JSON array of
-- `{attempt, worker_id, dispatched_at_ms, started_at_ms, ended_at_ms, error}` (NULL: none).
ALTER TABLE task_instances ADD COLUMN dispatched_at_unix_ms BIGINT;
ALTER TABLE task_instances ADD COLUMN earlier_attempts TEXT;
