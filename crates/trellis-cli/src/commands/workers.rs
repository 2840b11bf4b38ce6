//! `trellis workers`: the workers the coordinator knows from their heartbeats.

use std::io::{self, BufWriter, Write};

use clap::Args;
use serde_json::{Value, json};
use trellis_proto::v1::{BreakerState, CircuitBreaker, ListWorkersRequest, WorkerInfo};

use super::Failure;
use crate::client::Coordinator;
use crate::render;

/// List the workers the coordinator knows (state, queues, busy slots, missed heartbeats), and
/// its circuit breakers that are open or counting failures.
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
    let answer = coordinator
        .client
        .list_workers(ListWorkersRequest {
            queue: args.queue.unwrap_or_default(),
            include_terminated: args.all,
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, "list of workers"))?
        .into_inner();
    let (workers, breakers) = (answer.workers, answer.breakers);
    let mut out = BufWriter::new(io::stdout().lock());
    if args.json {
        let items: Vec<Value> = workers.iter().map(worker_json).collect();
        let breakers: Vec<Value> = breakers.iter().map(breaker_json).collect();
        writeln!(out, "{}", json!({"workers": items, "breakers": breakers}))?;
        return Ok(out.flush()?);
    }
    if workers.is_empty() {
        writeln!(out, "no workers: start some with `trellis dev`")?;
    } else {
        out.write_all(workers_table(&workers).as_bytes())?;
    }
    if !breakers.is_empty() {
        writeln!(out, "\ncircuit breakers")?;
        out.write_all(breakers_table(&breakers).as_bytes())?;
    }
    Ok(out.flush()?)
}

/// The lowercase name of a breaker state (`half_open`).
fn breaker_json(breaker: &CircuitBreaker) -> Value {
    json!({
        "queue": breaker.queue,
        "task_type": breaker.task_type,
        "state": BreakerState::label_of(breaker.state),
        "consecutive_failures": breaker.consecutive_failures,
        "retry_at_unix_ms": breaker.retry_at_unix_ms,
        "coordinator_id": breaker.coordinator_id,
    })
}

/// The breakers that are not closed, or count failures: a dispatch of their type waits while
/// one is open.
fn breakers_table(breakers: &[CircuitBreaker]) -> String {
    let header = [
        "QUEUE",
        "TYPE",
        "STATE",
        "FAILURES",
        "PROBE AT",
        "COORDINATOR",
    ]
    .map(str::to_owned);
    let rows: Vec<[String; 6]> = breakers
        .iter()
        .map(|breaker| {
            [
                breaker.queue.clone(),
                breaker.task_type.clone(),
                BreakerState::label_of(breaker.state).to_owned(),
                breaker.consecutive_failures.to_string(),
                breaker
                    .retry_at_unix_ms
                    .map_or_else(|| "-".to_owned(), render::format_time),
                breaker.coordinator_id.clone(),
            ]
        })
        .collect();
    render::table(&header, &rows)
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
    fn breakers_show_their_state_and_probe_time() {
        let breaker = CircuitBreaker {
            queue: "shell".to_owned(),
            task_type: "shell".to_owned(),
            state: BreakerState::Open as i32,
            consecutive_failures: 0,
            retry_at_unix_ms: Some(0),
            coordinator_id: "coordinator-1".to_owned(),
        };
        let table = breakers_table(std::slice::from_ref(&breaker));
        assert!(table.contains("shell") && table.contains("open"), "{table}");
        assert_eq!(breaker_json(&breaker)["state"], "open");
        let half = CircuitBreaker {
            state: BreakerState::HalfOpen as i32,
            ..breaker
        };
        assert_eq!(breaker_json(&half)["state"], "half_open");
    }

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
