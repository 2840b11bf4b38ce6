//! One suite of store tests, run against SQLite (a temporary file) and PostgreSQL (a fresh
//! database): checkpoints (create, get, restore, list, prune, corruption) and the read model's
//! tables.

use std::collections::BTreeMap;
use std::time::Instant;

use trellis_checkpoint_store::checkpoint::{self, sha256};
use trellis_checkpoint_store::store::{
    CheckpointKind, ErrorKind, EventRow, ExecutionQuery, ExecutionRow, ExecutionWrite, LogBatchRow,
    LogQuery, Page, ProgressRow, QuestionResolved, QuestionRow, ReadModelBatch, Resolution,
    TaskInstanceQuery, WorkerRow,
};
use trellis_core::ids::{ExecutionId, GroupId, QuestionId, TaskInstanceId, WorkerId};
use trellis_core::machine::{ExecutionState, Question, StateCounts, TimeoutAction, Usage};
use trellis_core::record::{AttemptRecord, TaskState, TaskStatusRecord};
use trellis_proto::v1;
use uuid::Uuid;

use crate::support::{TestStore, store_suite};

store_suite!(
    create_then_get_returns_the_same_bytes,
    creating_twice_is_a_no_op_and_other_content_is_refused,
    deltas_need_their_base,
    restore_returns_the_chain_to_the_requested_checkpoint,
    restore_falls_back_past_a_corrupt_link,
    restore_without_an_intact_checkpoint_says_replay_from_one,
    lists_are_paged_newest_first,
    prune_keeps_the_newest_full_checkpoints_with_their_deltas,
    a_two_megabyte_checkpoint_round_trips,
    read_model_writes_are_idempotent_and_queryable,
    a_question_whose_asker_is_cancelled_is_not_open,
    executions_are_listed_by_filters,
    text_with_nul_characters_is_stored,
    a_failed_write_transaction_writes_nothing,
    task_logs_are_kept_once_in_stream_order_and_filtered,
);

/// Builds verified checkpoints of one execution with increasing ids and sequences.
struct Checkpoints {
    execution_id: ExecutionId,
    sequence: u64,
}

impl Checkpoints {
    fn new() -> Self {
        Self {
            execution_id: ExecutionId(Uuid::now_v7()),
            sequence: 0,
        }
    }

    fn request(&mut self, base: Option<Uuid>, state: &[u8]) -> v1::Checkpoint {
        self.sequence += 10;
        v1::Checkpoint {
            metadata: Some(v1::CheckpointMetadata {
                checkpoint_id: Uuid::now_v7().to_string(),
                execution_id: self.execution_id.to_string(),
                event_sequence: self.sequence,
                stream_sequence: self.sequence + 100,
                kind: if base.is_some() {
                    v1::CheckpointKind::Delta
                } else {
                    v1::CheckpointKind::Full
                }
                .into(),
                base_checkpoint_id: base.map(|id| id.to_string()).unwrap_or_default(),
                checksum_sha256: sha256(state).to_vec(),
                created_at_unix_ms: 1_750_000_000_000 + self.sequence as i64,
                size_bytes: state.len() as u64,
                state_format_version: 1,
            }),
            state: state.to_vec(),
        }
    }

    /// Stores a checkpoint and returns its id.
    async fn create(
        &mut self,
        store: &TestStore,
        base: Option<Uuid>,
        state: &[u8],
    ) -> anyhow::Result<Uuid> {
        let checkpoint = checkpoint::verify_new(self.request(base, state), 0)?;
        let meta = store.store.create_checkpoint(&checkpoint).await?;
        Ok(meta.checkpoint_id)
    }
}

fn ids_of(chain: &[trellis_checkpoint_store::store::Checkpoint]) -> Vec<Uuid> {
    chain.iter().map(|c| c.metadata.checkpoint_id).collect()
}

async fn create_then_get_returns_the_same_bytes(store: TestStore) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let request = checkpoints.request(None, b"full state");
    let checkpoint = checkpoint::verify_new(request.clone(), 0)?;
    let created = store.store.create_checkpoint(&checkpoint).await?;
    assert_eq!(created, checkpoint.metadata);
    let read = store
        .store
        .verified_checkpoint(created.checkpoint_id)
        .await?;
    assert_eq!(read, checkpoint);
    assert_eq!(read.metadata.kind, CheckpointKind::Full);
    assert_eq!(read.metadata.stream_sequence, created.event_sequence + 100);
    let missing = store.store.verified_checkpoint(Uuid::now_v7()).await;
    assert_eq!(missing.err().map(|e| e.kind()), Some(ErrorKind::NotFound));
    Ok(())
}

