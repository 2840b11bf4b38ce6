//! A worker process killed with SIGKILL mid-task: the task goes to another worker within three
//! heartbeat intervals (the ack wait) and completes once.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use trellis_agent_worker::HandlerRegistry;
use trellis_agent_worker::v1::task_result;

use super::*;

#[tokio::test]
async fn a_worker_process_killed_with_sigkill_loses_its_task_to_another_worker()
-> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let mut process = Command::new(env!("CARGO_BIN_EXE_trellis-agent-worker"))
        .args([
            "--nats-url",
            &harness.server.url(),
            "--worker-id",
            "doomed",
            "--queues",
            "sleep",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
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
