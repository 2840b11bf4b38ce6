-- Task log lines: the store's copy of `TRELLIS_LOGS`, which keeps them only for its retention. One
-- row per batch a worker published, `payload` the encoded `trellis.v1.TaskLogBatch`;
-- `stream_sequence` is its place in the stream: the order batches are read in, and what makes a
-- batch JetStream delivers to the store again the same row.
CREATE TABLE task_logs (
    execution_id     UUID NOT NULL,
    stream_sequence  BIGINT NOT NULL,
    task_instance_id UUID NOT NULL,
    attempt          INTEGER NOT NULL,
    batch            BIGINT NOT NULL,
    worker_id        TEXT NOT NULL,
    lines            INTEGER NOT NULL,
    payload          BYTEA NOT NULL,
    PRIMARY KEY (execution_id, stream_sequence)
);
CREATE INDEX task_logs_by_instance ON task_logs (task_instance_id, stream_sequence);
