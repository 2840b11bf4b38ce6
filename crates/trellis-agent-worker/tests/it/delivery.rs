//! Delivery around the handlers: corrupt messages, reassignment after a worker dies, cancel,
//! heartbeats, graceful shutdown and unknown task types.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use trellis_agent_worker::{HandlerRegistry, Outcome, TaskContext};

use super::*;

#[tokio::test]
async fn a_corrupt_message_is_set_aside_and_the_next_one_runs() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["noop"], HandlerRegistry::with_builtins());
    harness
        .publish_raw(
            "noop",
            b"\xff\xff\xff this is not a TaskAssignment".to_vec(),
        )
        .await?;
    // Valid protobuf that is not a usable assignment (no instance id) is set aside too.
    harness.publish_raw("noop", Vec::new()).await?;
    let task = assignment("noop", json!("after"));
    harness.publish(&task).await?;
    let result = harness.result_of(&task.task_instance_id).await?;
    assert_eq!(completed_output(&result)?, json!("after"));
    harness.wait_until_queue_drained("noop").await?;
    worker.stop().await
}

/// A `sleep` handler that reports which worker started it.
fn reporting_sleep(
    worker_id: &'static str,
    started: tokio::sync::mpsc::UnboundedSender<&'static str>,
) -> HandlerRegistry {
    HandlerRegistry::new().with("sleep", move |ctx: TaskContext| {
        let started = started.clone();
        async move {
            let _ = started.send(worker_id);
            let ms = ctx.input()["ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Outcome::Completed(json!({"by": worker_id}))
        }
    })
}

#[tokio::test]
async fn a_task_of_a_dead_worker_reaches_another_after_the_ack_wait() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let first = harness.worker("w1", &["sleep"], reporting_sleep("w1", started_tx.clone()));
    let task = assignment("sleep", json!({"ms": 1500}));
    harness.publish(&task).await?;
    let who = tokio::time::timeout(SOON, started_rx.recv()).await?;
    assert_eq!(who, Some("w1"));
    let second = harness.worker("w2", &["sleep"], reporting_sleep("w2", started_tx));
    first.kill().await;
    let who = tokio::time::timeout(trellis_bus::TASK_ACK_WAIT + SOON, started_rx.recv()).await?;
    assert_eq!(who, Some("w2"));
    let result = harness.final_result_of(&task.task_instance_id).await?;
    assert_eq!(result.worker_id, "w2");
    assert_eq!(completed_output(&result)?, json!({"by": "w2"}));
    harness.wait_until_queue_drained("sleep").await?;
    second.stop().await
}

async fn cancel(harness: &Harness, task: &TaskAssignment) -> anyhow::Result<()> {
    let request = v1::CancelTask {
        execution_id: task.execution_id.clone(),
        task_instance_id: task.task_instance_id.clone(),
        attempt: task.attempt,
        reason: "execution cancelled".to_owned(),
        preempt: false,
    };
    harness
        .client
        .publish(
            subjects::cancel(&task.task_instance_id),
            request.encode_to_vec().into(),
        )
        .await?;
    harness.client.flush().await?;
    Ok(())
}

#[tokio::test]
async fn cancel_stops_a_running_sleep_and_shell() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["sleep", "shell"], HandlerRegistry::with_builtins());
    let pid_file = tempfile_path("shell-pid");
    let sleep = assignment("sleep", json!({"ms": 60_000}));
    let shell = assignment(
        "shell",
        json!({"command": ["sh", "-c", format!("echo $$ > {pid_file}; exec sleep 60")]}),
    );
    for task in [&sleep, &shell] {
        harness.publish(task).await?;
        heartbeat_listing(&harness.client, "w1", &task.task_instance_id).await?;
        cancel(&harness, task).await?;
        let result = harness.result_of(&task.task_instance_id).await?;
        let (error, retryable) = failure(&result)?;
        assert!(!retryable);
        assert!(error.contains("cancelled"), "{error}");
    }
    let pid = std::fs::read_to_string(&pid_file)?.trim().to_owned();
    wait_until_gone(&pid, SOON)
        .await
        .context("the shell's process survived the cancel")?;
    let _ = std::fs::remove_file(&pid_file);
    harness.wait_until_queue_drained("sleep").await?;
    worker.stop().await
}

