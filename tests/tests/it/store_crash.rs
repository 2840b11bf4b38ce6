//! The store crashes: PostgreSQL's postmaster and then the checkpoint-store are SIGKILLed while
//! an execution runs. Afterwards nothing is lost or doubled in the run, the read model equals the
//! log (every event once, every task instance in its final state), and the latest checkpoint
//! restores to the state the log gives at its sequence.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use trellis_coordinator::turn::LogMessage;
use trellis_coordinator::{checkpoints, recovery};
use trellis_core::ids::ExecutionId;
use trellis_proto::v1;

use crate::system::{Ended, FanoutPlan, Fault, Options, System};

/// Four groups of 250 subtasks of 400 ms: several seconds of work for two workers, long enough
/// for both faults to land while it runs.
const PLAN: FanoutPlan = FanoutPlan {
    parents: 4,
    members: 250,
    member_ms: 400,
};

/// The faults, each once the given fraction of the work completed.
const FAULTS: [(Fault, f64); 2] = [(Fault::PostgresKilled, 0.25), (Fault::Store, 0.55)];

/// How long the run, and then the read model's catching up, may take.
const WAIT: Duration = Duration::from_secs(120);

/// The coordinator's checkpoint interval: a new execution's first checkpoint is due one
/// interval after its start (the default is 10 s, longer than this run), so the run is
/// checkpointed several times, before and after each fault.
const CHECKPOINT_EVERY: &str = "1s";

/// Every message of an execution's log, as recovery reads it.
async fn log_messages(system: &System, id: &str) -> anyhow::Result<Vec<LogMessage>> {
    use prost::Message as _;
    let mut messages = Vec::new();
    for (stream_seq, payload) in system.raw_log(id).await? {
        let batch = v1::EventBatch::decode(payload.as_ref())?;
        messages.push(LogMessage {
            stream_seq,
            first_seq: batch.events.first().map_or(0, |e| e.sequence),
            payload,
        });
    }
    Ok(messages)
}

/// Runs `sql` against the checkpoint-store's database.
fn query(system: &System, sql: &str) -> anyhow::Result<String> {
    system.postgres.query("trellis", sql)
}

/// Waits until the read model holds the log's last event sequence.
async fn wait_for_read_model(system: &System, id: &str, last: u64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = query(
            system,
            &format!("SELECT coalesce(max(sequence), 0) FROM events WHERE execution_id = '{id}'"),
        )
        .unwrap_or_default();
        if seen.trim() == last.to_string() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("the read model did not reach sequence {last} within {WAIT:?}: it holds {seen}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_postgres_and_the_store_are_killed_the_read_model_and_checkpoints_match_the_log()
-> anyhow::Result<()> {
    let system = System::start(Options {
        coordinators: vec!["coordinator-a"],
        workers: 2,
        coordinator_env: vec![("TRELLIS_CHECKPOINT_EVERY", CHECKPOINT_EVERY.to_owned())],
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let deadline = tokio::time::Instant::now() + WAIT;
            let execution_id = system.start_plan(0, &PLAN.yaml()).await?;
            system
                .inject_in_turn(&execution_id, &PLAN, &FAULTS, deadline)
                .await?;
            let Ended { graph, events, .. } = system
                .check_end(0, &execution_id, &PLAN, deadline)
                .await?;

            // The read model equals the log: every event once, nothing else.
            let last = events.last().map_or(0, |e| e.sequence);
            wait_for_read_model(system, &execution_id, last).await?;
            let counts = query(
                system,
                &format!(
                    "SELECT count(*), count(DISTINCT sequence), min(sequence), max(sequence) \
                     FROM events WHERE execution_id = '{execution_id}'"
                ),
            )?;
            ensure!(
                counts.trim() == format!("{last}|{last}|1|{last}"),
                "the read model's events (count|distinct|min|max) are {}, the log has 1..={last}",
                counts.trim()
            );

            // Every task instance of the graph, in its final state and attempt, and no other.
            let rows = query(
                system,
                &format!(
                    "SELECT task_instance_id, state, attempt FROM task_instances \
                     WHERE execution_id = '{execution_id}'"
                ),
            )?;
            let stored: BTreeMap<String, (String, u32)> = rows
                .lines()
                .filter_map(|line| {
                    let mut fields = line.split('|');
                    let id = fields.next()?.to_owned();
                    let state = fields.next()?.to_owned();
                    let attempt = fields.next()?.parse().ok()?;
                    Some((id, (state, attempt)))
                })
                .collect();
            let live: BTreeMap<String, (String, u32)> = graph
                .nodes
                .iter()
                .filter_map(|node| node.record.as_ref())
                .filter(|record| !record.task_instance_id.is_empty())
                .map(|record| {
                    let state = v1::TaskState::try_from(record.state)
                        .map(|s| s.as_str_name().trim_start_matches("TASK_STATE_").to_lowercase())
                        .unwrap_or_default();
                    (record.task_instance_id.clone(), (state, record.attempt))
                })
                .collect();
            let differing: Vec<String> = live
                .iter()
                .filter(|(id, value)| stored.get(*id) != Some(value))
                .map(|(id, value)| format!("{id}: live {value:?}, read model {:?}", stored.get(id)))
                .chain(
                    stored
                        .keys()
                        .filter(|id| !live.contains_key(*id))
                        .map(|id| format!("{id}: only in the read model")),
                )
                .collect();
            ensure!(
                // The members, each parent and its resumed instance, and the root record.
                differing.is_empty() && live.len() == PLAN.n_members() + 2 * PLAN.parents + 1,
                "the read model's {} task instances differ from the graph's {} ({} differ), first: {:?}",
                stored.len(),
                live.len(),
                differing.len(),
                differing.iter().take(5).collect::<Vec<_>>()
            );

            // The latest checkpoint restores to the state the log gives at its sequence.
            let id: ExecutionId = execution_id.parse().context("not an execution id")?;
            let messages = log_messages(system, &execution_id).await?;
            let first = messages.first().context("the log is empty")?;
            let (started, plan) = recovery::started_of(id, first)?;
            let mut store = v1::checkpoint_store_client::CheckpointStoreClient::connect(format!(
                "http://{}",
                system.store_addr
            ))
            .await?;
            let restore = store
                .restore_checkpoint(v1::RestoreCheckpointRequest {
                    execution_id: execution_id.clone(),
                    checkpoint_id: String::new(),
                })
                .await
                .context("RestoreCheckpoint of the latest checkpoint failed")?
                .into_inner();
            ensure!(
                restore.corrupt.is_empty(),
                "corrupt checkpoints: {:?}",
                restore.corrupt
            );
            let restored = checkpoints::restore_chain(id, &started, plan.clone(), &restore.chain)
                .map_err(anyhow::Error::msg)?;
            let until: Vec<LogMessage> = messages
                .into_iter()
                .filter(|m| m.stream_seq <= restored.stream_sequence)
                .collect();
            let until_seq = until.last().map_or(0, |m| m.stream_seq);
            let replayed = recovery::replay(id, started, plan, None, until, until_seq)?;
            ensure!(
                replayed.seq == restored.sequence,
                "the checkpoint is at sequence {}, the log up to its stream sequence {} ends at {}",
                restored.sequence,
                restored.stream_sequence,
                replayed.seq
            );
            ensure!(
                replayed.machine == restored.machine,
                "the checkpoint at sequence {} does not restore to the log's state there",
                restored.sequence
            );
            eprintln!(
                "latest checkpoint: sequence {} of {last} ({} deltas), equal to the replay",
                restored.sequence, restored.deltas
            );
            Ok(())
        })
        .await
}
