//! docs/design.md §10, invariant 5: kill -9 of any one process, or a restart of NATS or PostgreSQL,
//! during an execution loses nothing; and §9: coordinators spread the shards, hand them over as
//! others join, and take over the shards of one that died. Each test runs 10,000 subtasks in 10 groups through real processes and checks, from
//! the graph and from the event log, that every task completed once and every group resumed its
//! parent exactly once.

use std::time::Duration;

use anyhow::Context as _;

use trellis_proto::v1;

use crate::system::{
    Ended, FanoutPlan, Fault, Options, SHARDS, System, check_outcome, completed, describe,
    is_terminal,
};

/// The size: 10 plan tasks of type `fanout`, each spawning a group of 1,000 subtasks.
/// The subtasks sleep so the run lasts long enough (about 30 s of work for two workers of
/// `WORKER_SLOTS` slots) for every fault to land while it runs.
const EVERY_SERVICE_PLAN: FanoutPlan = FanoutPlan {
    parents: 10,
    members: 1_000,
    member_ms: 200,
};

/// The faults of the first test, in turn, each once the given fraction of the work completed.
const FAULTS_IN_TURN: [(Fault, f64); 6] = [
    (Fault::Coordinator(0), 0.10),
    (Fault::Worker(0), 0.25),
    (Fault::Store, 0.40),
    (Fault::Nats, 0.55),
    (Fault::Postgres, 0.70),
    (Fault::Monitor, 0.80),
];

