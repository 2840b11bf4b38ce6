-- The checkpoint-store's schema (docs/design.md §2, §4; seed 003 §4.1, seed 001), SQLite flavour of
-- migrations/postgres: ids are 16-byte UUID blobs (v7, so they sort by creation); instants are
-- INTEGER milliseconds since the Unix epoch, as on the wire; JSON values are TEXT holding JSON.

-- Checkpoints: snapshots of one execution's state, full or delta, each with its SHA-256.
CREATE TABLE checkpoints (
    checkpoint_id        BLOB PRIMARY KEY,
    execution_id         BLOB NOT NULL,
    event_sequence       BIGINT NOT NULL,
    stream_sequence      BIGINT NOT NULL,
    kind                 TEXT NOT NULL CHECK (kind IN ('full', 'delta')),
    -- A delta's base; a full checkpoint has none. Pruning deletes a full checkpoint together with
    -- the deltas built on it, so the reference never dangles.
    base_checkpoint_id   BLOB REFERENCES checkpoints (checkpoint_id),
    checksum_sha256      BLOB NOT NULL,
    created_at_unix_ms   BIGINT NOT NULL,
    size_bytes           BIGINT NOT NULL,
    state_format_version INTEGER NOT NULL,
    state                BLOB NOT NULL,
    CHECK ((kind = 'full') = (base_checkpoint_id IS NULL))
);
CREATE INDEX checkpoints_by_execution ON checkpoints (execution_id, checkpoint_id);
CREATE INDEX checkpoints_by_base ON checkpoints (base_checkpoint_id);

-- One row per execution, as far as the event log has been read (`last_sequence`).
CREATE TABLE executions (
    execution_id              BLOB PRIMARY KEY,
    name                      TEXT NOT NULL,
    state                     TEXT NOT NULL,
    run_number                INTEGER NOT NULL,
    created_at_unix_ms        BIGINT NOT NULL,
    started_at_unix_ms        BIGINT,
    ended_at_unix_ms          BIGINT,
    reason                    TEXT NOT NULL DEFAULT '',
    idempotency_key           TEXT NOT NULL DEFAULT '',
    -- Every event at or below it is applied; events arriving again are skipped.
    last_sequence             BIGINT NOT NULL,
    tokens_used               BIGINT NOT NULL DEFAULT 0,
    cost                      REAL NOT NULL DEFAULT 0,
    -- Progress as of `last_sequence`: instances by state (plan tasks not instantiated yet count
    -- as pending), units of work known and settled, and the wave position.
    pending_tasks             BIGINT NOT NULL DEFAULT 0,
    queued_tasks              BIGINT NOT NULL DEFAULT 0,
    blocked_tasks             BIGINT NOT NULL DEFAULT 0,
    running_tasks             BIGINT NOT NULL DEFAULT 0,
    waiting_for_subtasks_tasks BIGINT NOT NULL DEFAULT 0,
    waiting_for_human_tasks   BIGINT NOT NULL DEFAULT 0,
    retry_scheduled_tasks     BIGINT NOT NULL DEFAULT 0,
    completed_tasks           BIGINT NOT NULL DEFAULT 0,
    failed_tasks              BIGINT NOT NULL DEFAULT 0,
    skipped_tasks             BIGINT NOT NULL DEFAULT 0,
    cancelled_tasks           BIGINT NOT NULL DEFAULT 0,
    total_tasks               BIGINT NOT NULL DEFAULT 0,
    done_tasks                BIGINT NOT NULL DEFAULT 0,
    percent_complete          REAL NOT NULL DEFAULT 0,
    wave                      INTEGER NOT NULL DEFAULT 0,
    waves                     INTEGER NOT NULL DEFAULT 0,
    updated_at_unix_ms        BIGINT NOT NULL
);
CREATE INDEX executions_by_state ON executions (state, execution_id);
CREATE INDEX executions_by_created ON executions (created_at_unix_ms);