async fn creating_twice_is_a_no_op_and_other_content_is_refused(
    store: TestStore,
) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let request = checkpoints.request(None, b"state");
    let checkpoint = checkpoint::verify_new(request.clone(), 0)?;
    let first = store.store.create_checkpoint(&checkpoint).await?;
    let again = store.store.create_checkpoint(&checkpoint).await?;
    assert_eq!(first, again);
    // The same id with another state is a conflict, and changes nothing.
    let mut other = request;
    other.state = b"other".to_vec();
    if let Some(meta) = other.metadata.as_mut() {
        meta.checksum_sha256 = sha256(b"other").to_vec();
        meta.size_bytes = 5;
    }
    let err = store
        .store
        .create_checkpoint(&checkpoint::verify_new(other, 0)?)
        .await
        .err();
    assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::AlreadyExists));
    let read = store.store.verified_checkpoint(first.checkpoint_id).await?;
    assert_eq!(read.state, b"state");
    assert_eq!(store.count("checkpoints").await?, 1);
    Ok(())
}

async fn deltas_need_their_base(store: TestStore) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let missing = checkpoint::verify_new(checkpoints.request(Some(Uuid::now_v7()), b"d"), 0)?;
    let err = store.store.create_checkpoint(&missing).await.err();
    assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::FailedPrecondition));

    let mut elsewhere = Checkpoints::new();
    let foreign_base = elsewhere.create(&store, None, b"f").await?;
    let foreign = checkpoint::verify_new(checkpoints.request(Some(foreign_base), b"d"), 0)?;
    let err = store.store.create_checkpoint(&foreign).await.err();
    assert!(
        err.as_ref()
            .is_some_and(|e| e.kind() == ErrorKind::InvalidArgument
                && e.to_string().contains("belongs to execution")),
        "{err:?}"
    );
    assert_eq!(store.count("checkpoints").await?, 1);
    Ok(())
}

async fn restore_returns_the_chain_to_the_requested_checkpoint(
    store: TestStore,
) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let execution_id = checkpoints.execution_id;
    let full = checkpoints.create(&store, None, b"full").await?;
    let delta_1 = checkpoints.create(&store, Some(full), b"d1").await?;
    let delta_2 = checkpoints.create(&store, Some(delta_1), b"d2").await?;

    let latest = store.store.restore(execution_id, None).await?;
    assert_eq!(ids_of(&latest.chain), [full, delta_1, delta_2]);
    assert_eq!(latest.replay_from_sequence, 31);
    assert!(latest.corrupt.is_empty());
    assert_eq!(latest.chain[2].state, b"d2");

    let middle = store.store.restore(execution_id, Some(delta_1)).await?;
    assert_eq!(ids_of(&middle.chain), [full, delta_1]);
    assert_eq!(middle.replay_from_sequence, 21);

    let unknown = store
        .store
        .restore(execution_id, Some(Uuid::now_v7()))
        .await;
    assert_eq!(unknown.err().map(|e| e.kind()), Some(ErrorKind::NotFound));
    let other_execution = store
        .store
        .restore(ExecutionId(Uuid::now_v7()), Some(full))
        .await;
    assert_eq!(
        other_execution.err().map(|e| e.kind()),
        Some(ErrorKind::InvalidArgument)
    );
    Ok(())
}

async fn restore_falls_back_past_a_corrupt_link(store: TestStore) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let execution_id = checkpoints.execution_id;
    let full_1 = checkpoints.create(&store, None, b"full 1").await?;
    let delta_1 = checkpoints.create(&store, Some(full_1), b"delta 1").await?;
    let full_2 = checkpoints.create(&store, None, b"full 2").await?;
    let delta_2 = checkpoints.create(&store, Some(full_2), b"delta 2").await?;

    // A disk flips the bytes of the newest full checkpoint: its delta cannot be used either.
    store.damage_state(full_2, b"full 2 but damaged").await?;
    let restored = store.store.restore(execution_id, None).await?;
    assert_eq!(ids_of(&restored.chain), [full_1, delta_1]);
    assert_eq!(restored.replay_from_sequence, 21);
    assert_eq!(restored.corrupt.len(), 1);
    assert_eq!(restored.corrupt[0].checkpoint_id, full_2);
    assert!(
        restored.corrupt[0].reason.contains("size mismatch"),
        "{:?}",
        restored.corrupt
    );

    // Same length, other bytes: caught by the checksum.
    store.damage_state(full_2, b"FULL 2").await?;
    store.damage_state(delta_1, b"DELTA 1").await?;
    let restored = store.store.restore(execution_id, Some(delta_2)).await?;
    assert_eq!(ids_of(&restored.chain), [full_1]);
    assert_eq!(restored.replay_from_sequence, 11);
    let corrupt: Vec<Uuid> = restored.corrupt.iter().map(|c| c.checkpoint_id).collect();
    assert_eq!(corrupt, [full_2, delta_1]);
    assert!(restored.corrupt[0].reason.contains("checksum mismatch"));

    let err = store.store.verified_checkpoint(full_2).await.err();
    assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::DataLoss));
    Ok(())
}

