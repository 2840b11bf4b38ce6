//! Pause at every level, in both modes, against separate processes: two coordinators, two
//! workers, a real NATS and PostgreSQL. Each scenario starts an execution whose `steps` task runs
//! five durable steps, pauses it (through the coordinator that did not start it) once a step is
//! recorded, checks that nothing new is dispatched while paused, resumes, and checks the outcome
//! from the event log: in `drain` the running task finished and nothing was preempted; in
//! `preempt` the task stopped mid-way, ran again from its next step after the resume, and every
//! step was recorded exactly once. Last, a worker is drained: it finishes its tasks, takes no
//! new one and exits.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use trellis_proto::v1::{self, event::Kind};

use crate::system::{Options, System, describe};

/// Durable steps of each `steps` task, and how long each takes.
const STEPS: usize = 5;
const STEP_MS: u64 = 300;
/// How long a pause is watched for dispatches that must not happen.
const HELD_FOR: Duration = Duration::from_millis(1500);
/// How long any one thing a scenario waits for may take.
const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Task,
    Group,
    Execution,
    Queue,
    Namespace,
    All,
}

/// `long` runs the durable steps; `after` (one short step, on the same queue) waits for it.
fn chain_plan(name: &str) -> String {
    format!(
        "name: {name}\ntasks:\n\
         - {{id: long, type: steps, input: {{count: {STEPS}, ms: {STEP_MS}}}}}\n\
         - {{id: after, type: steps, input: {{count: 1, ms: 10}}, depends_on: [long]}}\n"
    )
}

/// A group of three `steps` members run one at a time.
fn group_plan(name: &str) -> String {
    format!(
        "name: {name}\noptions: {{max_concurrency: 1}}\ntasks:\n\
         - {{id: fan, type: fanout, input: {{count: 3, child: {{type: steps, input: {{count: {STEPS}, ms: {STEP_MS}}}}}}}}}\n"
    )
}

fn dispatches(events: &[v1::Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e.kind, Some(Kind::TaskDispatched(_))))
        .count()
}

fn preempted(events: &[v1::Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::TaskPreempted(p)) => Some(p.task_instance_id.clone()),
            _ => None,
        })
        .collect()
}

/// The steps recorded per instance, in order.
fn steps(events: &[v1::Event]) -> BTreeMap<String, Vec<String>> {
    let mut steps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for event in events {
        if let Some(Kind::StepCheckpointed(s)) = &event.kind {
            steps
                .entry(s.task_instance_id.clone())
                .or_default()
                .push(s.step.clone());
        }
    }
    steps
}

