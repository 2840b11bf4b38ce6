//! Durable steps (seed 002): a handler killed after two steps resumes at the third, with the
//! steps from the coordinator's assignment or, when it has none, from the steps bucket.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prost::Message as _;
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
    let n_ran_before_kill = log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.len();

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
    // Attempt 1's message also comes back to the second worker after the ack wait, and a dead
    // worker's pending pull may even swallow attempt 2 until then; whichever runs first does step
    // three (the other may find it in the steps bucket), but none runs steps one or two again.
    let ran_after_kill: Vec<&str> = log
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .iter()
        .skip(n_ran_before_kill)
        .map(|(_, name)| *name)
        .collect();
    assert!(
        !ran_after_kill.is_empty() && ran_after_kill.iter().all(|name| *name == "three"),
        "steps run after the kill: {ran_after_kill:?}"
    );
    second.stop().await
}

/// Stores `names` as the steps the bucket holds for `task`'s instance, each with the state a run
/// of [`three_steps`] leaves after it.
async fn store_steps(
    harness: &Harness,
    task: &TaskAssignment,
    names: &[&str],
) -> anyhow::Result<jetstream::kv::Store> {
    let steps = trellis_bus::ensure_steps_bucket(&harness.js, 1).await?;
    let mut state = json!({});
    let mut trace = Vec::new();
    let mut recorded = Vec::new();
    for name in names {
        trace.push(*name);
        state[*name] = json!(true);
        state["trace"] = json!(trace);
        recorded.push(RecordedStep {
            step: (*name).to_owned(),
            state: serde_json::to_vec(&state)?,
        });
    }
    let entry = v1::RecordedSteps {
        attempt: task.attempt,
        steps: recorded,
    };
    steps
        .put(&task.task_instance_id, entry.encode_to_vec().into())
        .await?;
    Ok(steps)
}

/// Returns the steps `log` shows for `attempt`, in the order they ran.
fn ran_in(log: &StepLog, attempt: u32) -> anyhow::Result<Vec<&'static str>> {
    Ok(log
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .iter()
        .filter(|(ran_attempt, _)| *ran_attempt == attempt)
        .map(|(_, name)| *name)
        .collect())
}

#[tokio::test]
async fn a_later_attempt_without_steps_resumes_from_the_steps_bucket() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let log: StepLog = Arc::default();
    let task = assignment("steps", json!({}));
    let steps = store_steps(&harness, &task, &["one", "two"]).await?;
    // The coordinator missed the steps (say, their checkpoints came after it gave up on attempt
    // 1): attempt 2 arrives without any.
    let retry = next_attempt(&task);
    let worker = harness.worker(
        "w1",
        &["steps"],
        three_steps(log.clone(), Arc::new(AtomicBool::new(false))),
    );
    harness.publish(&retry).await?;
    let result = harness.final_result_of(&retry.task_instance_id).await?;
    assert_eq!(
        completed_output(&result)?,
        json!({"one": true, "two": true, "three": true, "trace": ["one", "two", "three"]})
    );
    assert_eq!(ran_in(&log, 2)?, ["three"]);
    // Completed, so the instance's entry is gone.
    trellis_testkit::wait_for(
        || async {
            steps
                .get(&retry.task_instance_id)
                .await
                .is_ok_and(|entry| entry.is_none())
        },
        SOON,
    )
    .await?;
    worker.stop().await
}

#[tokio::test]
async fn a_first_delivery_does_not_read_the_steps_bucket() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let log: StepLog = Arc::default();
    let task = assignment("steps", json!({}));
    // An entry a first delivery must not look for (it cannot exist in practice: the attempt has
    // not run anywhere yet), so it shows whether the worker read the bucket.
    store_steps(&harness, &task, &["one", "two"]).await?;
    let worker = harness.worker(
        "w1",
        &["steps"],
        three_steps(log.clone(), Arc::new(AtomicBool::new(false))),
    );
    harness.publish(&task).await?;
    let result = harness.final_result_of(&task.task_instance_id).await?;
    assert_eq!(ran_in(&log, 1)?, ["one", "two", "three"]);
    assert_eq!(
        completed_output(&result)?,
        json!({"one": true, "two": true, "three": true, "trace": ["one", "two", "three"]})
    );
    worker.stop().await
}