async fn restore_without_an_intact_checkpoint_says_replay_from_one(
    store: TestStore,
) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let execution_id = checkpoints.execution_id;
    let none = store.store.restore(execution_id, None).await.err();
    assert!(
        none.as_ref()
            .is_some_and(|e| e.kind() == ErrorKind::NotFound
                && e.to_string().contains("replay its log from sequence 1")),
        "{none:?}"
    );
    let full = checkpoints.create(&store, None, b"full").await?;
    checkpoints.create(&store, Some(full), b"delta").await?;
    store.damage_state(full, b"lost").await?;
    let err = store.store.restore(execution_id, None).await.err();
    assert!(
        err.as_ref().is_some_and(|e| e.kind() == ErrorKind::NotFound
            && e.to_string().contains("sequence 1")
            && e.to_string().contains(&full.to_string())),
        "{err:?}"
    );
    Ok(())
}

async fn lists_are_paged_newest_first(store: TestStore) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let execution_id = checkpoints.execution_id;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(checkpoints.create(&store, None, &[n]).await?);
    }
    // Another execution's checkpoints never show.
    Checkpoints::new().create(&store, None, b"x").await?;
    ids.reverse();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let (page, next) = store.store.list(execution_id, after, 2).await?;
        assert!(page.len() <= 2);
        seen.extend(page.iter().map(|meta| meta.checkpoint_id));
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    Ok(())
}

async fn prune_keeps_the_newest_full_checkpoints_with_their_deltas(
    store: TestStore,
) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let execution_id = checkpoints.execution_id;
    let full_1 = checkpoints.create(&store, None, b"f1").await?;
    let delta_1 = checkpoints.create(&store, Some(full_1), b"d1").await?;
    let full_2 = checkpoints.create(&store, None, b"f2").await?;
    let delta_2 = checkpoints.create(&store, Some(full_2), b"d2").await?;
    let full_3 = checkpoints.create(&store, None, b"f3").await?;
    let delta_3 = checkpoints.create(&store, Some(full_3), b"d3").await?;
    let delta_4 = checkpoints
        .create(&store, Some(delta_3), b"d4 longer")
        .await?;

    let err = store.store.prune(execution_id, 0).await.err();
    assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::InvalidArgument));

    let pruned = store.store.prune(execution_id, 2).await?;
    let mut deleted = pruned.deleted.clone();
    deleted.sort();
    assert_eq!(deleted, [full_1, delta_1]);
    assert_eq!(pruned.freed_bytes, 4);
    let (left, _) = store.store.list(execution_id, None, 100).await?;
    let left: Vec<Uuid> = left.iter().map(|meta| meta.checkpoint_id).collect();
    assert_eq!(left, [delta_4, delta_3, full_3, delta_2, full_2]);

    let pruned = store.store.prune(execution_id, 1).await?;
    assert_eq!(pruned.deleted.len(), 2);
    let restored = store.store.restore(execution_id, None).await?;
    assert_eq!(ids_of(&restored.chain), [full_3, delta_3, delta_4]);
    let again = store.store.prune(execution_id, 1).await?;
    assert!(again.deleted.is_empty());
    Ok(())
}

