//! `trellis workers`: the workers the coordinator knows from their heartbeats.

use std::io::{self, BufWriter, Write};

use clap::Args;
use serde_json::{Value, json};
use trellis_proto::v1::{ListWorkersRequest, WorkerInfo};

use super::Failure;
use crate::client::Coordinator;
use crate::render;

/// List the workers the coordinator knows: state, queues, busy slots, missed heartbeats.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis workers\n  \
    trellis workers --queue shell --all\n  \
    trellis workers --json | jq '.workers[] | select(.missed_heartbeats > 0)'")]
pub struct WorkersArgs {
    /// Only workers consuming this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Include workers that stopped or were declared dead.
    #[arg(long)]
    pub all: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `trellis workers`.
pub async fn run(coordinator_url: &str, args: WorkersArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let workers = coordinator
        .client
        .list_workers(ListWorkersRequest {
            queue: args.queue.unwrap_or_default(),
            include_terminated: args.all,
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, "list of workers"))?
        .into_inner()
        .workers;
    let mut out = BufWriter::new(io::stdout().lock());
    if args.json {
        let items: Vec<Value> = workers.iter().map(worker_json).collect();
        writeln!(out, "{}", json!({"workers": items}))?;
    } else if workers.is_empty() {
        writeln!(out, "no workers: start some with `trellis dev`")?;
    } else {
        out.write_all(workers_table(&workers).as_bytes())?;
    }
    Ok(out.flush()?)
}

fn worker_json(worker: &WorkerInfo) -> Value {
    let beat = worker.last_heartbeat.clone().unwrap_or_default();
    let running: Vec<Value> = beat
        .running
        .iter()
        .map(|task| {
            json!({
                "execution_id": task.execution_id,
                "task_instance_id": task.task_instance_id,
                "attempt": task.attempt,
                "progress_percent": task.progress_percent,
                "current_step": task.current_step,
                "started_at_unix_ms": task.started_at_unix_ms,
            })
        })
        .collect();
    json!({
        "worker_id": worker.worker_id,
        "state": render::worker_state_name(worker.state),
        "host": beat.host,
        "queues": beat.queues,
        "slots": beat.slots,
        "running": running,
        "memory_bytes": beat.memory_bytes,
        "cpu_percent": beat.cpu_percent,
        "last_heartbeat_unix_ms": beat.sent_at_unix_ms,
        "first_seen_at_unix_ms": worker.first_seen_at_unix_ms,
        "missed_heartbeats": worker.missed_heartbeats,
        "tasks_completed": worker.tasks_completed,
        "tasks_failed": worker.tasks_failed,
    })
}

fn workers_table(workers: &[WorkerInfo]) -> String {
    let header = [
        "WORKER",
        "STATE",
        "BUSY",
        "MISSED",
        "DONE",
        "FAILED",
        "LAST SEEN",
        "HOST",
        "QUEUES",
    ]
    .map(str::to_owned);
    let rows: Vec<[String; 9]> = workers
        .iter()
        .map(|worker| {
            let beat = worker.last_heartbeat.clone().unwrap_or_default();
            [
                worker.worker_id.clone(),
                render::worker_state_name(worker.state),
                format!("{}/{}", beat.running.len(), beat.slots),
                worker.missed_heartbeats.to_string(),
                worker.tasks_completed.to_string(),
                worker.tasks_failed.to_string(),
                render::format_time(beat.sent_at_unix_ms),
                beat.host,
                beat.queues.join(","),
            ]
        })
        .collect();
    render::table(&header, &rows)
}

#[cfg(test)]
mod tests {
    use trellis_proto::v1::{RunningTask, WorkerHeartbeat, WorkerState};

    use super::*;

    #[test]
    fn table_shows_busy_slots() {
        let worker = WorkerInfo {
            worker_id: "w-1".to_owned(),
            state: WorkerState::Running as i32,
            last_heartbeat: Some(WorkerHeartbeat {
                host: "node-a".to_owned(),
                queues: vec!["shell".to_owned(), "noop".to_owned()],
                slots: 4,
                running: vec![RunningTask::default()],
                sent_at_unix_ms: 1_793_628_187_000,
                ..WorkerHeartbeat::default()
            }),
            tasks_completed: 12,
            ..WorkerInfo::default()
        };
        assert_eq!(
            workers_table(std::slice::from_ref(&worker)),
            "WORKER  STATE    BUSY  MISSED  DONE  FAILED  LAST SEEN             HOST    QUEUES\n\
             w-1     running  1/4   0       12    0       2026-11-02 14:03:07Z  node-a  shell,noop\n"
        );
        assert_eq!(worker_json(&worker)["queues"], json!(["shell", "noop"]));
    }
}
