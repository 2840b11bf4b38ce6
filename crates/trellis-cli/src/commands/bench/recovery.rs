//! The `recovery` scenario: a coordinator SIGKILLed half-way through a plan of `noop` tasks,
//! nested subtask groups and long `shell` tasks, and started again; what it lost, doubled or ran
//! twice, counted from the graph and from the workers' own marks.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tonic::transport::Channel;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::{self, ExecutionState};

use super::processes::{ChildCoordinator, free_port, workers_only};
use super::{BenchArgs, Fields, get, round, start_plan};

/// Groups of groups in the `recovery` plan: each `fanout` plan task spawns this many members,
/// each a `fanout` of this many `sleep` subtasks of [`RECOVERY_SLEEP_MS`], so that the groups
/// are still open at the kill and settle under the restarted coordinator.
const RECOVERY_GROUPS: usize = 4;
const RECOVERY_FANOUT: usize = 10;
const RECOVERY_SLEEP_MS: u64 = 300;
/// Long `shell` tasks in the `recovery` plan, each running this long: they run across the kill,
/// so the restarted coordinator inherits them.
const RECOVERY_LONG_TASKS: usize = 8;
const RECOVERY_LONG_SECONDS: u32 = 5;

/// The coordinator in a child process, killed with SIGKILL half-way through a plan of `n` `noop`
/// tasks, [`RECOVERY_GROUPS`] nested groups and [`RECOVERY_LONG_TASKS`] long `shell` tasks, and
/// started again under the same id (it takes its lease back at once). `recovery_ms` runs from the
/// kill to the first task completed after the restart. From the graph and the workers' own marks:
/// `lost` counts task instances that did not complete, `duplicate_resumes` groups that resumed
/// their parent more than once, `double_runs` long tasks whose command started more than once.
pub(super) async fn recovery(args: &BenchArgs, n: usize) -> Result<Fields, String> {
    let marks = std::env::temp_dir().join(format!("trellis-bench-marks-{}", std::process::id()));
    let _ = std::fs::remove_file(&marks);
    let result = recovery_run(args, n, &marks).await;
    let _ = std::fs::remove_file(&marks);
    result
}

/// The `recovery` plan: `n` `noop` tasks, the nested groups and the long tasks, which append
/// their instance id to `marks` when they start.
fn recovery_plan(n: usize, marks: &std::path::Path) -> String {
    let mut plan = String::with_capacity(n * 32 + 1024);
    plan.push_str("name: bench-recovery\ntasks:\n");
    for i in 0..n {
        plan.push_str(&format!("- {{id: t{i}, type: noop}}\n"));
    }
    for g in 0..RECOVERY_GROUPS {
        plan.push_str(&format!(
            "- {{id: g{g}, type: fanout, input: {{count: {RECOVERY_FANOUT}, child: {{type: fanout, \
             input: {{count: {RECOVERY_FANOUT}, child: {{type: sleep, input: {{ms: {RECOVERY_SLEEP_MS}}}}}}}}}}}}}\n"
        ));
    }
    for l in 0..RECOVERY_LONG_TASKS {
        plan.push_str(&format!(
            "- {{id: long{l}, type: shell, input: {{command: [sh, -c, 'echo \"$TRELLIS_TASK_INSTANCE_ID\" \
             >> {}; sleep {RECOVERY_LONG_SECONDS}']}}}}\n",
            marks.display()
        ));
    }
    plan
}

