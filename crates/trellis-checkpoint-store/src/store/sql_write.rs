// The store's write transactions, part of `sql.rs` (which `include!`s this file, so it is compiled
// once per backend with that file's `Db`, `StoreImpl` and helpers): the one way a transaction is
// run, [`StoreImpl::write`], and the statements the `Store` methods write with, each built by a
// function from one chunk of rows.
//
// (A plain `//` header: an included file cannot carry inner doc comments.)

/// The statements of one write transaction, in the order they run, each built when it is reached.
///
/// Boxed: the compiler cannot prove an async `Store` method `Send` while it holds the concrete
/// iterator adapters with their closures over borrowed rows, only once they are behind `dyn`.
type Statements<'a> = Box<dyn Iterator<Item = QueryBuilder<'a, Db>> + Send + 'a>;

impl StoreImpl {
    /// Runs one write transaction: takes the write lock, begins, runs the statements that
    /// `statements` returns in order, and commits; a failure to begin, of any statement or to
    /// commit is reported as `failed`, and the transaction is rolled back (nothing is written).
    ///
    /// `statements` is called once the transaction has begun, and the statements are built one
    /// at a time as they run, so a large batch never holds the bind values of all its chunks at
    /// once.
    async fn write<'a>(
        &self,
        failed: &str,
        statements: impl FnOnce() -> Statements<'a> + Send,
    ) -> Result<(), Error> {
        let _writes = self.lock_writes().await;
        let mut tx = self.begin_write().await.map_err(db_err(failed))?;
        for mut statement in statements() {
            statement
                .build()
                .execute(&mut *tx)
                .await
                .map_err(db_err(failed))?;
        }
        tx.commit().await.map_err(db_err(failed))
    }
}

/// Deletes checkpoints by id.
fn checkpoints_delete(ids: &[Uuid]) -> QueryBuilder<'_, Db> {
    let mut query = QueryBuilder::<Db>::new("DELETE FROM checkpoints WHERE checkpoint_id IN (");
    let mut separated = query.separated(", ");
    for id in ids {
        separated.push_bind(*id);
    }
    query.push(")");
    query
}