/// How long the first test's execution may take, faults included.
const EVERY_SERVICE_DEADLINE: Duration = Duration::from_secs(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_subtasks_survive_a_kill_or_restart_of_every_service_in_turn()
-> anyhow::Result<()> {
    let system = System::start(Options {
        coordinators: vec!["coordinator-1"],
        workers: 2,
        shards: SHARDS,
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let plan = EVERY_SERVICE_PLAN;
            let deadline = tokio::time::Instant::now() + EVERY_SERVICE_DEADLINE;
            let execution_id = system.start_plan(0, &plan.yaml()).await?;
            system
                .inject_in_turn(&execution_id, &plan, &FAULTS_IN_TURN, deadline)
                .await?;
            let Ended { execution, .. } =
                system.check_end(0, &execution_id, &plan, deadline).await?;
            // The restarted monitor rebuilt the execution from the log: it must agree with the
            // coordinator.
            let view = system.monitor_view(&execution_id).await?;
            anyhow::ensure!(
                view["state"] == "completed"
                    && view["counts"]["completed"] == completed(&execution),
                "the monitor shows {view}, the coordinator {}",
                describe(&execution)
            );
            Ok(())
        })
        .await
}

/// The standby test's plan: the same 10,000 subtasks, quicker, since only one fault lands.
const STANDBY_PLAN: FanoutPlan = FanoutPlan {
    parents: 10,
    members: 1_000,
    member_ms: 100,
};

/// The fraction of the work done when the active coordinator is killed.
const KILL_ACTIVE_AT: f64 = 0.30;

/// How long the survivor may take from the kill to serving the execution again: the lease must
/// lapse, then the survivor recovers the execution from checkpoints and the event log.
const TAKEOVER_WITHIN: Duration = Duration::from_secs(20);

/// How long the takeover test's execution may take, the takeover included.
const STANDBY_DEADLINE: Duration = Duration::from_secs(100);

/// Starts `coordinator-a` (with `env` besides) and `coordinator-b` over [`SHARDS`] shards, and
/// two workers.
async fn start_two(env: Vec<(&'static str, String)>) -> anyhow::Result<System> {
    System::start(Options {
        coordinators: vec!["coordinator-a", "coordinator-b"],
        workers: 2,
        shards: SHARDS,
        coordinator_env: env,
        ..Options::default()
    })
    .await
}

/// Waits until `coordinator-a` and `coordinator-b` hold one shard each and both are ready, and
/// starts `plan` through coordinator `on` (without a key, so on a shard it holds).
async fn start_once_balanced(
    system: &System,
    on: usize,
    other: usize,
    plan: &FanoutPlan,
) -> anyhow::Result<String> {
    system
        .wait_for_balance(
            other,
            &[("coordinator-a", 1), ("coordinator-b", 1)],
            Duration::from_secs(20),
        )
        .await?;
    system.expect_ready(on, true).await?;
    system.expect_ready(other, true).await?;
    system.start_plan(on, &plan.yaml()).await
}

/// Waits until `coordinator-a` and `coordinator-b` hold one shard each and both are ready,
/// starts `plan` through coordinator `on` (without a key, so on a shard it holds), and returns once
/// [`KILL_ACTIVE_AT`] of its work is done, with the execution as `on` reports it then.
async fn start_on_one_of_two(
    system: &System,
    on: usize,
    other: usize,
    plan: &FanoutPlan,
    deadline: tokio::time::Instant,
) -> anyhow::Result<(String, v1::Execution)> {
    let execution_id = start_once_balanced(system, on, other, plan).await?;
    let threshold = (plan.n_completed() as f64 * KILL_ACTIVE_AT) as u64;
    let execution = system
        .wait_until(
            on,
            &execution_id,
            deadline,
            &format!("{threshold} completed instances"),
            |execution| completed(execution) >= threshold || is_terminal(execution),
        )
        .await?;
    anyhow::ensure!(
        !is_terminal(&execution),
        "the execution ended before the fault could land ({}); make the subtasks slower",
        describe(&execution)
    );
    Ok((execution_id, execution))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_coordinator_takes_over_the_shards_of_a_killed_one_and_finishes()
-> anyhow::Result<()> {
    // The two coordinators hold one shard each; the execution runs on one of `coordinator-a`'s.
    let system = start_two(Vec::new()).await?;
    system
        .run(async |system: &mut System| {
            const ACTIVE: usize = 0;
            const STANDBY: usize = 1;
            let plan = STANDBY_PLAN;
            let deadline = tokio::time::Instant::now() + STANDBY_DEADLINE;
            // Both serve, so a Kubernetes Service routes to either.
            let (execution_id, execution) =
                start_on_one_of_two(system, ACTIVE, STANDBY, &plan, deadline).await?;
            let done_at_kill = completed(&execution);
            eprintln!("killing the active coordinator at {done_at_kill} completed instances");
            system.kill_coordinator(ACTIVE)?;
            let killed_at = tokio::time::Instant::now();

            // The survivor serves the execution once it owns the shard and recovered it: its
            // counts move past what the dead coordinator had reported.
            let takeover_deadline = (killed_at + TAKEOVER_WITHIN).min(deadline);
            system
                .wait_until(
                    STANDBY,
                    &execution_id,
                    takeover_deadline,
                    "the takeover (serving the execution with progress past the kill)",
                    |execution| completed(execution) > done_at_kill,
                )
                .await?;
            eprintln!(
                "the survivor serves the execution {:?} after the kill",
                killed_at.elapsed()
            );
            system.expect_ready(STANDBY, true).await?;

            system
                .check_end(STANDBY, &execution_id, &plan, deadline)
                .await
                .map(drop)
        })
        .await
}

/// The cluster test's executions: several, so they land on shards of every coordinator, each
/// long enough to run through a join and a kill.
const CLUSTER_PLAN: FanoutPlan = FanoutPlan {
    parents: 4,
    members: 120,
    member_ms: 400,
};
const CLUSTER_EXECUTIONS: usize = 6;
const CLUSTER_SHARDS: u32 = 12;
/// How long the cluster test's executions may take, the join and the kill included.
const CLUSTER_DEADLINE: Duration = Duration::from_secs(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinators_spread_the_shards_answer_for_each_other_and_survive_a_join_and_a_kill()
-> anyhow::Result<()> {
    let system = System::start(Options {
        coordinators: vec!["coordinator-a", "coordinator-b", "coordinator-c"],
        workers: 2,
        shards: CLUSTER_SHARDS,
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let deadline = tokio::time::Instant::now() + CLUSTER_DEADLINE;
            let balance = Duration::from_secs(30);
            system
                .wait_for_balance(
                    0,
                    &[("coordinator-a", 4), ("coordinator-b", 4), ("coordinator-c", 4)],
                    balance,
                )
                .await?;
            // Started through each coordinator in turn, read and controlled through the others.
            let mut ids = Vec::new();
            for n in 0..CLUSTER_EXECUTIONS {
                ids.push(system.start_plan(n % 3, &CLUSTER_PLAN.yaml()).await?);
            }
            for (n, id) in ids.iter().enumerate() {
                let execution = system
                    .client((n + 1) % 3)?
                    .get_execution(v1::GetExecutionRequest {
                        execution_id: id.clone(),
                    })
                    .await?
                    .into_inner()
                    .execution
                    .ok_or_else(|| anyhow::anyhow!("GetExecution of {id} without an execution"))?;
                anyhow::ensure!(execution.execution_id == *id);
            }
            let paused = system
                .client(2)?
                .pause_execution(v1::PauseExecutionRequest {
                    execution_id: ids[0].clone(),
                    reason: "paused through another coordinator".to_owned(),
                    ..Default::default()
                })
                .await?
                .into_inner()
                .state;
            anyhow::ensure!(
                paused == v1::ExecutionState::Paused as i32,
                "pausing through a coordinator that does not hold the shard gave state {paused}"
            );
            system
                .client(1)?
                .resume_execution(v1::ResumeExecutionRequest {
                    execution_id: ids[0].clone(),
                    reason: String::new(),
                    ..Default::default()
                })
                .await?;

            // A fourth joins under load: the others hand it a share.
            let fourth = system.add_coordinator("coordinator-d").await?;
            system
                .wait_for_balance(
                    fourth,
                    &[
                        ("coordinator-a", 3),
                        ("coordinator-b", 3),
                        ("coordinator-c", 3),
                        ("coordinator-d", 3),
                    ],
                    balance,
                )
                .await?;
            eprintln!("the shards are spread over four coordinators");

            // One dies under load: the three left take its shards once its leases lapse.
            let unfinished = {
                let mut unfinished = 0;
                for id in &ids {
                    let execution = system
                        .client(0)?
                        .get_execution(v1::GetExecutionRequest {
                            execution_id: id.clone(),
                        })
                        .await?
                        .into_inner()
                        .execution
                        .unwrap_or_default();
                    if !is_terminal(&execution) {
                        unfinished += 1;
                    }
                }
                unfinished
            };
            anyhow::ensure!(
                unfinished > 0,
                "every execution ended before the kill; make the subtasks slower"
            );
            system.kill_coordinator(1)?;
            let killed_at = tokio::time::Instant::now();
            system
                .wait_for_balance(
                    0,
                    &[("coordinator-a", 4), ("coordinator-c", 4), ("coordinator-d", 4)],
                    balance,
                )
                .await?;
            eprintln!(
                "the dead coordinator's shards moved {:?} after the kill ({unfinished} executions running)",
                killed_at.elapsed()
            );

            let mut problems = Vec::new();
            for (n, id) in ids.iter().enumerate() {
                let idx = [0, 2, 3][n % 3];
                let execution = system
                    .wait_until(idx, id, deadline, "the end of the execution", is_terminal)
                    .await?;
                let graph = system.graph([2, 3, 0][n % 3], id).await?;
                let events = system.event_log(id).await?;
                if let Err(problem) = check_outcome(&CLUSTER_PLAN, &execution, &graph, &events) {
                    problems.push(format!("execution {id}: {problem:#}"));
                }
            }
            anyhow::ensure!(problems.is_empty(), "{}", problems.join("\n"));
            Ok(())
        })
        .await
}

/// How long the stale coordinator stays stopped: past its lease (three TTLs), so the standby
/// takes the shard over and the execution moves on without it.
const STOPPED_FOR: Duration = Duration::from_secs(10);

/// Sends `signal` (`STOP`, `CONT`) to a process.
fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed: {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_stopped_past_its_lease_wakes_up_fenced_and_nothing_is_doubled()
-> anyhow::Result<()> {
    let system = start_two(Vec::new()).await?;
    system
        .run(async |system: &mut System| {
            const STALE: usize = 0;
            const STANDBY: usize = 1;
            let plan = STANDBY_PLAN;
            let deadline = tokio::time::Instant::now() + STANDBY_DEADLINE;
            let (execution_id, execution) =
                start_on_one_of_two(system, STALE, STANDBY, &plan, deadline).await?;
            let pid = system.coordinators[STALE]
                .service
                .pid()
                .context("the coordinator runs")?;
            let done_at_stop = completed(&execution);
            eprintln!("stopping coordinator-a (pid {pid}) at {done_at_stop} completed instances");
            signal(pid, "STOP")?;
            let stopped_at = tokio::time::Instant::now();
            // The standby takes the shard over and moves the execution on.
            let result = system
                .wait_until(
                    STANDBY,
                    &execution_id,
                    (stopped_at + TAKEOVER_WITHIN).min(deadline),
                    "the takeover (progress past the stop)",
                    |execution| completed(execution) > done_at_stop,
                )
                .await;
            tokio::time::sleep(STOPPED_FOR.saturating_sub(stopped_at.elapsed())).await;
            // Awake again, the stale coordinator finishes whatever turn it was in.
            signal(pid, "CONT")?;
            result?;
            system
                .check_end(STANDBY, &execution_id, &plan, deadline)
                .await?;
            // It steps down and rejoins: the two share the shards again, one writer each.
            system
                .wait_for_balance(
                    STANDBY,
                    &[("coordinator-a", 1), ("coordinator-b", 1)],
                    Duration::from_secs(30),
                )
                .await?;
            let refused = system
                .coordinator_metric(STALE, "trellis_appends_refused_total")
                .await?;
            eprintln!("the woken coordinator had {refused} appends refused");
            Ok(())
        })
        .await
}

/// The stale coordinator of the test above, forced to write: it stops itself (failpoint
/// `before-append`) with a turn's appends decided and not sent, stays stopped past its lease
/// while the standby takes the shard over and extends the log, and on SIGCONT sends them. They
/// are refused, it drops the execution, and nothing is doubled or lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_woken_in_the_middle_of_an_append_is_refused_and_steps_down()
-> anyhow::Result<()> {
    const STALE: usize = 0;
    const STANDBY: usize = 1;
    // Three groups of 200: the tenth append turn falls early in the run.
    let plan = FanoutPlan {
        parents: 3,
        members: 200,
        member_ms: 100,
    };
    let point = "before-append:10";
    let system = start_two(vec![("TRELLIS_FAILPOINT", point.to_owned())]).await?;
    system
        .run(async |system: &mut System| {
            let deadline = tokio::time::Instant::now() + STANDBY_DEADLINE;
            let execution_id = start_once_balanced(system, STALE, STANDBY, &plan).await?;
            crate::failpoints::wait_for_failpoint(system, point).await?;
            let stopped_at = tokio::time::Instant::now();
            let pid = system.coordinators[STALE]
                .service
                .pid()
                .context("the coordinator runs")?;
            // The standby takes the shard over and moves the execution on.
            let claimed = system
                .wait_until(
                    STANDBY,
                    &execution_id,
                    (stopped_at + TAKEOVER_WITHIN).min(deadline),
                    "the takeover",
                    |execution| completed(execution) > 0,
                )
                .await;
            tokio::time::sleep(STOPPED_FOR.saturating_sub(stopped_at.elapsed())).await;
            signal(pid, "CONT")?;
            claimed?;
            system
                .check_end(STANDBY, &execution_id, &plan, deadline)
                .await?;
            // The execution may have ended before the woken coordinator got to its append: wait
            // for the refusal rather than read the counter once.
            let refused_by = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let refused = system
                    .coordinator_metric(STALE, "trellis_appends_refused_total")
                    .await?;
                if refused >= 1.0 {
                    break;
                }
                anyhow::ensure!(
                    tokio::time::Instant::now() < refused_by,
                    "the woken coordinator's append was not refused within 20 s \
                     (trellis_appends_refused_total {refused})"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            system
                .wait_for_balance(
                    STANDBY,
                    &[("coordinator-a", 1), ("coordinator-b", 1)],
                    Duration::from_secs(30),
                )
                .await?;
            Ok(())
        })
        .await
}
