//! The windows of seed 004, forced: the coordinator stops itself at a failpoint (the cargo
//! feature `failpoints`, armed by `TRELLIS_FAILPOINT`) and the test SIGKILLs it there, then starts
//! it again without the failpoint. Every member completes once and every group resumes its
//! parent exactly once, checked from the graph and from the event log.
//!
//! - `after-append`: a turn's events are stored, none of its assignments, acknowledgements or
//!   answers went out;
//! - `before-ack`: its assignments went out, the results it consumed are not acknowledged (they
//!   come again to the restarted coordinator, whose log already holds them);
//! - `group-settled`: the turn that applied a group's last member and resumed its parent is
//!   stored, the parent's resumed instance is not sent.

use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::system::{FanoutPlan, Options, System};

/// Three groups of 40 short subtasks: a run of a few dozen turns, more than the counts armed.
const PLAN: FanoutPlan = FanoutPlan {
    parents: 3,
    members: 40,
    member_ms: 100,
};

/// How long each step may take.
const WAIT: Duration = Duration::from_secs(90);

/// Waits until the coordinator's log says it reached the failpoint and the process is stopped.
pub(crate) async fn wait_for_failpoint(system: &mut System, point: &str) -> anyhow::Result<()> {
    let name = point.split(':').next().unwrap_or(point);
    let line = format!("failpoint {name} reached");
    let deadline = tokio::time::Instant::now() + WAIT;
    let service = &mut system.coordinators[0].service;
    loop {
        let log = std::fs::read_to_string(service.log_path()).unwrap_or_default();
        if log.contains(&line) {
            break;
        }
        if !service.is_running() {
            bail!("the coordinator exited before the failpoint {point}");
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("the coordinator did not reach the failpoint {point} within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The process stops itself right after the line: wait for the kernel to say so.
    let pid = service.pid().context("the coordinator has no pid")?;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // The state follows the command name in parentheses.
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        if state.starts_with('T') {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("the coordinator logged the failpoint {point} but did not stop: {stat}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs the plan, SIGKILLs the coordinator at `point`, restarts it, and checks the outcome.
async fn killed_at(point: &str) -> anyhow::Result<()> {
    let system = System::start(Options {
        coordinators: vec!["coordinator-a"],
        workers: 1,
        coordinator_env: vec![("TRELLIS_FAILPOINT", point.to_owned())],
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let execution_id = system.start_plan(0, &PLAN.yaml()).await?;
            wait_for_failpoint(system, point).await?;
            let coordinator = &mut system.coordinators[0].service;
            coordinator.kill9()?;
            coordinator.remove_env("TRELLIS_FAILPOINT");
            coordinator.restart().await?;

            let deadline = tokio::time::Instant::now() + WAIT;
            system
                .check_end(0, &execution_id, &PLAN, deadline)
                .await
                .map(drop)
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_an_append_before_its_effects_every_parent_resumes_once() -> anyhow::Result<()>
{
    killed_at("after-append:8").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_results_are_acknowledged_every_parent_resumes_once() -> anyhow::Result<()> {
    killed_at("before-ack:8").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_as_the_first_group_settles_its_parent_resumes_once() -> anyhow::Result<()> {
    killed_at("group-settled:1").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_as_the_last_group_settles_its_parent_resumes_once() -> anyhow::Result<()> {
    killed_at("group-settled:3").await
}
