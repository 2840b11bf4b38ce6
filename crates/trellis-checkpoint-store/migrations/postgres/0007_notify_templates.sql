-- Questions carry a priority (seed 001 names critical, high, medium and low); '' on older rows.
ALTER TABLE questions ADD COLUMN priority TEXT NOT NULL DEFAULT '';

-- Where notifications go: a generic webhook (JSON, HMAC-signed) or a Telegram-compatible bot, for
-- the executions of a project or of one of its lists (list_name NULL: the whole project). An
-- execution started by a list run belongs to that list; any other to the project "default".
CREATE TABLE notify_sinks (
    project            TEXT NOT NULL REFERENCES backlog_projects (project),
    name               TEXT NOT NULL,
    list_name          TEXT,
    kind               TEXT NOT NULL CHECK (kind IN ('webhook', 'telegram')),
    -- webhook: the URL posted to; telegram: the Bot API's base URL.
    url                TEXT NOT NULL,
    -- telegram: the chat messages go to; '' for a webhook.
    chat_id            TEXT NOT NULL,
    -- webhook: the HMAC-SHA256 key of both directions; telegram: the bot token.
    secret             TEXT NOT NULL,
    -- telegram: the secret_token its updates must carry, and the key of the buttons' MACs.
    callback_secret    TEXT NOT NULL,
    -- What it is told of, comma-separated: question, completed, failed.
    events             TEXT NOT NULL,
    created_at_unix_ms BIGINT NOT NULL,
    PRIMARY KEY (project, name)
);

-- One notification to one sink: enqueued once per event (the UNIQUE key), sent and retried with
-- backoff until delivered or out of attempts; every attempt's outcome is recorded.
CREATE TABLE notify_deliveries (
    delivery_id             UUID PRIMARY KEY,
    project                 TEXT NOT NULL,
    sink                    TEXT NOT NULL,
    -- question/<question id> or execution/<execution id>/<completed|failed>.
    event_key               TEXT NOT NULL,
    event_at_unix_ms        BIGINT NOT NULL,
    -- The event, JSON: a webhook gets it as its body; a bot gets a message made from it.
    payload                 TEXT NOT NULL,
    status                  TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts                INTEGER NOT NULL,
    next_attempt_at_unix_ms BIGINT NOT NULL,
    -- The HTTP status of the last attempt; NULL when it got no response.
    last_status             INTEGER,
    last_error              TEXT NOT NULL,
    delivered_at_unix_ms    BIGINT,
    created_at_unix_ms      BIGINT NOT NULL,
    UNIQUE (project, sink, event_key),
    FOREIGN KEY (project, sink) REFERENCES notify_sinks (project, name) ON DELETE CASCADE
);
CREATE INDEX notify_deliveries_due ON notify_deliveries (status, next_attempt_at_unix_ms);
CREATE INDEX questions_by_asked ON questions (asked_at_unix_ms);

-- Task templates (seed 001 `task_templates`): the fields a new task takes when it leaves them
-- empty, per project.
CREATE TABLE backlog_templates (
    project            TEXT NOT NULL REFERENCES backlog_projects (project),
    name               TEXT NOT NULL,
    description        TEXT NOT NULL,
    -- The defaults, JSON (a `trellis_core::backlog::BacklogTask` without title or number).
    defaults           TEXT NOT NULL,
    usage_count        INTEGER NOT NULL DEFAULT 0,
    created_at_unix_ms BIGINT NOT NULL,
    updated_at_unix_ms BIGINT NOT NULL,
    PRIMARY KEY (project, name)
);