fn tempfile_path(name: &str) -> String {
    std::env::temp_dir()
        .join(format!("trellis-{name}-{}", uuid::Uuid::now_v7()))
        .display()
        .to_string()
}

#[tokio::test]
async fn heartbeats_list_running_tasks_with_progress() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["sleep"], HandlerRegistry::with_builtins());
    let task = assignment("sleep", json!({"ms": 3000}));
    harness.publish(&task).await?;
    let beat = heartbeat_listing(&harness.client, "w1", &task.task_instance_id).await?;
    assert_eq!(beat.worker_id, "w1");
    assert_eq!(beat.queues, ["sleep"]);
    assert_eq!(beat.slots, 16);
    assert!(beat.memory_bytes > 0);
    assert!(!beat.host.is_empty());
    assert_eq!(beat.state, v1::WorkerState::Running as i32);
    let running = &beat.running[0];
    assert_eq!(running.execution_id, task.execution_id);
    assert_eq!(running.attempt, 1);
    assert_eq!(running.current_step, "sleeping");
    assert!(running.started_at_unix_ms > 0);
    completed_output(&harness.final_result_of(&task.task_instance_id).await?)?;
    worker.stop().await
}

#[tokio::test]
async fn shutdown_hands_unfinished_tasks_back_at_once() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let first = harness.worker("w1", &["sleep"], reporting_sleep("w1", started_tx.clone()));
    let task = assignment("sleep", json!({"ms": 60_000}));
    harness.publish(&task).await?;
    assert_eq!(
        tokio::time::timeout(SOON, started_rx.recv()).await?,
        Some("w1")
    );
    let stopped_at = tokio::time::Instant::now();
    first.stop().await?;
    // The grace period is 500 ms in these tests.
    assert!(stopped_at.elapsed() < Duration::from_secs(3));
    let second = harness.worker("w2", &["sleep"], reporting_sleep("w2", started_tx));
    // Handed back, not left to time out: the second worker gets it well before the ack wait.
    let who = tokio::time::timeout(trellis_bus::TASK_ACK_WAIT / 2, started_rx.recv()).await?;
    assert_eq!(who, Some("w2"));
    second.stop().await
}

#[tokio::test]
async fn an_unknown_task_type_fails_for_good_and_avoided_workers_still_run_alone()
-> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["noop"], HandlerRegistry::with_builtins());
    let mut unknown = assignment("teleport", json!(null));
    unknown.queue = "noop".to_owned();
    harness.publish(&unknown).await?;
    let (error, retryable) = failure(&harness.result_of(&unknown.task_instance_id).await?)?;
    assert!(!retryable);
    assert!(error.contains("teleport"), "{error}");

    // The only worker of the queue is avoided: it holds the task back a few times, then runs it.
    let mut avoided = assignment("noop", json!(1));
    avoided.avoid_worker_id = Some("w1".to_owned());
    harness.publish(&avoided).await?;
    let published_at = tokio::time::Instant::now();
    let result = harness.result_of(&avoided.task_instance_id).await?;
    assert!(published_at.elapsed() >= Duration::from_secs(3));
    assert_eq!(result.worker_id, "w1");
    worker.stop().await
}

/// Returns the next `TaskResult` on `results`.
async fn next_result(results: &mut Results) -> anyhow::Result<TaskResult> {
    let (result, _) = tokio::time::timeout(SOON, results.next())
        .await
        .context("no result within the time limit")??;
    Ok(result)
}

#[tokio::test]
async fn results_go_to_the_shard_the_assignment_names() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let mut shard_0 = Results::new(harness.client.subscribe(subjects::results(0)).await?);
    let mut shard_5 = Results::new(harness.client.subscribe(subjects::results(5)).await?);
    harness.client.flush().await?;
    // One configured shard: without a named shard every result goes to shard 0.
    let worker = harness.worker("w1", &["steps"], HandlerRegistry::with_builtins());

    let mut named = assignment("steps", json!({"count": 2}));
    named.results_shard = Some(5);
    harness.publish(&named).await?;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let result = next_result(&mut shard_5).await?;
        assert_eq!(result.task_instance_id, named.task_instance_id);
        outcomes.push(match result.outcome {
            Some(task_result::Outcome::StepCheckpoint(checkpoint)) => checkpoint.step,
            Some(task_result::Outcome::Completed(_)) => "completed".to_owned(),
            other => anyhow::bail!("unexpected outcome {other:?}"),
        });
    }
    assert_eq!(outcomes, ["step-1", "step-2", "completed"]);

    // Published after the named one finished: anything of it on shard 0 would come first.
    let hashed = assignment("steps", json!({"count": 1}));
    harness.publish(&hashed).await?;
    for _ in 0..2 {
        let result = next_result(&mut shard_0).await?;
        assert_eq!(result.task_instance_id, hashed.task_instance_id);
    }
    worker.stop().await
}

