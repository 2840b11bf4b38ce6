//! `trellis demo`: runs an example plan on a local cluster and shows its execution tree.

use clap::Args;

use super::{Failure, inspect, plan, submit};
use crate::local;

/// The demo plan: dependencies, a subtask group whose parent is resumed, a retried failure.
const DEMO_PLAN: &str = include_str!("../../../../examples/demo.yaml");

/// Run a demonstration: a plan with dependencies, a subtask group and a retried failure.
#[derive(Debug, Args)]
#[command(
    long_about = "Run a demonstration on a local cluster started for it (NATS, a coordinator, two \
        workers, all in this process).\n\n\
        The plan (examples/demo.yaml) has dependencies, a task that fans out into a group of 8 \
        subtasks and is resumed once they have finished, and a task that fails once and is \
        retried. The execution's progress is shown live, then its tree.",
    after_help = "Examples:\n  \
        trellis demo\n  \
        cargo run -p trellis-cli -- demo"
)]
pub struct DemoArgs {}

/// Runs `trellis demo`.
pub async fn run(_args: DemoArgs) -> Result<(), Failure> {
    eprintln!("trellis demo: starting NATS, a coordinator and 2 workers in this process ...");
    let mut local = local::start(local::Options {
        nats_url: local::nats_from_env()?,
        listen: "127.0.0.1:0"
            .parse()
            .map_err(|_| Failure::failed("bad listen address"))?,
        workers: 2,
        slots: 16,
        coordinator: true,
        monitor: None,
        breakers: local::Breakers::default(),
        sync: local::SyncMode::default(),
        dispatch_window: None,
        handoff: true,
        offers: true,
    })
    .await?;
    let plan = std::env::temp_dir().join(format!("trellis-demo-{}.yaml", std::process::id()));
    std::fs::write(&plan, DEMO_PLAN)
        .map_err(|e| Failure::failed(format!("cannot write {}: {e}", plan.display())))?;
    eprintln!(
        "trellis demo: running plan \"demo\" (checkout -> build, lint -> test-shards (8 subtasks) -> package)"
    );
    let coordinator_url = local.coordinator_url.clone();
    let submit = submit::run_with_id(
        &coordinator_url,
        submit::SubmitArgs {
            plan: plan::PlanArgs {
                file: plan.clone(),
                params: Vec::new(),
                planner: Some(local.planner_url.clone()),
            },
            wait: true,
            json: false,
            labels: Vec::new(),
            idempotency_key: None,
            namespace: None,
        },
    );
    // A service that stops on its own ends the demo, naming it, rather than leaving it waiting.
    let submitted = tokio::select! {
        submitted = submit => submitted,
        Some(reason) = local.stopped.recv() => {
            Err(Failure::failed(format!("{reason}; the demo cannot go on")))
        }
    };
    let _ = std::fs::remove_file(&plan);
    let execution_id = submitted?;
    println!("\nExecution tree:");
    let tree = inspect::TreeArgs {
        execution_id: execution_id.clone(),
        run: 0,
        json: false,
    };
    inspect::tree(&local.coordinator_url, tree).await?;
    println!(
        "\nThe `lint` task failed once and was retried (attempt 2); `test-shards` spawned a group of 8 and was resumed once they finished."
    );
    local.stop().await;
    Ok(())
}
