//! Durable steps (seed 002): a handler killed after two steps resumes at the third.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use trellis_agent_worker::v1::{RecordedStep, ResumeContext};
use trellis_agent_worker::{HandlerRegistry, Outcome, TaskContext};

use super::*;

type StepLog = Arc<Mutex<Vec<(u32, &'static str)>>>;

/// Three steps; the first time it reaches the third, it hangs (and the test kills its worker).
fn three_steps(log: StepLog, hang_once: Arc<AtomicBool>) -> HandlerRegistry {
    HandlerRegistry::new().with("steps", move |ctx: TaskContext| {
        let log = log.clone();
        let hang_once = hang_once.clone();
        async move {
            for name in ["one", "two", "three"] {
                if name == "three" && hang_once.swap(false, Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                let attempt = ctx.attempt();
                let log = log.clone();
                let step = ctx.step(name, |_state| async move {
                    log.lock().map_err(|_| "poisoned")?.push((attempt, name));
                    Ok::<_, &str>(json!({ name: true, "trace": [name] }))
                });
                if let Err(error) = step.await {
                    return error.into();
                }
            }
            Outcome::Completed(ctx.step_state())
        }
    })
}

#[tokio::test]
async fn a_step_handler_killed_after_step_two_resumes_at_step_three() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let log: StepLog = Arc::default();
    let hang_once = Arc::new(AtomicBool::new(true));
    let first = harness.worker(
        "w1",
        &["steps"],
        three_steps(log.clone(), hang_once.clone()),
    );
    let task = assignment("steps", json!({}));
    harness.publish(&task).await?;

    let mut checkpoints = Vec::new();
    for expected in ["one", "two"] {
        let result = harness.result_of(&task.task_instance_id).await?;
        let Some(task_result::Outcome::StepCheckpoint(checkpoint)) = result.outcome else {
            anyhow::bail!("expected a step checkpoint, got {:?}", result.outcome);
        };
        assert_eq!(checkpoint.step, expected);
        checkpoints.push(checkpoint);
    }
    let merged: Value = serde_json::from_slice(&checkpoints[1].merged_state)?;
    assert_eq!(
        merged,
        json!({"one": true, "two": true, "trace": ["one", "two"]})
    );
    first.kill().await;

    // The coordinator redelivers the task with the steps it recorded.
    let mut resumed = next_attempt(&task);
    resumed.resume = Some(ResumeContext {
        steps: checkpoints
            .iter()
            .map(|checkpoint| RecordedStep {
                step: checkpoint.step.clone(),
                state: checkpoint.merged_state.clone(),
            })
            .collect(),
        ..ResumeContext::default()
    });
    let second = harness.worker("w2", &["steps"], three_steps(log.clone(), hang_once));
    harness.publish(&resumed).await?;
    let result = harness
        .result_matching(&resumed.task_instance_id, |result| {
            result.attempt == 2
                && matches!(result.outcome, Some(task_result::Outcome::Completed(_)))
        })
        .await?;
    assert_eq!(
        completed_output(&result)?,
        json!({"one": true, "two": true, "three": true, "trace": ["one", "two", "three"]})
    );
    let ran_in_attempt_two: Vec<&str> = log
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .iter()
        .filter(|(attempt, _)| *attempt == 2)
        .map(|(_, name)| *name)
        .collect();
    assert_eq!(ran_in_attempt_two, ["three"]);
    second.stop().await
}
