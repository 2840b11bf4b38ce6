-- The backlog (seed 001's planning side): projects, task lists, tasks before they run, their
-- relationships and blocks, validation rules and grouping suggestions. The planner writes these
-- tables; names are slugs, a task is numbered within its project (shown as T-<number>).
CREATE TABLE backlog_projects (
    project            TEXT PRIMARY KEY,
    name               TEXT NOT NULL,
    description        TEXT NOT NULL,
    -- The grouping weights, JSON (`trellis_core::backlog::grouping::Weights`).
    weights            TEXT NOT NULL,
    next_task_number   INTEGER NOT NULL,
    created_at_unix_ms BIGINT NOT NULL
);

CREATE TABLE backlog_lists (
    project             TEXT NOT NULL REFERENCES backlog_projects (project),
    name                TEXT NOT NULL,
    description         TEXT NOT NULL,
    status              TEXT NOT NULL,
    max_parallel_agents INTEGER NOT NULL CHECK (max_parallel_agents > 0),
    auto_execute        BOOLEAN NOT NULL,
    -- How many runs the list has had; its task counters are counted from its tasks' rows.
    runs                INTEGER NOT NULL DEFAULT 0,
    created_at_unix_ms  BIGINT NOT NULL,
    updated_at_unix_ms  BIGINT NOT NULL,
    PRIMARY KEY (project, name)
);

-- A task waits in the evaluation queue (queue = 'evaluation', no list) or in exactly one list
-- (queue NULL, list_name and position set): the CHECK refuses anything else, whatever the client
-- (each clause is FALSE, never NULL, for a row it does not describe: a CHECK lets NULL through).
-- The list item (position, item status) lives on the task's row: a task is in at most one list.
CREATE TABLE backlog_tasks (
    project             TEXT NOT NULL REFERENCES backlog_projects (project),
    number              INTEGER NOT NULL,
    queue               TEXT,
    list_name           TEXT,
    position            INTEGER,
    item_status         TEXT,
    title               TEXT NOT NULL,
    description         TEXT NOT NULL,
    category            TEXT NOT NULL,
    priority            TEXT NOT NULL,
    effort              TEXT NOT NULL,
    phase               INTEGER NOT NULL CHECK (phase BETWEEN 1 AND 5),
    status              TEXT NOT NULL,
    -- JSON arrays: files ([{path, op}]), acceptance criteria and the three levels' tests.
    files               TEXT NOT NULL,
    acceptance_criteria TEXT NOT NULL,
    codebase_tests      TEXT NOT NULL,
    api_tests           TEXT NOT NULL,
    ui_tests            TEXT NOT NULL,
    created_at_unix_ms  BIGINT NOT NULL,
    updated_at_unix_ms  BIGINT NOT NULL,
    PRIMARY KEY (project, number),
    FOREIGN KEY (project, list_name) REFERENCES backlog_lists (project, name),
    CHECK (
        (queue IS NOT NULL AND queue = 'evaluation' AND list_name IS NULL AND position IS NULL
            AND item_status IS NULL)
        OR (queue IS NULL AND list_name IS NOT NULL AND position IS NOT NULL
            AND item_status IS NOT NULL)
    )
);
CREATE INDEX backlog_tasks_by_list ON backlog_tasks (project, list_name, position);

CREATE TABLE backlog_relationships (
    project TEXT NOT NULL,
    source  INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    target  INTEGER NOT NULL,
    PRIMARY KEY (project, source, kind, target),
    FOREIGN KEY (project, source) REFERENCES backlog_tasks (project, number),
    FOREIGN KEY (project, target) REFERENCES backlog_tasks (project, number),
    CHECK (source <> target)
);

CREATE TABLE backlog_blocks (
    block_id           BLOB PRIMARY KEY,
    project            TEXT NOT NULL,
    task               INTEGER NOT NULL,
    kind               TEXT NOT NULL,
    reason             TEXT NOT NULL,
    blocking_task      INTEGER,
    created_at_unix_ms BIGINT NOT NULL,
    resolved_at_unix_ms BIGINT,
    resolution         TEXT,
    FOREIGN KEY (project, task) REFERENCES backlog_tasks (project, number)
);
CREATE INDEX backlog_blocks_by_task ON backlog_blocks (project, task);

-- Validation rules: `spec` is the rule as sent (JSON of `RuleSpec`), checked before it is stored.
CREATE TABLE backlog_rules (
    project TEXT NOT NULL REFERENCES backlog_projects (project),
    name    TEXT NOT NULL,
    spec    TEXT NOT NULL,
    PRIMARY KEY (project, name)
);

CREATE TABLE backlog_suggestions (
    suggestion_id      BLOB PRIMARY KEY,
    project            TEXT NOT NULL REFERENCES backlog_projects (project),
    status             TEXT NOT NULL,
    name               TEXT NOT NULL,
    -- JSON array of task numbers.
    tasks              TEXT NOT NULL,
    score              REAL NOT NULL,
    reason             TEXT NOT NULL,
    triggered_by       TEXT NOT NULL,
    trigger_task       INTEGER,
    created_list       TEXT,
    created_at_unix_ms BIGINT NOT NULL,
    resolved_at_unix_ms BIGINT
);
CREATE INDEX backlog_suggestions_by_project ON backlog_suggestions (project, status);

-- Runs of a list (execution runs, "lanes"): run N+1 of a list is a new execution of its own. A
-- run is written as `starting` before its execution is started (with the idempotency key of the
-- run, so a run left `starting` by a crash is started again, once), then `running` with the
-- execution's id; its counters and its list's items follow the execution's task instances (the
-- read model) until it ends (`completed`, `failed` or `cancelled`).
CREATE TABLE backlog_runs (
    project             TEXT NOT NULL,
    list_name           TEXT NOT NULL,
    run_number          INTEGER NOT NULL,
    execution_id        BLOB,
    status              TEXT NOT NULL,
    task_type           TEXT NOT NULL,
    -- The worker queue its tasks go to; '' = the default queue.
    queue               TEXT NOT NULL,
    tasks_total         INTEGER NOT NULL,
    tasks_completed     INTEGER NOT NULL DEFAULT 0,
    tasks_failed        INTEGER NOT NULL DEFAULT 0,
    reason              TEXT NOT NULL DEFAULT '',
    created_at_unix_ms  BIGINT NOT NULL,
    ended_at_unix_ms    BIGINT,
    PRIMARY KEY (project, list_name, run_number),
    FOREIGN KEY (project, list_name) REFERENCES backlog_lists (project, name)
);
CREATE INDEX backlog_runs_by_status ON backlog_runs (status);