/// Instances whose attempt completed with a `steps` output (the whole trace).
fn completed_traces(events: &[v1::Event]) -> BTreeMap<String, serde_json::Value> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::TaskCompleted(c)) => {
                let output: serde_json::Value = serde_json::from_slice(&c.output).ok()?;
                Some((c.task_instance_id.clone(), output.get("trace")?.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Reads the event log until `done` holds.
async fn wait_for(
    system: &System,
    id: &str,
    what: &str,
    done: impl Fn(&[v1::Event]) -> bool,
) -> anyhow::Result<Vec<v1::Event>> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let events = system.event_log(id).await?;
        if done(&events) {
            return Ok(events);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{what} did not happen within {WAIT:?} in execution {id}");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

fn fleet_target(level: Level) -> Option<v1::PauseTarget> {
    use v1::pause_target::Target;
    let target = match level {
        Level::Queue => Target::Queue("steps".to_owned()),
        Level::Namespace => Target::Namespace("default".to_owned()),
        Level::All => Target::All(true),
        Level::Task | Level::Group | Level::Execution => return None,
    };
    Some(v1::PauseTarget {
        target: Some(target),
    })
}

/// Pauses or resumes `level` through coordinator 1 (executions start at coordinator 0).
async fn pause(
    system: &System,
    level: Level,
    mode: v1::PauseMode,
    id: &str,
    task: &str,
    group: &str,
    resume: bool,
) -> anyhow::Result<()> {
    let mut client = system.client(1)?;
    let (task_id, group_id) = match level {
        Level::Task => (task.to_owned(), String::new()),
        Level::Group => (String::new(), group.to_owned()),
        _ => (String::new(), String::new()),
    };
    match (fleet_target(level), resume) {
        (Some(target), false) => {
            client
                .pause_fleet(v1::PauseFleetRequest {
                    target: Some(target),
                    mode: mode as i32,
                    reason: format!("{level:?} test"),
                })
                .await?;
        }
        (Some(target), true) => {
            let resumed = client
                .resume_fleet(v1::ResumeFleetRequest {
                    target: Some(target),
                })
                .await?
                .into_inner()
                .resumed;
            ensure!(resumed, "the {level:?} pause was not found to resume");
        }
        (None, false) => {
            client
                .pause_execution(v1::PauseExecutionRequest {
                    execution_id: id.to_owned(),
                    reason: format!("{level:?} test"),
                    task_id,
                    group_id,
                    mode: mode as i32,
                })
                .await?;
        }
        (None, true) => {
            client
                .resume_execution(v1::ResumeExecutionRequest {
                    execution_id: id.to_owned(),
                    task_id,
                    group_id,
                    ..Default::default()
                })
                .await?;
        }
    }
    Ok(())
}

/// One level in one mode, start to end.
async fn scenario(system: &System, level: Level, mode: v1::PauseMode) -> anyhow::Result<()> {
    let name = format!("pause-{level:?}-{}", mode.as_str_name()).to_lowercase();
    let yaml = if level == Level::Group {
        group_plan(&name)
    } else {
        chain_plan(&name)
    };
    let id = system.start_plan(0, &yaml).await?;
    // The first steps task is mid-way: a step recorded, more to come.
    let events = wait_for(system, &id, "a first recorded step", |events| {
        !steps(events).is_empty()
    })
    .await?;
    let group = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::SubtasksSpawned(s)) => s.group.as_ref().map(|g| g.group_id.clone()),
            _ => None,
        })
        .unwrap_or_default();
    // In drain, a task pause is shown on the task that waits; in preempt, on the one running.
    let task = if mode == v1::PauseMode::Drain {
        "after"
    } else {
        "long"
    };
    pause(system, level, mode, &id, task, &group, false).await?;
    let paused_events = match mode {
        v1::PauseMode::Preempt => {
            let events = wait_for(system, &id, "the running task preempted", |events| {
                !preempted(events).is_empty()
            })
            .await?;
            let stopped = &preempted(&events)[0];
            let done = steps(&events).get(stopped).map_or(0, Vec::len);
            ensure!(
                done < STEPS,
                "{level:?}: the preempted task had run all {done} steps"
            );
            events
        }
        _ => {
            // The running task finishes: its completion, with every step.
            wait_for(system, &id, "the running task finished", |events| {
                !completed_traces(events).is_empty()
            })
            .await?
        }
    };
    if level == Level::Execution {
        let execution = system
            .wait_until(0, &id, tokio::time::Instant::now() + WAIT, "paused", |e| {
                e.state == v1::ExecutionState::Paused as i32
            })
            .await?;
        ensure!(
            execution.reason.contains("Execution test"),
            "{}",
            describe(&execution)
        );
    }
    // The monitor shows what is paused and why.
    let monitor = format!("http://{}", system.monitor_addr);
    if fleet_target(level).is_some() {
        let pauses: serde_json::Value = reqwest::get(format!("{monitor}/api/pauses"))
            .await?
            .json()
            .await?;
        let shown = &pauses["pauses"][0];
        ensure!(
            shown["mode"]
                == mode
                    .as_str_name()
                    .trim_start_matches("PAUSE_MODE_")
                    .to_lowercase()
                && shown["reason"] == format!("{level:?} test"),
            "the monitor shows the pauses as {pauses}"
        );
    }
    if matches!(level, Level::Task | Level::Group) {
        let detail: serde_json::Value = reqwest::get(format!("{monitor}/api/executions/{id}"))
            .await?
            .json()
            .await?;
        let scope = detail["holds"][0]["scope"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let expected = if level == Level::Task {
            format!("task {task}")
        } else {
            format!("group {group}")
        };
        ensure!(scope == expected, "the monitor shows the holds as {detail}");
        let execution = system
            .wait_until(0, &id, tokio::time::Instant::now() + WAIT, "held", |e| {
                !e.holds.is_empty()
            })
            .await?;
        ensure!(
            execution.state == v1::ExecutionState::Running as i32,
            "a pause of part of an execution changed its state: {}",
            describe(&execution)
        );
    }
    // Nothing new starts while paused.
    let before = dispatches(&paused_events);
    tokio::time::sleep(HELD_FOR).await;
    let held = system.event_log(&id).await?;
    ensure!(
        dispatches(&held) == before,
        "{level:?} {mode:?}: {} dispatches while paused",
        dispatches(&held) - before
    );
    pause(system, level, mode, &id, task, &group, true).await?;
    let execution = system
        .wait_until(
            0,
            &id,
            tokio::time::Instant::now() + WAIT,
            "completion after the resume",
            |e| e.state == v1::ExecutionState::Completed as i32,
        )
        .await?;
    ensure!(
        execution.holds.is_empty(),
        "holds left: {:?}",
        execution.holds
    );
    let events = system.event_log(&id).await?;
    // Every step ran exactly once, in order, across attempts; each task's output has all.
    let all: Vec<String> = (1..=STEPS).map(|i| format!("step-{i}")).collect();
    for (instance, recorded) in steps(&events) {
        if recorded.len() == 1 {
            continue; // `after`: one step.
        }
        ensure!(
            recorded == all,
            "{level:?} {mode:?}: instance {instance} recorded steps {recorded:?}"
        );
    }
    for (instance, trace) in completed_traces(&events) {
        if trace.as_array().is_some_and(|t| t.len() > 1) {
            ensure!(
                trace == serde_json::json!(all),
                "{level:?} {mode:?}: instance {instance} completed with trace {trace}"
            );
        }
    }
    let preempted = preempted(&events);
    match mode {
        v1::PauseMode::Preempt => ensure!(
            preempted.len() == 1,
            "{level:?}: {} preemptions",
            preempted.len()
        ),
        _ => ensure!(
            preempted.is_empty(),
            "{level:?} drain preempted {preempted:?}"
        ),
    }
    let lost_or_failed = events
        .iter()
        .filter(|e| matches!(e.kind, Some(Kind::TaskLost(_) | Kind::TaskFailed(_))))
        .count();
    ensure!(
        lost_or_failed == 0,
        "{lost_or_failed} attempts lost or failed"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_in_both_modes_at_every_level_holds_new_work_and_preempt_resumes_at_the_next_step()
-> anyhow::Result<()> {
    let system = System::start(Options {
        coordinators: vec!["coordinator-a", "coordinator-b"],
        workers: 2,
        shards: 4,
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            for level in [
                Level::Task,
                Level::Group,
                Level::Execution,
                Level::Queue,
                Level::Namespace,
                Level::All,
            ] {
                for mode in [v1::PauseMode::Drain, v1::PauseMode::Preempt] {
                    scenario(system, level, mode)
                        .await
                        .with_context(|| format!("pause of {level:?} in {mode:?} mode"))?;
                }
            }
            // The fleet pauses are all lifted.
            let pauses = system
                .client(0)?
                .list_pauses(v1::ListPausesRequest {})
                .await?
                .into_inner()
                .pauses;
            ensure!(pauses.is_empty(), "pauses left: {pauses:?}");
            Ok(())
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_finishes_its_tasks_takes_nothing_new_and_exits() -> anyhow::Result<()> {
    let system = System::start(Options {
        coordinators: vec!["coordinator-a"],
        workers: 2,
        shards: 2,
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            // Four tasks of ten half-second steps, long enough for heartbeats to show them.
            let yaml = format!(
                "name: drain\ntasks:\n{}",
                (0..4)
                    .map(|i| format!(
                        "- {{id: t{i}, type: steps, input: {{count: 10, ms: 500}}}}\n"
                    ))
                    .collect::<String>()
            );
            let id = system.start_plan(0, &yaml).await?;
            wait_for(system, &id, "the tasks started", |events| {
                steps(events).len() == 4
            })
            .await?;
            // Drain a worker that runs some of them, as its heartbeats tell.
            let mut client = system.client(0)?;
            let deadline = tokio::time::Instant::now() + WAIT;
            let busy = loop {
                let workers = client
                    .list_workers(v1::ListWorkersRequest::default())
                    .await?
                    .into_inner()
                    .workers;
                let busy = workers.into_iter().find(|w| {
                    w.last_heartbeat
                        .as_ref()
                        .is_some_and(|beat| !beat.running.is_empty())
                });
                if let Some(worker) = busy {
                    break worker.worker_id;
                }
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "no worker reported running tasks"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            let idx = busy
                .strip_prefix("worker-")
                .and_then(|n| n.parse::<usize>().ok())
                .context("worker ids are worker-<n>")?
                - 1;
            let unknown = client
                .drain_worker(v1::DrainWorkerRequest {
                    worker_id: "worker-9".to_owned(),
                    reason: String::new(),
                })
                .await;
            ensure!(
                unknown.as_ref().err().map(tonic::Status::code) == Some(tonic::Code::NotFound),
                "draining an unknown worker gave {unknown:?}"
            );
            client
                .drain_worker(v1::DrainWorkerRequest {
                    worker_id: busy.clone(),
                    reason: "kernel update".to_owned(),
                })
                .await?;
            // It exits once its tasks are done, and only then: the execution completes with
            // nothing lost, failed or preempted.
            let deadline = tokio::time::Instant::now() + WAIT;
            while system.workers[idx].is_running() {
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "the drained worker did not exit within {WAIT:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let log = std::fs::read_to_string(system.workers[idx].log_path())?;
            ensure!(
                log.contains("kernel update"),
                "the worker did not log the drain"
            );
            let execution = system
                .wait_until(
                    0,
                    &id,
                    tokio::time::Instant::now() + WAIT,
                    "completion",
                    |e| e.state == v1::ExecutionState::Completed as i32,
                )
                .await?;
            let events = system.event_log(&id).await?;
            let bad: Vec<_> = events
                .iter()
                .filter(|e| {
                    matches!(
                        e.kind,
                        Some(Kind::TaskLost(_) | Kind::TaskFailed(_) | Kind::TaskPreempted(_))
                    )
                })
                .collect();
            ensure!(bad.is_empty(), "{}: {bad:?}", describe(&execution));
            // The drained worker completed what it had started: one attempt per task.
            let attempts: BTreeSet<(String, u32)> = events
                .iter()
                .filter_map(|e| match &e.kind {
                    Some(Kind::TaskDispatched(d)) => Some((d.task_instance_id.clone(), d.attempt)),
                    _ => None,
                })
                .collect();
            ensure!(attempts.len() == 4, "attempts: {attempts:?}");
            // New work goes to the worker left.
            let id = system.start_plan(0, &chain_plan("after-drain")).await?;
            system
                .wait_until(
                    0,
                    &id,
                    tokio::time::Instant::now() + WAIT,
                    "completion on the other worker",
                    |e| e.state == v1::ExecutionState::Completed as i32,
                )
                .await?;
            // The preStop form: `trellis-agent-worker --drain` drains the other and returns
            // once it has exited.
            let other = 1 - idx;
            let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_sys-agent-worker"))
                .args(["--drain", "--worker-id", &format!("worker-{}", other + 1)])
                .args(["--nats-url", &system.nats.url()])
                .status();
            let status = tokio::time::timeout(WAIT, status)
                .await
                .context("--drain did not return")??;
            ensure!(status.success(), "--drain exited with {status}");
            // It returns on the worker's last heartbeat, sent as it stops.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while system.workers[other].is_running() {
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "the worker still runs 5 s after --drain returned"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(())
        })
        .await
}