async fn a_two_megabyte_checkpoint_round_trips(store: TestStore) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let execution_id = checkpoints.execution_id;
    let state: Vec<u8> = (0..2 * 1024 * 1024u32).map(|n| (n % 251) as u8).collect();
    let mut create = Vec::new();
    let mut restore = Vec::new();
    let mut last = None;
    for _ in 0..5 {
        let request = checkpoints.request(None, &state);
        let started = Instant::now();
        let checkpoint = checkpoint::verify_new(request, 0)?;
        last = Some(
            store
                .store
                .create_checkpoint(&checkpoint)
                .await?
                .checkpoint_id,
        );
        create.push(started.elapsed());
        let started = Instant::now();
        let restored = store.store.restore(execution_id, None).await?;
        restore.push(started.elapsed());
        assert_eq!(restored.chain.len(), 1);
        assert_eq!(restored.chain[0].state.len(), state.len());
    }
    assert_eq!(
        store.store.restore(execution_id, None).await?.chain[0]
            .metadata
            .checkpoint_id,
        last.unwrap_or_default()
    );
    eprintln!(
        "{:?}: 2 MiB checkpoint create {create:?}, restore {restore:?}",
        store.store.backend()
    );
    Ok(())
}

pub(crate) fn record(
    execution_id: ExecutionId,
    id: TaskInstanceId,
    task_id: &str,
    state: TaskState,
) -> TaskStatusRecord {
    TaskStatusRecord {
        task_instance_id: id,
        task_id: task_id.to_owned(),
        parent_task_instance_id: None,
        subtask_group_id: None,
        resumed_after_subtasks_group_id: None,
        continues_task_instance_id: None,
        correlation_id: execution_id,
        run_number: 1,
        attempt: 1,
        state,
        worker_id: None,
        created_at_ms: 1_000,
        dispatched_at_ms: None,
        started_at_ms: None,
        ended_at_ms: None,
        output: None,
        error: None,
        earlier_attempts: Vec::new(),
        validation: Vec::new(),
    }
}

fn execution_row(execution_id: ExecutionId, name: &str, last_sequence: u64) -> ExecutionRow {
    let mut counts = StateCounts::default();
    counts.0[0] = 2;
    counts.0[7] = 3;
    ExecutionRow {
        execution_id,
        name: name.to_owned(),
        state: ExecutionState::Running,
        run_number: 1,
        created_at_ms: 1_000,
        started_at_ms: Some(1_000),
        ended_at_ms: None,
        reason: String::new(),
        idempotency_key: "key-1".to_owned(),
        namespace: "team-a".to_owned(),
        labels: BTreeMap::from([("team".to_owned(), "infra".to_owned())]),
        last_sequence,
        usage: Usage {
            tokens_used: 42,
            cost: 1.25,
        },
        progress: ProgressRow {
            counts,
            total: 5,
            done: 3,
            percent: 60.0,
            wave: 2,
            waves: 3,
        },
    }
}

