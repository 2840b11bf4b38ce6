//! A worker process killed with SIGKILL mid-task: the task goes to another worker within three
//! heartbeat intervals (the ack wait) and completes once; a step-wise task resumes after its last
//! checkpointed step.

use std::process::{Command, Stdio};
use std::time::Duration;

use prost::Message as _;
use serde_json::json;
use trellis_agent_worker::HandlerRegistry;
use trellis_agent_worker::v1::{self, task_result};

use super::*;

#[tokio::test]
async fn a_worker_process_killed_with_sigkill_loses_its_task_to_another_worker()
-> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let mut process = worker_process(&harness, "doomed", "sleep")?;
    let task = assignment("sleep", json!({"ms": 4000}));
    harness.publish(&task).await?;
    heartbeat_listing(&harness.client, "doomed", &task.task_instance_id).await?;
    // SIGKILL: no graceful shutdown, no nak, nothing.
    process.kill()?;
    process.wait()?;
    let killed_at = tokio::time::Instant::now();
    let rescuer = harness.worker("rescuer", &["sleep"], HandlerRegistry::with_builtins());
    let result = harness.final_result_of(&task.task_instance_id).await?;
    assert_eq!(result.worker_id, "rescuer");
    assert!(
        matches!(result.outcome, Some(task_result::Outcome::Completed(_))),
        "{:?}",
        result.outcome
    );
    let within =
        trellis_bus::HEARTBEAT_INTERVAL * 3 + Duration::from_millis(1500) + Duration::from_secs(3);
    assert!(
        killed_at.elapsed() < within,
        "took {:?}",
        killed_at.elapsed()
    );
    // Completed once: no second result for the instance arrives.
    let again = tokio::time::timeout(
        Duration::from_secs(2),
        harness.final_result_of(&task.task_instance_id),
    )
    .await;
    assert!(
        again.is_err() || again.is_ok_and(|r| r.is_err()),
        "a second result arrived"
    );
    drop(rescuer);
    Ok(())
}

/// Returns the steps the steps bucket holds for `instance` (empty when it holds none).
async fn stored_steps(steps: &jetstream::kv::Store, instance: &str) -> anyhow::Result<Vec<String>> {
    let Some(entry) = steps.get(instance).await? else {
        return Ok(Vec::new());
    };
    let recorded = v1::RecordedSteps::decode(entry)?;
    Ok(recorded.steps.into_iter().map(|step| step.step).collect())
}

/// The must-show of seed 002: a step-wise task whose worker process is killed with SIGKILL after
/// step 2 of 4 is delivered again (same attempt, no steps in the assignment) and resumes at
/// step 3 on another worker, with the state of all four steps merged once each.
#[tokio::test]
async fn a_step_wise_task_killed_after_step_two_of_four_resumes_at_step_three() -> anyhow::Result<()>
{
    let mut harness = Harness::start().await?;
    let mut process = Command::new(env!("CARGO_BIN_EXE_trellis-agent-worker"))
        .args([
            "--nats-url",
            &harness.server.url(),
            "--admin-addr",
            "off",
            "--worker-id",
            "doomed",
            "--queues",
            "steps",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    // Each step takes 2 s, so step 3 is still running when the worker dies.
    let task = assignment("steps", json!({"count": 4, "ms": 2000}));
    let instance = task.task_instance_id.as_str();
    harness.publish(&task).await?;

    for expected in ["step-1", "step-2"] {
        let result = harness.result_of(instance).await?;
        let Some(task_result::Outcome::StepCheckpoint(checkpoint)) = result.outcome else {
            anyhow::bail!("expected a step checkpoint, got {:?}", result.outcome);
        };
        assert_eq!(
            (checkpoint.step.as_str(), result.worker_id.as_str()),
            (expected, "doomed")
        );
    }
    // The worker stores a step in the bucket before it publishes the checkpoint.
    let steps = trellis_bus::steps_bucket(&harness.js).await?;
    assert_eq!(stored_steps(&steps, instance).await?, ["step-1", "step-2"]);
    process.kill()?;
    process.wait()?;

    let rescuer = harness.worker("rescuer", &["steps"], HandlerRegistry::with_builtins());
    let mut seen_after_kill = Vec::new();
    let output = loop {
        let result = harness.result_of(instance).await?;
        assert_eq!(result.attempt, 1, "the redelivery is the same attempt");
        match &result.outcome {
            Some(task_result::Outcome::StepCheckpoint(checkpoint)) => {
                seen_after_kill.push((checkpoint.step.clone(), result.worker_id.clone()));
            }
            _ => break completed_output(&result)?,
        }
    };
    assert_eq!(
        seen_after_kill,
        [
            ("step-3".to_owned(), "rescuer".to_owned()),
            ("step-4".to_owned(), "rescuer".to_owned())
        ],
        "steps 1 and 2 must not run again"
    );
    assert_eq!(
        output,
        json!({
            "done": {"1": true, "2": true, "3": true, "4": true},
            "trace": ["step-1", "step-2", "step-3", "step-4"],
            "last": "step-4",
        })
    );
    // The instance is over, so its entry goes.
    trellis_testkit::wait_for(
        || async {
            stored_steps(&steps, instance)
                .await
                .is_ok_and(|s| s.is_empty())
        },
        SOON,
    )
    .await?;
    harness.wait_until_queue_drained("steps").await?;
    rescuer.stop().await
}

#[tokio::test]
async fn a_shell_task_dies_with_its_worker_process() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let mut process = worker_process(&harness, "doomed", "shell")?;
    let pid_file = std::env::temp_dir().join(format!("trellis-shell-{}", uuid::Uuid::now_v7()));
    let task = assignment(
        "shell",
        json!({"command": ["sh", "-c", format!("echo $$ > {}; exec sleep 60", pid_file.display())]}),
    );
    harness.publish(&task).await?;
    heartbeat_listing(&harness.client, "doomed", &task.task_instance_id).await?;
    let written = pid_file.clone();
    trellis_testkit::wait_for(
        || {
            let written = written.clone();
            async move { std::fs::read_to_string(&written).is_ok_and(|pid| pid.ends_with('\n')) }
        },
        SOON,
    )
    .await
    .context("the shell task never wrote its pid")?;
    let pid = std::fs::read_to_string(&pid_file)?.trim().to_owned();
    let _ = std::fs::remove_file(&pid_file);
    process.kill()?;
    process.wait()?;
    wait_until_gone(&pid, Duration::from_secs(5))
        .await
        .context("the shell task's process outlived its worker's SIGKILL")?;
    Ok(())
}

/// Starts a worker process (the binary, so it can be killed with SIGKILL) of `queue`.
fn worker_process(
    harness: &Harness,
    worker_id: &str,
    queue: &str,
) -> std::io::Result<std::process::Child> {
    Command::new(env!("CARGO_BIN_EXE_trellis-agent-worker"))
        .args([
            "--nats-url",
            &harness.server.url(),
            "--admin-addr",
            "off",
            "--worker-id",
            worker_id,
            "--queues",
            queue,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}
