//! docs/design.md §10, invariant 5: kill -9 of any one process, or a restart of NATS or PostgreSQL,
//! during an execution loses nothing; and §9: a standby coordinator takes over the shards of one
//! that died. Each test runs 10,000 subtasks in 10 groups through real processes and checks, from
//! the graph and from the event log, that every task completed once and every group resumed its
//! parent exactly once.

use std::time::Duration;

use crate::system::{
    FanoutPlan, Fault, Options, System, check_outcome, completed, describe, is_terminal,
    start_request,
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
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let plan = EVERY_SERVICE_PLAN;
            let deadline = tokio::time::Instant::now() + EVERY_SERVICE_DEADLINE;
            let execution_id = system.start_plan(0, &plan.yaml()).await?;
            for (fault, fraction) in FAULTS_IN_TURN {
                let threshold = (plan.n_completed() as f64 * fraction) as u64;
                let execution = system
                    .wait_until(
                        0,
                        &execution_id,
                        deadline,
                        &format!("{threshold} completed instances before the {fault}"),
                        |execution| {
                            completed(execution) >= threshold
                                || is_terminal(execution)
                        },
                    )
                    .await?;
                anyhow::ensure!(
                    !is_terminal(&execution),
                    "the execution ended before the {fault} could be injected ({}); the faults must land while it runs, so make the subtasks slower",
                    describe(&execution)
                );
                eprintln!(
                    "injecting the {fault} at {} completed instances",
                    completed(&execution)
                );
                system.inject(fault).await?;
            }
            let execution = system
                .wait_until(0, &execution_id, deadline, "the end of the execution", is_terminal)
                .await?;
            let graph = system.graph(0, &execution_id).await?;
            let events = system.event_log(&execution_id).await?;
            check_outcome(&plan, &execution, &graph, &events)?;
            // The restarted monitor rebuilt the execution from the log: it must agree with the
            // coordinator.
            let view = system.monitor_view(&execution_id).await?;
            anyhow::ensure!(
                view["state"] == "completed" && view["counts"]["completed"] == completed(&execution),
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

/// How long the standby may take from the kill to serving the execution again: the lease must
/// lapse, then the standby recovers the execution from checkpoints and the event log.
const TAKEOVER_WITHIN: Duration = Duration::from_secs(20);

/// How long the standby test's execution may take, the takeover included.
const STANDBY_DEADLINE: Duration = Duration::from_secs(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_coordinator_takes_over_the_shards_of_a_killed_one_and_finishes()
-> anyhow::Result<()> {
    // `coordinator-a` starts first and takes every shard lease; `coordinator-b` stands by.
    let system = System::start(Options {
        coordinators: vec!["coordinator-a", "coordinator-b"],
        workers: 2,
    })
    .await?;
    system
        .run(async |system: &mut System| {
            const ACTIVE: usize = 0;
            const STANDBY: usize = 1;
            let plan = STANDBY_PLAN;
            let deadline = tokio::time::Instant::now() + STANDBY_DEADLINE;
            // A coordinator that owns no shard refuses new executions: this one really stands by.
            let refused = system
                .client(STANDBY)?
                .start_execution(start_request("name: probe\ntasks:\n- {id: t, type: noop}\n"))
                .await;
            match refused {
                Err(status) if status.code() == tonic::Code::Unavailable => {}
                other => anyhow::bail!(
                    "the standby should refuse StartExecution with UNAVAILABLE while the other coordinator holds every shard, got {other:?}"
                ),
            }
            // Only the active coordinator is ready, so a Kubernetes Service routes to it alone.
            system.expect_ready(ACTIVE, true).await?;
            system.expect_ready(STANDBY, false).await?;
            let execution_id = system.start_plan(ACTIVE, &plan.yaml()).await?;
            let threshold = (plan.n_completed() as f64 * KILL_ACTIVE_AT) as u64;
            let execution = system
                .wait_until(
                    ACTIVE,
                    &execution_id,
                    deadline,
                    &format!("{threshold} completed instances"),
                    |execution| {
                        completed(execution) >= threshold || is_terminal(execution)
                    },
                )
                .await?;
            anyhow::ensure!(
                !is_terminal(&execution),
                "the execution ended before the active coordinator could be killed ({}); make the subtasks slower",
                describe(&execution)
            );
            let done_at_kill = completed(&execution);
            eprintln!("killing the active coordinator at {done_at_kill} completed instances");
            system.kill_coordinator(ACTIVE)?;
            let killed_at = tokio::time::Instant::now();

            // The standby serves the execution once it owns the shard and recovered it: its
            // counts move past what the dead coordinator had reported.
            let takeover_deadline = (killed_at + TAKEOVER_WITHIN).min(deadline);
            system
                .wait_until(
                    STANDBY,
                    &execution_id,
                    takeover_deadline,
                    "the standby's takeover (serving the execution with progress past the kill)",
                    |execution| completed(execution) > done_at_kill,
                )
                .await?;
            eprintln!(
                "the standby serves the execution {:?} after the kill",
                killed_at.elapsed()
            );
            system.expect_ready(STANDBY, true).await?;

            let execution = system
                .wait_until(STANDBY, &execution_id, deadline, "the end of the execution", is_terminal)
                .await?;
            let graph = system.graph(STANDBY, &execution_id).await?;
            let events = system.event_log(&execution_id).await?;
            check_outcome(&plan, &execution, &graph, &events)
        })
        .await
}