async fn read_model_writes_are_idempotent_and_queryable(store: TestStore) -> anyhow::Result<()> {
    let execution_id = ExecutionId(Uuid::now_v7());
    let group = GroupId(Uuid::now_v7());
    let parent = TaskInstanceId(Uuid::now_v7());
    let mut records = vec![record(
        execution_id,
        parent,
        "fan",
        TaskState::WaitingForSubtasks,
    )];
    for n in 0..5 {
        let mut member = record(
            execution_id,
            TaskInstanceId(Uuid::now_v7()),
            "noop",
            if n < 3 {
                TaskState::Completed
            } else {
                TaskState::Running
            },
        );
        member.parent_task_instance_id = Some(parent);
        member.subtask_group_id = Some(group);
        member.worker_id = Some(WorkerId("worker-1".to_owned()));
        member.output = (n < 3).then(|| serde_json::json!({ "n": n, "list": [1.5, "x"] }));
        member.dispatched_at_ms = Some(1_050);
        member.started_at_ms = Some(1_100);
        if n == 1 {
            member.attempt = 2;
            member.earlier_attempts = vec![AttemptRecord {
                attempt: 1,
                worker_id: Some(WorkerId("worker-0".to_owned())),
                dispatched_at_ms: Some(1_010),
                started_at_ms: None,
                ended_at_ms: 1_040,
                error: "its worker was lost".to_owned(),
                validation: Vec::new(),
            }];
        }
        records.push(member);
    }
    let question_id = QuestionId(Uuid::now_v7());
    let batch = ReadModelBatch {
        executions: vec![ExecutionWrite::Row(Box::new(execution_row(
            execution_id,
            "plan",
            9,
        )))],
        instances: records.clone(),
        events: (1..=9)
            .map(|sequence| EventRow {
                execution_id,
                sequence,
                at_ms: 1_000 + sequence,
                kind: "task_started",
                task_instance_id: Some(parent),
                payload: vec![sequence as u8; 3],
            })
            .collect(),
        questions_asked: vec![QuestionRow {
            execution_id,
            task_instance_id: parent,
            task_id: "fan".to_owned(),
            attempt: 1,
            question: Question {
                id: question_id,
                question_type: "approval".to_owned(),
                priority: "high".to_owned(),
                text: "ship it?".to_owned(),
                options: vec!["yes".to_owned(), "no".to_owned()],
                expires_at_ms: Some(9_000),
                timeout_action: TimeoutAction::Answer("no".to_owned()),
            },
            asked_at_ms: 1_005,
        }],
        questions_resolved: Vec::new(),
    };
    store.store.write_read_model(&batch).await?;
    // A redelivered batch changes nothing.
    store.store.write_read_model(&batch).await?;
    assert_eq!(store.count("events").await?, 9);
    assert_eq!(store.count("task_instances").await?, 6);

    let stored = store
        .store
        .get_execution(execution_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("execution not stored"))?;
    assert_eq!(stored, execution_row(execution_id, "plan", 9));
    let open = store.store.open_questions(execution_id).await?;
    assert_eq!(open.len(), 1);
    assert_eq!(open[0], batch.questions_asked[0]);

    // An older write of the execution never goes back; a newer one moves on.
    let mut older = execution_row(execution_id, "plan", 5);
    older.state = ExecutionState::Paused;
    let mut newer = execution_row(execution_id, "plan", 12);
    newer.state = ExecutionState::Completed;
    newer.ended_at_ms = Some(2_000);
    newer.labels.clear();
    let mut done = records[5].clone();
    done.state = TaskState::Completed;
    done.ended_at_ms = Some(1_900);
    store
        .store
        .write_read_model(&ReadModelBatch {
            executions: vec![ExecutionWrite::Row(Box::new(older))],
            ..ReadModelBatch::default()
        })
        .await?;
    store
        .store
        .write_read_model(&ReadModelBatch {
            executions: vec![ExecutionWrite::Row(Box::new(newer.clone()))],
            instances: vec![done.clone()],
            questions_resolved: vec![QuestionResolved {
                question_id,
                resolution: Resolution::Answered("yes".to_owned()),
                at_ms: 1_950,
            }],
            ..ReadModelBatch::default()
        })
        .await?;
    let stored = store.store.get_execution(execution_id).await?;
    assert_eq!(
        stored.as_ref().map(|row| row.state),
        Some(ExecutionState::Completed)
    );
    assert_eq!(stored.map(|row| row.labels.len()), Some(1));
    assert!(store.store.open_questions(execution_id).await?.is_empty());

    let query = |page: Page<TaskInstanceId>| TaskInstanceQuery {
        execution_id,
        run_number: None,
        states: Vec::new(),
        task_id: None,
        parent_task_instance_id: None,
        subtask_group_id: None,
        task_instance_ids: Vec::new(),
        page,
    };
    let all = store
        .store
        .query_task_instances(&query(Page {
            after: None,
            limit: 100,
        }))
        .await?;
    let mut expected = records.clone();
    expected[5] = done;
    expected.sort_by_key(|record| record.task_instance_id);
    assert_eq!(all, expected);

    let members = store
        .store
        .query_task_instances(&TaskInstanceQuery {
            subtask_group_id: Some(group),
            states: vec![TaskState::Running, TaskState::Completed],
            ..query(Page {
                after: Some(expected[1].task_instance_id),
                limit: 2,
            })
        })
        .await?;
    assert_eq!(
        members,
        expected[2..4].to_vec(),
        "page after the first member, two at most"
    );
    let running = store
        .store
        .query_task_instances(&TaskInstanceQuery {
            states: vec![TaskState::Running],
            parent_task_instance_id: Some(parent),
            task_id: Some("noop".to_owned()),
            run_number: Some(1),
            ..query(Page {
                after: None,
                limit: 10,
            })
        })
        .await?;
    assert_eq!(running.len(), 1);
    let picked = store
        .store
        .query_task_instances(&TaskInstanceQuery {
            task_instance_ids: vec![parent, TaskInstanceId(Uuid::now_v7())],
            ..query(Page {
                after: None,
                limit: 10,
            })
        })
        .await?;
    assert_eq!(picked.len(), 1);
    let other_run = store
        .store
        .query_task_instances(&TaskInstanceQuery {
            run_number: Some(2),
            ..query(Page {
                after: None,
                limit: 10,
            })
        })
        .await?;
    assert!(other_run.is_empty());

    // Sequence-only writes create a placeholder, then only move the sequence.
    let unknown = ExecutionId(Uuid::now_v7());
    for last_sequence in [4, 3, 7] {
        store
            .store
            .write_read_model(&ReadModelBatch {
                executions: vec![ExecutionWrite::Sequence {
                    execution_id: unknown,
                    last_sequence,
                    first_event_at_ms: 1_234,
                }],
                ..ReadModelBatch::default()
            })
            .await?;
    }
    let sequences = store
        .store
        .last_sequences(&[execution_id, unknown, ExecutionId(Uuid::now_v7())])
        .await?;
    assert_eq!(sequences.len(), 2);
    assert_eq!(sequences.get(&execution_id), Some(&12));
    assert_eq!(sequences.get(&unknown), Some(&7));

    let worker = WorkerRow {
        worker_id: "worker-1".to_owned(),
        host: "host".to_owned(),
        queues: vec!["noop".to_owned()],
        slots: 4,
        state: "idle",
        running_tasks: 0,
        memory_bytes: 1 << 20,
        cpu_percent: 1.5,
        interval_ms: 2_000,
        first_seen_at_ms: 1_000,
        last_heartbeat_at_ms: 1_000,
        new_heartbeats: 3,
        last_heartbeat: vec![1, 2, 3],
    };
    store
        .store
        .upsert_workers(std::slice::from_ref(&worker))
        .await?;
    store
        .store
        .upsert_workers(&[WorkerRow {
            state: "running",
            new_heartbeats: 2,
            ..worker
        }])
        .await?;
    assert_eq!(store.count("workers").await?, 1);
    Ok(())
}