#[tokio::test]
async fn heartbeats_count_the_attempts_completed_and_failed() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["noop", "fail"], HandlerRegistry::with_builtins());
    let tasks = [
        assignment("noop", json!(1)),
        assignment("noop", json!(2)),
        assignment("fail", json!({"times": 1, "retryable": false})),
    ];
    for task in &tasks {
        harness.publish(task).await?;
        harness.final_result_of(&task.task_instance_id).await?;
    }
    let mut beats = harness.client.subscribe(subjects::heartbeat("w1")).await?;
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let message = tokio::time::timeout_at(deadline, beats.next())
            .await
            .context("no heartbeat counting the three attempts")?
            .context("heartbeat subscription ended")?;
        let beat = v1::WorkerHeartbeat::decode(message.payload.as_ref())?;
        if (beat.tasks_completed, beat.tasks_failed) == (2, 1) {
            break;
        }
        anyhow::ensure!(
            beat.tasks_completed <= 2 && beat.tasks_failed <= 1,
            "counted too many: {} completed, {} failed",
            beat.tasks_completed,
            beat.tasks_failed
        );
    }
    worker.stop().await
}

/// A queue's fast lane (`trellis.tasks.~.<queue>`) is served beside the queue: with the one
/// slot busy and four tasks waiting in the queue, a task sent to the fast lane runs next, not
/// after them.
#[tokio::test]
async fn a_task_on_the_fast_lane_runs_before_the_queue_that_waits() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker_with("w1", &["sleep"], HandlerRegistry::with_builtins(), |c| {
        c.slots = 1;
    });
    let queued: Vec<TaskAssignment> = (0..5)
        .map(|_| assignment("sleep", json!({"ms": 300})))
        .collect();
    for task in &queued {
        harness.publish(task).await?;
    }
    // The first of them is running now; the fast one arrives behind the other four.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fast = assignment("sleep", json!({"ms": 0}));
    harness
        .js
        .publish(subjects::fast_tasks("sleep"), fast.encode_to_vec().into())
        .await?
        .await?;
    let mut order = Vec::new();
    while order.len() < 6 {
        let (result, _) = tokio::time::timeout(SOON, harness.results.next())
            .await
            .context("results stop before all six tasks ended")??;
        order.push(result.task_instance_id);
    }
    let position = order
        .iter()
        .position(|id| *id == fast.task_instance_id)
        .context("the fast task never ran")?;
    assert!(
        position <= 1,
        "the fast task ended number {} of 6, behind the queue: {order:?}",
        position + 1
    );
    worker.stop().await
}

#[tokio::test]
async fn results_that_finish_together_share_a_message() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    // Queued before the worker starts: it takes them all at once, and their results pile up
    // while the first messages are on their way.
    let tasks: Vec<TaskAssignment> = (0..200).map(|i| assignment("noop", json!(i))).collect();
    for task in &tasks {
        harness.publish(task).await?;
    }
    let worker = harness.worker("w1", &["noop"], HandlerRegistry::with_builtins());
    let mut seen = std::collections::HashMap::new();
    while seen.len() < tasks.len() {
        let (result, msg_id) = tokio::time::timeout(SOON, harness.results.next())
            .await
            .context("results stop before every task ended")??;
        let expected = subjects::result_msg_id(&result.task_instance_id, 1, "completed");
        assert_eq!(msg_id, expected, "each result keeps its own message id");
        if let Some(earlier) = seen.insert(result.task_instance_id.clone(), msg_id) {
            anyhow::bail!("{} reported twice ({earlier})", result.task_instance_id);
        }
    }
    for task in &tasks {
        assert!(
            seen.contains_key(&task.task_instance_id),
            "no result for {}",
            task.task_instance_id
        );
    }
    assert!(
        harness.results.batches > 0,
        "200 results that finished together all went alone"
    );
    // Each task message is acknowledged once its batch is stored.
    harness.wait_until_queue_drained("noop").await?;
    worker.stop().await
}

