-- The namespace each execution runs in (executions started before namespaces ran in `default`).
ALTER TABLE executions ADD COLUMN namespace TEXT NOT NULL DEFAULT 'default';
