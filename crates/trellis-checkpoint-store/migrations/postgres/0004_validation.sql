-- A task's `validate:` checks: the current attempt's results as a JSON array of
-- `{name, level, passed, duration_ms, output}` (NULL: none ran). Earlier attempts keep theirs
-- in `earlier_attempts` (key `validation`).
ALTER TABLE task_instances ADD COLUMN validation TEXT;