#[tokio::test]
async fn a_batch_of_assignments_runs_each_once_and_is_acknowledged_whole() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let tasks: Vec<TaskAssignment> = (0..20).map(|i| assignment("noop", json!(i))).collect();
    harness
        .publish_batch(
            "noop",
            tasks.iter().map(|task| task.encode_to_vec()).collect(),
        )
        .await?;
    // Fewer slots than the batch has assignments: the rest wait for slots, not for another
    // delivery.
    let worker = harness.worker_with(
        "w1",
        &["noop"],
        HandlerRegistry::with_builtins(),
        |config| {
            config.slots = 3;
        },
    );
    let mut seen = std::collections::HashSet::new();
    for _ in &tasks {
        let (result, msg_id) = tokio::time::timeout(SOON, harness.results.next())
            .await
            .context("results stop before every task of the batch ended")??;
        let expected = subjects::result_msg_id(&result.task_instance_id, 1, "completed");
        assert_eq!(msg_id, expected, "each result keeps its own message id");
        assert!(
            seen.insert(result.task_instance_id.clone()),
            "{} reported twice",
            result.task_instance_id
        );
    }
    for task in &tasks {
        assert!(
            seen.contains(&task.task_instance_id),
            "no result for {}",
            task.task_instance_id
        );
    }
    // The one message is acknowledged once every result is stored, not delivered again.
    harness.wait_until_queue_drained("noop").await?;
    worker.stop().await
}

/// On a runtime of one thread (this test's) the worker runs each attempt where it dispatches it,
/// and a message of many assignments would hold the thread until its last one had run: what woke
/// meanwhile (another execution's offer, result or observer) waited behind all of them. It
/// yields part-way: a task the message's first attempt wakes runs before its second half starts
/// (without the yields, before its last attempt only).
#[tokio::test]
async fn a_large_batch_lets_what_woke_meanwhile_run_part_way_through() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let woke = Arc::new(tokio::sync::Notify::new());
    let ran = Arc::new(AtomicBool::new(false));
    let other = tokio::spawn({
        let (woke, ran) = (woke.clone(), ran.clone());
        async move {
            woke.notified().await;
            ran.store(true, Ordering::SeqCst);
        }
    });
    // Whether the other task had run when each attempt started, in the order they started.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut registry = HandlerRegistry::new();
    registry.register("mark", {
        let seen = seen.clone();
        move |_ctx: TaskContext| {
            let ran = ran.load(Ordering::SeqCst);
            let mut seen = seen.lock().expect("no handler panics holding it");
            if seen.is_empty() {
                woke.notify_one();
            }
            seen.push(ran);
            std::future::ready(Outcome::Completed(json!(null)))
        }
    });
    let tasks: Vec<TaskAssignment> = (0..128).map(|i| assignment("mark", json!(i))).collect();
    harness
        .publish_batch(
            "mark",
            tasks.iter().map(|task| task.encode_to_vec()).collect(),
        )
        .await?;
    // A slot for every assignment: none waits for one (a wait would let the other task run).
    let worker = harness.worker_with("w1", &["mark"], registry, |config| {
        config.slots = 256;
    });
    for _ in &tasks {
        tokio::time::timeout(SOON, harness.results.next())
            .await
            .context("results stop before every task of the batch ended")??;
    }
    let seen = seen.lock().expect("no handler panics holding it").clone();
    assert_eq!(seen.len(), tasks.len(), "each attempt ran once");
    // The first attempt that found the other task run: at most half-way through the message.
    let after = seen.iter().position(|ran| *ran);
    assert!(
        after.is_some_and(|at| at > 0 && at <= tasks.len() / 2),
        "the other task, woken by the message's first attempt, ran before attempt {after:?} \
         of {} started: the message held the thread too long",
        tasks.len()
    );
    other.await?;
    worker.stop().await
}