-- The caller's labels of an execution, one row each, so label filters are plain joins.
CREATE TABLE execution_labels (
    execution_id BLOB NOT NULL REFERENCES executions (execution_id) ON DELETE CASCADE,
    key          TEXT NOT NULL,
    value        TEXT NOT NULL,
    PRIMARY KEY (execution_id, key)
);
CREATE INDEX execution_labels_by_pair ON execution_labels (key, value);

-- Task instances: the seed's TaskStatusRecord, one row per instance (the root record standing for
-- the execution included).
CREATE TABLE task_instances (
    execution_id                    BLOB NOT NULL,
    task_instance_id                BLOB NOT NULL,
    task_id                         TEXT NOT NULL,
    parent_task_instance_id         BLOB,
    subtask_group_id                BLOB,
    resumed_after_subtasks_group_id BLOB,
    continues_task_instance_id      BLOB,
    run_number                      INTEGER NOT NULL,
    attempt                         INTEGER NOT NULL,
    state                           TEXT NOT NULL,
    worker_id                       TEXT,
    created_at_unix_ms              BIGINT NOT NULL,
    started_at_unix_ms              BIGINT,
    ended_at_unix_ms                BIGINT,
    output                          TEXT,
    error                           TEXT,
    PRIMARY KEY (execution_id, task_instance_id)
);
CREATE INDEX task_instances_by_state ON task_instances (execution_id, state, task_instance_id);
CREATE INDEX task_instances_by_group ON task_instances (execution_id, subtask_group_id, task_instance_id);
CREATE INDEX task_instances_by_task ON task_instances (execution_id, task_id, task_instance_id);
CREATE INDEX task_instances_by_parent ON task_instances (execution_id, parent_task_instance_id, task_instance_id);

-- The event log as read: each event's encoded `trellis.v1.Event`, with the fields worth filtering on.
CREATE TABLE events (
    execution_id     BLOB NOT NULL,
    sequence         BIGINT NOT NULL,
    at_unix_ms       BIGINT NOT NULL,
    kind             TEXT NOT NULL,
    task_instance_id BLOB,
    payload          BLOB NOT NULL,
    PRIMARY KEY (execution_id, sequence)
);
CREATE INDEX events_by_instance ON events (task_instance_id) WHERE task_instance_id IS NOT NULL;

-- Questions asked to humans (seed 001 `questions`), from question_asked/answered/expired events.
CREATE TABLE questions (
    question_id        BLOB PRIMARY KEY,
    execution_id       BLOB NOT NULL,
    task_instance_id   BLOB NOT NULL,
    task_id            TEXT NOT NULL,
    attempt            INTEGER NOT NULL,
    question_type      TEXT NOT NULL,
    text               TEXT NOT NULL,
    options            TEXT NOT NULL,
    default_answer     TEXT NOT NULL,
    timeout_action     TEXT NOT NULL,
    expires_at_unix_ms BIGINT,
    status             TEXT NOT NULL CHECK (status IN ('pending', 'answered', 'expired')),
    answer             TEXT,
    asked_at_unix_ms   BIGINT NOT NULL,
    resolved_at_unix_ms BIGINT
);
CREATE INDEX questions_by_execution ON questions (execution_id, status);

-- Workers as seen from their heartbeats, written at most every few seconds per worker.
CREATE TABLE workers (
    worker_id                 TEXT PRIMARY KEY,
    host                      TEXT NOT NULL,
    queues                    TEXT NOT NULL,
    slots                     INTEGER NOT NULL,
    state                     TEXT NOT NULL,
    running_tasks             INTEGER NOT NULL,
    memory_bytes              BIGINT NOT NULL,
    cpu_percent               REAL NOT NULL,
    interval_ms               BIGINT NOT NULL,
    first_seen_at_unix_ms     BIGINT NOT NULL,
    last_heartbeat_at_unix_ms BIGINT NOT NULL,
    heartbeat_count           BIGINT NOT NULL,
    -- The last heartbeat as received (`trellis.v1.WorkerHeartbeat`), with its running tasks.
    last_heartbeat            BLOB NOT NULL
);