async fn recovery_run(
    args: &BenchArgs,
    n: usize,
    marks: &std::path::Path,
) -> Result<Fields, String> {
    let local = workers_only(args).await?;
    let port = free_port()?;
    let url = format!("http://{port}");
    let mut coordinator = ChildCoordinator::spawn(&local.nats_url, port).await?;
    let mut client = coordinator.client.clone();
    let nats = async_nats::connect(&local.nats_url)
        .await
        .map_err(|e| format!("cannot connect to NATS: {e}"))?;

    let start = Instant::now();
    let id = start_plan(&mut client, recovery_plan(n, marks)).await?;
    let mut log = nats
        .subscribe(trellis_proto::subjects::events(&id))
        .await
        .map_err(|e| format!("cannot follow the log: {e}"))?;
    // Half-way, by the summary's count of settled work, and while the long tasks run.
    loop {
        let execution = get(&mut client, &id).await?;
        if execution
            .progress
            .as_ref()
            .is_some_and(|p| p.done * 2 >= n as u64)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let running_at_kill = std::fs::read_to_string(marks)
        .map(|text| text.lines().count())
        .unwrap_or(0);
    let resumed_before_kill = resumed_groups(&mut client, &id).await?;
    coordinator.kill();
    let killed = Instant::now();
    // Everything logged before the kill has a sequence at most this.
    let mut last_before = 0;
    while let Some(Some(message)) = futures::FutureExt::now_or_never(log.next()) {
        last_before = last_before.max(batch_last_sequence(&message.payload));
    }
    let mut coordinator = ChildCoordinator::spawn(&local.nats_url, port).await?;
    let recovery_ms = loop {
        let message = tokio::time::timeout(Duration::from_secs(60), log.next())
            .await
            .map_err(|_| "no task completed within 60 s of the restart".to_owned())?
            .ok_or("the log subscription ended")?;
        if first_completion_after(&message.payload, last_before) {
            break killed.elapsed().as_secs_f64() * 1000.0;
        }
    };
    let mut client = CoordinatorClient::connect(url)
        .await
        .map_err(|e| format!("cannot reach the restarted coordinator: {e}"))?;
    loop {
        let execution = get(&mut client, &id).await?;
        match ExecutionState::try_from(execution.state) {
            Ok(ExecutionState::Completed) => break,
            Ok(ExecutionState::Failed | ExecutionState::Cancelled) => {
                return Err(format!("execution {id} ended {}", execution.reason));
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let graph = execution_graph(&mut client, &id).await?;
    let root = graph.root_indices.first().map(|idx| *idx as usize);
    let records: Vec<_> = graph
        .nodes
        .iter()
        .enumerate()
        .filter(|(idx, _)| Some(*idx) != root)
        .filter_map(|(_, node)| node.record.as_ref())
        .collect();
    // Every plan task and subtask instance, each parent's resumed instance included.
    let expected =
        n + RECOVERY_LONG_TASKS + RECOVERY_GROUPS * (2 + RECOVERY_FANOUT * (2 + RECOVERY_FANOUT));
    let completed = records
        .iter()
        .filter(|r| r.state == v1::TaskState::Completed as i32)
        .count();
    let lost = expected.saturating_sub(completed);
    let mut resumed: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for record in &records {
        if let Some(group) = record.resumed_after_subtasks_group_id.as_deref() {
            *resumed.entry(group).or_default() += 1;
        }
    }
    let duplicate_resumes = resumed.values().filter(|&&k| k > 1).count();
    let starts = std::fs::read_to_string(marks).unwrap_or_default();
    let distinct: std::collections::HashSet<&str> = starts.lines().collect();
    let double_runs = starts.lines().count() - distinct.len();
    coordinator.kill();
    local.stop().await;
    if distinct.len() != RECOVERY_LONG_TASKS {
        return Err(format!(
            "{} of {RECOVERY_LONG_TASKS} long tasks started (marks in {})",
            distinct.len(),
            marks.display()
        ));
    }
    Ok(vec![
        ("seconds", json!(round(seconds, 3))),
        ("recovery_ms", json!(round(recovery_ms, 1))),
        ("instances", json!(records.len())),
        ("groups", json!(resumed.len())),
        (
            "groups_open_at_kill",
            json!(resumed.len().saturating_sub(resumed_before_kill)),
        ),
        ("long_running_at_kill", json!(running_at_kill)),
        ("lost", json!(lost)),
        ("duplicate_resumes", json!(duplicate_resumes)),
        ("double_runs", json!(double_runs)),
    ])
}

/// The execution graph of an execution's current run.
async fn execution_graph(
    client: &mut CoordinatorClient<Channel>,
    id: &str,
) -> Result<v1::ExecutionGraph, String> {
    Ok(client
        .get_execution_graph(v1::GetExecutionGraphRequest {
            execution_id: id.to_owned(),
            run_number: 0,
        })
        .await
        .map_err(|s| s.message().to_owned())?
        .into_inner()
        .graph
        .unwrap_or_default())
}

/// How many subtask groups have resumed their parent so far.
async fn resumed_groups(
    client: &mut CoordinatorClient<Channel>,
    id: &str,
) -> Result<usize, String> {
    Ok(execution_graph(client, id)
        .await?
        .nodes
        .iter()
        .filter_map(|node| node.record.as_ref())
        .filter(|record| record.resumed_after_subtasks_group_id.is_some())
        .count())
}

fn batch_last_sequence(payload: &[u8]) -> u64 {
    use prost::Message as _;
    v1::EventBatch::decode(payload)
        .ok()
        .and_then(|b| b.events.last().map(|e| e.sequence))
        .unwrap_or(0)
}

fn first_completion_after(payload: &[u8], after: u64) -> bool {
    use prost::Message as _;
    v1::EventBatch::decode(payload).is_ok_and(|batch| {
        batch.events.iter().any(|e| {
            e.sequence > after && matches!(e.kind, Some(v1::event::Kind::TaskCompleted(_)))
        })
    })
}