/// Upserts execution rows, unless the stored row is as recent (`last_sequence`).
fn executions_upsert<'a>(rows: &'a [&'a ExecutionRow], now: i64) -> QueryBuilder<'a, Db> {
    let mut query = QueryBuilder::<Db>::new(format!(
        "INSERT INTO executions ({EXECUTION_COLUMNS}, updated_at_unix_ms) "
    ));
    query.push_values(rows, |mut values, row| {
        values
            .push_bind(row.execution_id.0)
            .push_bind(text(&row.name))
            .push_bind(row.state.as_str())
            .push_bind(to_i32(row.run_number))
            .push_bind(to_i64(row.created_at_ms))
            .push_bind(row.started_at_ms.map(to_i64))
            .push_bind(row.ended_at_ms.map(to_i64))
            .push_bind(text(&row.reason))
            .push_bind(text(&row.idempotency_key))
            .push_bind(to_i64(row.last_sequence))
            .push_bind(to_i64(row.usage.tokens_used))
            .push_bind(row.usage.cost);
        for count in row.progress.counts.0 {
            values.push_bind(to_i64(count));
        }
        values
            .push_bind(to_i64(row.progress.total))
            .push_bind(to_i64(row.progress.done))
            .push_bind(row.progress.percent)
            .push_bind(to_i32(row.progress.wave))
            .push_bind(to_i32(row.progress.waves))
            .push_bind(text(&row.namespace))
            .push_bind(now);
    });
    query.push(
        " ON CONFLICT (execution_id) DO UPDATE SET name = excluded.name, \
         state = excluded.state, run_number = excluded.run_number, \
         created_at_unix_ms = excluded.created_at_unix_ms, \
         started_at_unix_ms = excluded.started_at_unix_ms, \
         ended_at_unix_ms = excluded.ended_at_unix_ms, reason = excluded.reason, \
         idempotency_key = excluded.idempotency_key, \
         last_sequence = excluded.last_sequence, tokens_used = excluded.tokens_used, \
         cost = excluded.cost, ",
    );
    for name in COUNT_COLUMNS {
        query.push(format!("{name} = excluded.{name}, "));
    }
    query.push(
        "total_tasks = excluded.total_tasks, done_tasks = excluded.done_tasks, \
         percent_complete = excluded.percent_complete, wave = excluded.wave, \
         waves = excluded.waves, namespace = excluded.namespace, \
         updated_at_unix_ms = excluded.updated_at_unix_ms \
         WHERE executions.last_sequence < excluded.last_sequence",
    );
    query
}

/// Advances `last_sequence` of executions known only by their events (`(id, last sequence, first
/// event at)`), creating a placeholder row for one not stored yet.
fn last_sequences_upsert<'a>(
    rows: &'a [(ExecutionId, u64, u64)],
    now: i64,
) -> QueryBuilder<'a, Db> {
    let mut query = QueryBuilder::<Db>::new(
        "INSERT INTO executions (execution_id, name, state, run_number, \
         created_at_unix_ms, last_sequence, updated_at_unix_ms) ",
    );
    query.push_values(rows, |mut values, (execution_id, last_sequence, at_ms)| {
        values
            .push_bind(execution_id.0)
            .push_bind("")
            .push_bind("running")
            .push_bind(1_i32)
            .push_bind(to_i64(*at_ms))
            .push_bind(to_i64(*last_sequence))
            .push_bind(now);
    });
    query.push(
        " ON CONFLICT (execution_id) DO UPDATE SET \
         last_sequence = excluded.last_sequence, \
         updated_at_unix_ms = excluded.updated_at_unix_ms \
         WHERE executions.last_sequence < excluded.last_sequence",
    );
    query
}

/// Inserts execution labels `(id, key, value)`; a label once set stays.
fn labels_insert<'a>(labels: &[(ExecutionId, &String, &String)]) -> QueryBuilder<'a, Db> {
    let mut query =
        QueryBuilder::<Db>::new("INSERT INTO execution_labels (execution_id, key, value) ");
    query.push_values(labels, |mut values, (execution_id, key, value)| {
        values
            .push_bind(execution_id.0)
            .push_bind(text(key))
            .push_bind(text(value));
    });
    query.push(" ON CONFLICT (execution_id, key) DO NOTHING");
    query
}

/// What an instance already stored takes from its new record.
///
/// An instance's task, parent and group are fixed when it is made, so an update leaves them out:
/// SQLite rewrites the entry of every index on a column the statement assigns, even to the same
/// value, and three of the table's four secondary indexes are on them. An update (each change of
/// an instance's state after the first write) so rewrites the row and its entry in the state
/// index, not its entries in all four.
const INSTANCES_ON_CONFLICT: &str = " ON CONFLICT (execution_id, task_instance_id) DO UPDATE SET \
     resumed_after_subtasks_group_id = excluded.resumed_after_subtasks_group_id, \
     continues_task_instance_id = excluded.continues_task_instance_id, \
     run_number = excluded.run_number, attempt = excluded.attempt, \
     state = excluded.state, worker_id = excluded.worker_id, \
     created_at_unix_ms = excluded.created_at_unix_ms, \
     dispatched_at_unix_ms = excluded.dispatched_at_unix_ms, \
     started_at_unix_ms = excluded.started_at_unix_ms, \
     ended_at_unix_ms = excluded.ended_at_unix_ms, output = excluded.output, \
     error = excluded.error, earlier_attempts = excluded.earlier_attempts, \
     validation = excluded.validation";