/// A question is withdrawn, with no event of its own, when the instance that asked it is
/// cancelled: a group settled without the member, or the execution ended. It is then not open.
async fn a_question_whose_asker_is_cancelled_is_not_open(store: TestStore) -> anyhow::Result<()> {
    let execution_id = ExecutionId(Uuid::now_v7());
    let asker = TaskInstanceId(Uuid::now_v7());
    let other = TaskInstanceId(Uuid::now_v7());
    let question = |asked_by: TaskInstanceId| QuestionRow {
        execution_id,
        task_instance_id: asked_by,
        task_id: "review".to_owned(),
        attempt: 1,
        question: Question {
            id: QuestionId(Uuid::now_v7()),
            question_type: "approval".to_owned(),
            priority: "low".to_owned(),
            text: "ok?".to_owned(),
            options: Vec::new(),
            expires_at_ms: None,
            timeout_action: TimeoutAction::Fail,
        },
        asked_at_ms: 1_005,
    };
    let asked = vec![question(asker), question(other)];
    let waiting = |id| record(execution_id, id, "review", TaskState::WaitingForHuman);
    store
        .store
        .write_read_model(&ReadModelBatch {
            executions: vec![ExecutionWrite::Row(Box::new(execution_row(
                execution_id,
                "plan",
                4,
            )))],
            instances: vec![waiting(asker), waiting(other)],
            questions_asked: asked.clone(),
            ..ReadModelBatch::default()
        })
        .await?;
    assert_eq!(store.store.open_questions(execution_id).await?, asked);

    let mut cancelled = waiting(asker);
    cancelled.state = TaskState::Cancelled;
    cancelled.ended_at_ms = Some(1_500);
    store
        .store
        .write_read_model(&ReadModelBatch {
            instances: vec![cancelled],
            ..ReadModelBatch::default()
        })
        .await?;
    assert_eq!(
        store.store.open_questions(execution_id).await?,
        asked[1..],
        "the cancelled asker's question is withdrawn, the other stays open"
    );
    Ok(())
}

