//! Long tasks across a coordinator's death, and poison tasks, against separate processes: a
//! coordinator, two workers, a real NATS and PostgreSQL.
//!
//! The task stream is created with a one-second de-duplication window instead of two minutes, so
//! a task of a few seconds reaches past it: a restarted coordinator that sent the running task
//! again would have it run twice, as a 150 s task did with the two-minute window. Each `shell`
//! task appends a line to a marks file when it starts (with its worker's pid), so the test
//! counts the runs the workers really made, not what the log says.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use trellis_proto::v1::{self, event::Kind};

use crate::system::{Options, System, describe, is_terminal};

/// How long each scenario may take.
const WAIT: Duration = Duration::from_secs(90);

/// The de-duplication window of the task stream in these tests.
const WINDOW: Duration = Duration::from_secs(1);

/// A plan of one `shell` task that marks its start (`start <worker pid>`), sleeps `seconds`, then
/// marks its end.
fn long_task_plan(name: &str, marks: &Path, seconds: u32) -> String {
    let marks = marks.display();
    format!(
        "name: {name}\ntasks:\n\
         - id: long\n  type: shell\n  input:\n    command: [sh, -c, 'echo \"start $PPID\" >> {marks}; sleep {seconds}; echo end >> {marks}']\n"
    )
}

/// The worker pids of the `start` lines of the marks file, in order.
fn starts(marks: &Path) -> Vec<u32> {
    std::fs::read_to_string(marks)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("start ")?.trim().parse().ok())
        .collect()
}

/// Waits until the marks file holds `n` starts; returns their worker pids.
async fn wait_for_starts(marks: &Path, n: usize) -> anyhow::Result<Vec<u32>> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = starts(marks);
        if seen.len() >= n {
            return Ok(seen);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{n} task starts expected within {WAIT:?}, saw {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn marks_file() -> anyhow::Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::Builder::new()
        .prefix("trellis-marks-")
        .tempdir()
        .context("cannot create the marks directory")?;
    let marks = dir.path().join("marks");
    Ok((dir, marks))
}

fn count(events: &[v1::Event], kind: impl Fn(&Kind) -> bool) -> usize {
    events
        .iter()
        .filter(|e| e.kind.as_ref().is_some_and(&kind))
        .count()
}

fn dispatched_attempts(events: &[v1::Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::TaskDispatched(d)) => Some(d.attempt),
            _ => None,
        })
        .collect()
}

/// Waits for the execution to end, and checks it completed.
async fn wait_for_completion(system: &System, id: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let execution = system
        .wait_until(0, id, deadline, "the end of the execution", is_terminal)
        .await?;
    ensure!(
        execution.state == v1::ExecutionState::Completed as i32,
        "the execution did not complete: {}",
        describe(&execution)
    );
    Ok(())
}