/// Upserts task instances.
fn instances_upsert<'a>(records: &'a [TaskStatusRecord]) -> QueryBuilder<'a, Db> {
    let mut query =
        QueryBuilder::<Db>::new(format!("INSERT INTO task_instances ({INSTANCE_COLUMNS}) "));
    query.push_values(records, |mut values, record| {
        values
            .push_bind(record.correlation_id.0)
            .push_bind(record.task_instance_id.0)
            .push_bind(text(&record.task_id))
            .push_bind(record.parent_task_instance_id.map(|id| id.0))
            .push_bind(record.subtask_group_id.map(|id| id.0))
            .push_bind(record.resumed_after_subtasks_group_id.map(|id| id.0))
            .push_bind(record.continues_task_instance_id.map(|id| id.0))
            .push_bind(to_i32(record.run_number))
            .push_bind(to_i32(record.attempt))
            .push_bind(record.state.as_str())
            .push_bind(record.worker_id.as_ref().map(|worker| text(&worker.0)))
            .push_bind(to_i64(record.created_at_ms))
            .push_bind(record.dispatched_at_ms.map(to_i64))
            .push_bind(record.started_at_ms.map(to_i64))
            .push_bind(record.ended_at_ms.map(to_i64))
            .push_bind(record.output.as_ref().map(|output| output.to_string()))
            .push_bind(record.error.as_deref().map(text))
            .push_bind(json_array(&record.earlier_attempts))
            .push_bind(json_array(&record.validation));
    });
    query.push(INSTANCES_ON_CONFLICT);
    query
}

/// A list of a record (its earlier attempts, its checks) as stored: a JSON array, NULL for none
/// (most instances).
fn json_array<T: serde::Serialize>(items: &[T]) -> Option<String> {
    // Serializing plain integers, booleans and strings to JSON cannot fail.
    (!items.is_empty()).then(|| serde_json::to_string(items).unwrap_or_default())
}

/// Inserts log events; one already stored is left as it is.
fn events_insert<'a>(events: &'a [EventRow]) -> QueryBuilder<'a, Db> {
    let mut query = QueryBuilder::<Db>::new(
        "INSERT INTO events (execution_id, sequence, at_unix_ms, kind, task_instance_id, \
         payload) ",
    );
    query.push_values(events, |mut values, event| {
        values
            .push_bind(event.execution_id.0)
            .push_bind(to_i64(event.sequence))
            .push_bind(to_i64(event.at_ms))
            .push_bind(event.kind)
            .push_bind(event.task_instance_id.map(|id| id.0))
            .push_bind(event.payload.as_slice());
    });
    query.push(" ON CONFLICT (execution_id, sequence) DO NOTHING");
    query
}

/// Inserts task log batches; one already stored is left as it is.
fn task_logs_insert(batches: &[LogBatchRow]) -> QueryBuilder<'_, Db> {
    let mut query = QueryBuilder::<Db>::new(
        "INSERT INTO task_logs (execution_id, stream_sequence, task_instance_id, attempt, batch, \
         worker_id, lines, payload) ",
    );
    query.push_values(batches, |mut values, batch| {
        values
            .push_bind(batch.execution_id.0)
            .push_bind(to_i64(batch.stream_sequence))
            .push_bind(batch.task_instance_id.0)
            .push_bind(to_i32(batch.attempt))
            .push_bind(to_i64(batch.batch))
            .push_bind(text(&batch.worker_id))
            .push_bind(to_i32(batch.lines))
            .push_bind(batch.payload.as_slice());
    });
    query.push(" ON CONFLICT (execution_id, stream_sequence) DO NOTHING");
    query
}