async fn executions_are_listed_by_filters(store: TestStore) -> anyhow::Result<()> {
    let mut ids = Vec::new();
    for (n, name) in ["Alpha build", "beta build", "gamma"].iter().enumerate() {
        let execution_id = ExecutionId(Uuid::now_v7());
        let mut row = execution_row(execution_id, name, 3);
        row.created_at_ms = 1_000 * (n as u64 + 1);
        if n == 2 {
            row.state = ExecutionState::Failed;
            row.labels.insert("env".to_owned(), "prod".to_owned());
            row.namespace = "infra".to_owned();
        }
        store
            .store
            .write_read_model(&ReadModelBatch {
                executions: vec![ExecutionWrite::Row(Box::new(row))],
                ..ReadModelBatch::default()
            })
            .await?;
        ids.push(execution_id);
    }
    let all = ExecutionQuery {
        states: Vec::new(),
        name_contains: String::new(),
        namespace: String::new(),
        labels: BTreeMap::new(),
        created_after_ms: None,
        created_before_ms: None,
        page: Page {
            after: None,
            limit: 10,
        },
    };
    let listed = |rows: Vec<ExecutionRow>| -> Vec<ExecutionId> {
        rows.iter().map(|row| row.execution_id).collect()
    };
    let newest_first: Vec<ExecutionId> = ids.iter().rev().copied().collect();
    assert_eq!(
        listed(store.store.list_executions(&all).await?),
        newest_first
    );
    let page = store
        .store
        .list_executions(&ExecutionQuery {
            page: Page {
                after: Some(ids[2]),
                limit: 1,
            },
            ..all.clone()
        })
        .await?;
    assert_eq!(listed(page), [ids[1]]);
    let builds = ExecutionQuery {
        name_contains: "build".to_owned(),
        ..all.clone()
    };
    assert_eq!(
        listed(store.store.list_executions(&builds).await?),
        [ids[1], ids[0]]
    );
    // Case does not matter: "alpha" finds "Alpha build", "BUILD" both builds.
    let alpha = ExecutionQuery {
        name_contains: "alpha".to_owned(),
        ..all.clone()
    };
    assert_eq!(listed(store.store.list_executions(&alpha).await?), [ids[0]]);
    let shouted = ExecutionQuery {
        name_contains: "BUILD".to_owned(),
        ..all.clone()
    };
    assert_eq!(
        listed(store.store.list_executions(&shouted).await?),
        [ids[1], ids[0]]
    );
    let failed_in_prod = ExecutionQuery {
        states: vec![ExecutionState::Failed],
        labels: BTreeMap::from([
            ("env".to_owned(), "prod".to_owned()),
            ("team".to_owned(), "infra".to_owned()),
        ]),
        ..all.clone()
    };
    let rows = store.store.list_executions(&failed_in_prod).await?;
    assert_eq!(listed(rows.clone()), [ids[2]]);
    assert_eq!(rows[0].labels.len(), 2);
    let infra = ExecutionQuery {
        namespace: "infra".to_owned(),
        ..all.clone()
    };
    assert_eq!(listed(store.store.list_executions(&infra).await?), [ids[2]]);
    let window = ExecutionQuery {
        created_after_ms: Some(2_000),
        created_before_ms: Some(3_000),
        ..all.clone()
    };
    assert_eq!(
        listed(store.store.list_executions(&window).await?),
        [ids[1]]
    );
    Ok(())
}

async fn text_with_nul_characters_is_stored(store: TestStore) -> anyhow::Result<()> {
    let execution_id = ExecutionId(Uuid::now_v7());
    let mut failed = record(
        execution_id,
        TaskInstanceId(Uuid::now_v7()),
        "task\0id",
        TaskState::Failed,
    );
    failed.error = Some("boom\0".to_owned());
    failed.output = Some(serde_json::json!({ "text": "a\u{0}b" }));
    store
        .store
        .write_read_model(&ReadModelBatch {
            executions: vec![ExecutionWrite::Row(Box::new(execution_row(
                execution_id,
                "p\0",
                2,
            )))],
            instances: vec![failed],
            ..ReadModelBatch::default()
        })
        .await?;
    let stored = store
        .store
        .query_task_instances(&TaskInstanceQuery {
            execution_id,
            run_number: None,
            states: vec![TaskState::Failed],
            task_id: None,
            parent_task_instance_id: None,
            subtask_group_id: None,
            task_instance_ids: Vec::new(),
            page: Page {
                after: None,
                limit: 10,
            },
        })
        .await?;
    assert_eq!(stored.len(), 1);
    assert!(
        stored[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("boom"))
    );
    assert_eq!(
        stored[0].output,
        Some(serde_json::json!({ "text": "a\u{0}b" })),
        "JSON escapes NUL, so outputs keep it"
    );
    Ok(())
}