async fn start_system() -> anyhow::Result<System> {
    System::start(Options {
        coordinators: vec!["coordinator-a"],
        workers: 2,
        tasks_duplicate_window: Some(WINDOW),
        ..Options::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_task_is_adopted_not_run_again_when_its_coordinator_restarts()
-> anyhow::Result<()> {
    let (_dir, marks) = marks_file()?;
    let system = start_system().await?;
    system
        .run(async |system: &mut System| {
            let id = system
                .start_plan(0, &long_task_plan("adopted", &marks, 8))
                .await?;
            wait_for_starts(&marks, 1).await?;
            // Past the de-duplication window, then the coordinator dies and comes back while the
            // task runs on its worker.
            tokio::time::sleep(WINDOW + Duration::from_millis(500)).await;
            system.inject(crate::system::Fault::Coordinator(0)).await?;
            wait_for_completion(system, &id).await?;
            let runs = starts(&marks);
            ensure!(
                runs.len() == 1,
                "the task ran {} times (worker pids {runs:?}); the restarted coordinator sent it again",
                runs.len()
            );
            let events = system.event_log(&id).await?;
            ensure!(
                dispatched_attempts(&events) == [1],
                "dispatches {:?}: the running attempt was to be adopted",
                dispatched_attempts(&events)
            );
            ensure!(count(&events, |k| matches!(k, Kind::TaskLost(_))) == 0);
            ensure!(count(&events, |k| matches!(k, Kind::ExecutionClaimed(_))) == 1);
            // ListWorkers counts what the workers did, from their heartbeats.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let workers = system
                    .client(0)?
                    .list_workers(v1::ListWorkersRequest::default())
                    .await?
                    .into_inner()
                    .workers;
                let done: u64 = workers.iter().map(|w| w.tasks_completed).sum();
                let failed: u64 = workers.iter().map(|w| w.tasks_failed).sum();
                if (done, failed) == (1, 0) {
                    break;
                }
                ensure!(
                    tokio::time::Instant::now() < deadline && done <= 1 && failed == 0,
                    "ListWorkers counts {done} completed and {failed} failed, expected 1 and 0"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(())
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_worker_died_with_the_coordinator_runs_again_once_under_the_new_epoch()
-> anyhow::Result<()> {
    let (_dir, marks) = marks_file()?;
    let system = start_system().await?;
    system
        .run(async |system: &mut System| {
            let id = system
                .start_plan(0, &long_task_plan("lapsed", &marks, 6))
                .await?;
            let first = wait_for_starts(&marks, 1).await?[0];
            tokio::time::sleep(WINDOW + Duration::from_millis(500)).await;
            // The worker running it dies for good, and the coordinator with it.
            let runner = system
                .workers
                .iter()
                .position(|worker| worker.pid() == Some(first))
                .with_context(|| format!("no worker has pid {first}"))?;
            system.workers[runner].kill9()?;
            system.inject(crate::system::Fault::Coordinator(0)).await?;
            wait_for_completion(system, &id).await?;
            // Once on the dead worker, once on the other: the former owner's message, handed to
            // the survivor by JetStream when the dead worker's ack wait ran out, was refused.
            let runs = starts(&marks);
            ensure!(
                runs.len() == 2 && runs[1] != first,
                "runs on worker pids {runs:?}: expected the killed run and one more on the other worker"
            );
            let events = system.event_log(&id).await?;
            ensure!(
                dispatched_attempts(&events) == [1, 2],
                "dispatches {:?}: the lost attempt was to run again as attempt 2",
                dispatched_attempts(&events)
            );
            ensure!(
                count(&events, |k| matches!(k, Kind::TaskLost(l) if l.attempt == 1)) == 1,
                "attempt 1 was to be recorded lost once"
            );
            Ok(())
        })
        .await
}

/// Restarts every worker that died; returns how many were.
async fn revive_workers(system: &mut System) -> anyhow::Result<usize> {
    let mut revived = 0;
    for idx in 0..system.workers.len() {
        if !system.workers[idx].is_running() {
            system.workers[idx].restart().await?;
            system.wait_for_heartbeat(idx).await?;
            revived += 1;
        }
    }
    Ok(revived)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_kills_every_worker_it_lands_on_fails_after_max_deliveries()
-> anyhow::Result<()> {
    const MAX_DELIVERIES: usize = 2;
    let (_dir, marks) = marks_file()?;
    let system = System::start(Options {
        coordinators: vec!["coordinator-a"],
        workers: 2,
        worker_flags: vec![("--max-deliveries", MAX_DELIVERIES.to_string())],
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let marks_shown = marks.display();
            let yaml = format!(
                "name: poison\ntasks:\n\
                 - id: poison\n  type: shell\n  on_failure: [abort]\n  input:\n    command: [sh, -c, 'echo \"start $PPID\" >> {marks_shown}; kill -9 $PPID']\n"
            );
            let id = system.start_plan(0, &yaml).await?;
            let deadline = tokio::time::Instant::now() + WAIT;
            let mut client = system.client(0)?;
            let execution = loop {
                revive_workers(system).await?;
                let execution = client
                    .get_execution(v1::GetExecutionRequest {
                        execution_id: id.clone(),
                    })
                    .await?
                    .into_inner()
                    .execution
                    .context("GetExecution answered without an execution")?;
                if is_terminal(&execution) {
                    break execution;
                }
                if tokio::time::Instant::now() >= deadline {
                    bail!(
                        "the poison task still runs after {WAIT:?}: {} (runs: {:?})",
                        describe(&execution),
                        starts(&marks)
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            ensure!(
                execution.state == v1::ExecutionState::Failed as i32,
                "the execution did not fail: {}",
                describe(&execution)
            );
            let runs = starts(&marks);
            ensure!(
                runs.len() == MAX_DELIVERIES,
                "the poison task ran {} times (worker pids {runs:?}), expected {MAX_DELIVERIES}",
                runs.len()
            );
            let events = system.event_log(&id).await?;
            let reason = format!("worker lost {MAX_DELIVERIES} times");
            ensure!(
                count(&events, |k| matches!(k, Kind::TaskFailed(f) if f.error == reason)) == 1,
                "no task_failed saying {reason:?}"
            );
            let metrics = reqwest::get(format!("http://{}/metrics", system.coordinators[0].admin))
                .await?
                .text()
                .await?;
            let lost: f64 = metrics
                .lines()
                .filter(|line| line.starts_with("trellis_tasks_lost_total{"))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            // The attempt that failed was lost; so was each earlier one found lost after its
            // worker died (an offered attempt has no message to bring back).
            let expected = 1 + count(&events, |k| matches!(k, Kind::TaskLost(_)));
            ensure!(
                lost == expected as f64,
                "trellis_tasks_lost counts {lost}, expected {expected}:\n{}",
                metrics
                    .lines()
                    .filter(|line| line.contains("tasks_lost"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            Ok(())
        })
        .await
}