/// Inserts asked questions as pending; one already stored is left as it is.
fn questions_insert<'a>(questions: &'a [QuestionRow]) -> QueryBuilder<'a, Db> {
    let mut query = QueryBuilder::<Db>::new(
        "INSERT INTO questions (question_id, execution_id, task_instance_id, task_id, \
         attempt, question_type, text, options, default_answer, timeout_action, \
         expires_at_unix_ms, status, asked_at_unix_ms, priority) ",
    );
    query.push_values(questions, |mut values, asked| {
        let question = &asked.question;
        let (action, default_answer) = timeout_action_columns(&question.timeout_action);
        let options = serde_json::Value::from(
            question
                .options
                .iter()
                .map(|option| serde_json::Value::from(option.as_str()))
                .collect::<Vec<_>>(),
        )
        .to_string();
        values
            .push_bind(question.id.0)
            .push_bind(asked.execution_id.0)
            .push_bind(asked.task_instance_id.0)
            .push_bind(text(&asked.task_id))
            .push_bind(to_i32(asked.attempt))
            .push_bind(text(&question.question_type))
            .push_bind(text(&question.text))
            .push_bind(options)
            .push_bind(text(default_answer))
            .push_bind(action)
            .push_bind(question.expires_at_ms.map(to_i64))
            .push_bind("pending")
            .push_bind(to_i64(asked.asked_at_ms))
            .push_bind(text(&question.priority));
    });
    query.push(" ON CONFLICT (question_id) DO NOTHING");
    query
}

/// Upserts workers, adding their new heartbeats to the stored count.
fn workers_upsert<'a>(workers: &'a [WorkerRow]) -> QueryBuilder<'a, Db> {
    let mut query = QueryBuilder::<Db>::new(
        "INSERT INTO workers (worker_id, host, queues, slots, state, running_tasks, \
         memory_bytes, cpu_percent, interval_ms, first_seen_at_unix_ms, \
         last_heartbeat_at_unix_ms, heartbeat_count, last_heartbeat) ",
    );
    query.push_values(workers, |mut values, worker| {
        let queues = serde_json::Value::from(
            worker
                .queues
                .iter()
                .map(|queue| serde_json::Value::from(queue.as_str()))
                .collect::<Vec<_>>(),
        )
        .to_string();
        values
            .push_bind(text(&worker.worker_id))
            .push_bind(text(&worker.host))
            .push_bind(queues)
            .push_bind(to_i32(worker.slots))
            .push_bind(worker.state)
            .push_bind(to_i32(worker.running_tasks))
            .push_bind(to_i64(worker.memory_bytes))
            .push_bind(worker.cpu_percent)
            .push_bind(to_i64(worker.interval_ms))
            .push_bind(to_i64(worker.first_seen_at_ms))
            .push_bind(to_i64(worker.last_heartbeat_at_ms))
            .push_bind(to_i64(worker.new_heartbeats))
            .push_bind(worker.last_heartbeat.as_slice());
    });
    query.push(
        " ON CONFLICT (worker_id) DO UPDATE SET host = excluded.host, \
         queues = excluded.queues, slots = excluded.slots, state = excluded.state, \
         running_tasks = excluded.running_tasks, memory_bytes = excluded.memory_bytes, \
         cpu_percent = excluded.cpu_percent, interval_ms = excluded.interval_ms, \
         last_heartbeat_at_unix_ms = excluded.last_heartbeat_at_unix_ms, \
         heartbeat_count = workers.heartbeat_count + excluded.heartbeat_count, \
         last_heartbeat = excluded.last_heartbeat",
    );
    query
}

/// Records how a pending question was resolved; one resolved already is left as it is.
fn question_resolve(resolved: &QuestionResolved) -> QueryBuilder<'_, Db> {
    let (status, answer) = match &resolved.resolution {
        Resolution::Answered(answer) => ("answered", Some(text(answer))),
        Resolution::Expired => ("expired", None),
    };
    let mut query = QueryBuilder::<Db>::new("UPDATE questions SET status = ");
    query
        .push_bind(status)
        .push(", answer = ")
        .push_bind(answer)
        .push(", resolved_at_unix_ms = ")
        .push_bind(to_i64(resolved.at_ms))
        .push(" WHERE question_id = ")
        .push_bind(resolved.question_id.0)
        .push(" AND status = 'pending'");
    query
}