/// A write transaction whose second statement fails: the first statement's work is rolled back
/// and the error says what failed.
async fn a_failed_write_transaction_writes_nothing(store: TestStore) -> anyhow::Result<()> {
    let mut checkpoints = Checkpoints::new();
    let execution_id = checkpoints.execution_id;
    let full_1 = checkpoints.create(&store, None, b"f1").await?;
    let delta_1 = checkpoints.create(&store, Some(full_1), b"d1").await?;
    let full_2 = checkpoints.create(&store, None, b"f2").await?;
    // Ids are deleted newest first, 1,000 to a statement: `full_2` goes with the first statement,
    // and `full_1`, which `delta_1` is built on, with the second, which the database refuses.
    let mut ids = vec![full_2, full_1];
    ids.extend((1..=1_000).map(|n| Uuid::from_u128(full_1.as_u128() + n)));
    assert!(ids[2..].iter().all(|id| *id < full_2));
    let err = store
        .store
        .delete_checkpoints(&ids)
        .await
        .expect_err("deleting a base before its delta is refused");
    assert!(
        err.to_string()
            .starts_with("failed to delete checkpoints: "),
        "{err}"
    );
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition, "{err}");
    let (left, _) = store.store.list(execution_id, None, 100).await?;
    let left: Vec<Uuid> = left.iter().map(|meta| meta.checkpoint_id).collect();
    assert_eq!(left, [full_2, delta_1, full_1]);
    Ok(())
}

/// Task log batches: stored once however often they arrive, read back by stream sequence (not
/// the order they were written in), filtered by instance, attempt and a sequence window, paged.
async fn task_logs_are_kept_once_in_stream_order_and_filtered(
    store: TestStore,
) -> anyhow::Result<()> {
    let execution_id = ExecutionId(Uuid::now_v7());
    let other_execution = ExecutionId(Uuid::now_v7());
    let (a, b) = (
        TaskInstanceId(Uuid::now_v7()),
        TaskInstanceId(Uuid::now_v7()),
    );
    let row =
        |execution_id, stream_sequence, task_instance_id, attempt: u32, batch: u64| LogBatchRow {
            execution_id,
            stream_sequence,
            task_instance_id,
            attempt,
            batch,
            worker_id: format!("worker-{attempt}\0"),
            lines: 2,
            payload: format!("payload {stream_sequence}").into_bytes(),
        };
    let rows = vec![
        row(execution_id, 7, a, 2, 1),
        row(execution_id, 3, a, 1, 1),
        row(execution_id, 5, b, 1, 1),
        row(other_execution, 4, a, 1, 1),
        row(execution_id, 9, a, 2, 2),
    ];
    store.store.insert_task_logs(&rows).await?;
    // Delivered again (a new leader, a lost acknowledgement): nothing changes.
    store.store.insert_task_logs(&rows[..2]).await?;
    store.store.insert_task_logs(&[]).await?;
    let all = LogQuery {
        execution_id,
        task_instance_id: None,
        attempt: None,
        after_sequence: 0,
        before_sequence: None,
        limit: 100,
    };
    let sequences = |rows: Vec<LogBatchRow>| -> Vec<u64> {
        rows.iter().map(|row| row.stream_sequence).collect()
    };
    let read = store.store.task_logs(&all).await?;
    assert_eq!(sequences(read.clone()), [3, 5, 7, 9]);
    let expected = {
        let mut stored = rows[1].clone();
        stored.worker_id = "worker-1\u{fffd}".to_owned();
        stored
    };
    assert!(
        read[0] == expected || read[0] == rows[1],
        "a row reads back as written (PostgreSQL replaces NUL): {:?}",
        read[0]
    );
    let instance_a = LogQuery {
        task_instance_id: Some(a),
        ..all.clone()
    };
    assert_eq!(
        sequences(store.store.task_logs(&instance_a).await?),
        [3, 7, 9]
    );
    let second_attempt = LogQuery {
        attempt: Some(2),
        ..instance_a.clone()
    };
    assert_eq!(
        sequences(store.store.task_logs(&second_attempt).await?),
        [7, 9]
    );
    let window = LogQuery {
        after_sequence: 3,
        before_sequence: Some(9),
        ..all.clone()
    };
    assert_eq!(sequences(store.store.task_logs(&window).await?), [5, 7]);
    let page = LogQuery {
        limit: 2,
        ..all.clone()
    };
    assert_eq!(sequences(store.store.task_logs(&page).await?), [3, 5]);
    let next = LogQuery {
        after_sequence: 5,
        ..page
    };
    assert_eq!(sequences(store.store.task_logs(&next).await?), [7, 9]);
    let unknown = LogQuery {
        execution_id: ExecutionId(Uuid::now_v7()),
        ..all
    };
    assert!(store.store.task_logs(&unknown).await?.is_empty());
    Ok(())
}
