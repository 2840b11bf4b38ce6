//! Each built-in handler end to end: assignment in, result out, task message acknowledged.

use serde_json::json;
use trellis_agent_worker::HandlerRegistry;
use trellis_agent_worker::v1::resume_context::ResumedAfter;
use trellis_agent_worker::v1::{self, ResumeContext, task_result};

use super::*;

#[tokio::test]
async fn noop_completes_with_its_input_and_acks_the_task() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["noop"], HandlerRegistry::with_builtins());
    let task = assignment("noop", json!({"x": 1, "nested": [true]}));
    harness.publish(&task).await?;
    let result = harness.result_of(&task.task_instance_id).await?;
    assert_eq!(
        completed_output(&result)?,
        json!({"x": 1, "nested": [true]})
    );
    assert_eq!(result.worker_id, "w1");
    assert_eq!(result.execution_id, task.execution_id);
    assert_eq!(result.attempt, 1);
    harness.wait_until_queue_drained("noop").await?;
    worker.stop().await
}

#[tokio::test]
async fn fail_fails_its_first_attempts_then_completes() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["fail"], HandlerRegistry::with_builtins());
    let first = assignment("fail", json!({"times": 1}));
    harness.publish(&first).await?;
    let (error, retryable) = failure(&harness.result_of(&first.task_instance_id).await?)?;
    assert!(retryable, "{error}");
    let second = next_attempt(&first);
    harness.publish(&second).await?;
    let result = harness.result_of(&second.task_instance_id).await?;
    assert_eq!(result.attempt, 2);
    assert_eq!(completed_output(&result)?, json!({"attempt": 2}));

    let fatal = assignment("fail", json!({"times": 3, "retryable": false}));
    harness.publish(&fatal).await?;
    let (_, retryable) = failure(&harness.result_of(&fatal.task_instance_id).await?)?;
    assert!(!retryable);
    worker.stop().await
}

#[tokio::test]
async fn fanout_spawns_a_group_then_completes_with_its_summary() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["fanout"], HandlerRegistry::with_builtins());
    let parent = assignment(
        "fanout",
        json!({"count": 3, "child": {"type": "noop", "input": {"n": 7}}, "rule": {"quorum": 2}}),
    );
    harness.publish(&parent).await?;
    let result = harness.result_of(&parent.task_instance_id).await?;
    let Some(task_result::Outcome::Spawned(spawned)) = result.outcome else {
        anyhow::bail!("expected a spawned result, got {:?}", result.outcome);
    };
    let group = spawned.group.context("spawned result without group")?;
    assert_eq!(group.members.len(), 3);
    assert!(
        group
            .members
            .iter()
            .all(|member| member.task_type == "noop")
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&group.members[0].input)?,
        json!({"n": 7})
    );
    let rule = group.rule.context("group without rule")?;
    assert_eq!(rule.kind, v1::CompletionRuleKind::Quorum as i32);
    assert_eq!(rule.quorum, 2);

    let mut resumed = assignment("fanout", json!({"count": 3, "child": {"type": "noop"}}));
    resumed.resumed_after_subtasks_group_id = Some(group.group_id.clone());
    resumed.resume = Some(ResumeContext {
        resumed_after: Some(ResumedAfter::GroupSummary(v1::GroupSummary {
            group_id: group.group_id,
            member_count: 3,
            succeeded: true,
            completed: 2,
            failed: 1,
            ..v1::GroupSummary::default()
        })),
        ..ResumeContext::default()
    });
    harness.publish(&resumed).await?;
    let result = harness.result_of(&resumed.task_instance_id).await?;
    assert_eq!(
        completed_output(&result)?,
        json!({"succeeded": true, "members": 3, "completed": 2, "failed": 1, "cancelled": 0})
    );
    worker.stop().await
}

#[tokio::test]
async fn shell_captures_output_and_fails_on_a_nonzero_exit() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["shell"], HandlerRegistry::with_builtins());
    let ok = assignment(
        "shell",
        json!({"command": ["sh", "-c", "echo \"hello $WHO\"; echo warn >&2; pwd"], "env": {"WHO": "trellis"}, "cwd": "/"}),
    );
    harness.publish(&ok).await?;
    let output = completed_output(&harness.result_of(&ok.task_instance_id).await?)?;
    assert_eq!(output["exit_code"], json!(0));
    assert_eq!(output["stdout"], json!("hello trellis\n/\n"));
    assert_eq!(output["stderr"], json!("warn\n"));

    let big = assignment(
        "shell",
        json!({"command": ["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x"]}),
    );
    harness.publish(&big).await?;
    let output = completed_output(&harness.result_of(&big.task_instance_id).await?)?;
    assert_eq!(output["stdout"].as_str().map(str::len), Some(64 * 1024));
    assert_eq!(output["stdout_truncated"], json!(true));

    let bad = assignment(
        "shell",
        json!({"command": ["sh", "-c", "echo broken >&2; exit 3"]}),
    );
    harness.publish(&bad).await?;
    let (error, retryable) = failure(&harness.result_of(&bad.task_instance_id).await?)?;
    assert!(retryable);
    assert!(
        error.contains("status 3") && error.contains("broken"),
        "{error}"
    );

    let missing = assignment("shell", json!({"command": ["/nonexistent/program"]}));
    harness.publish(&missing).await?;
    let (_, retryable) = failure(&harness.result_of(&missing.task_instance_id).await?)?;
    assert!(!retryable);
    worker.stop().await
}

#[tokio::test]
async fn question_asks_then_completes_with_the_answer() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["question"], HandlerRegistry::with_builtins());
    let ask = assignment(
        "question",
        json!({"text": "ship it?", "options": ["yes", "no"]}),
    );
    harness.publish(&ask).await?;
    let result = harness.result_of(&ask.task_instance_id).await?;
    let Some(task_result::Outcome::Question(asked)) = result.outcome else {
        anyhow::bail!("expected a question, got {:?}", result.outcome);
    };
    let question = asked.question.context("question result without question")?;
    assert_eq!(question.text, "ship it?");
    assert_eq!(question.options, ["yes", "no"]);
    assert!(!question.question_id.is_empty());

    let mut answered = assignment(
        "question",
        json!({"text": "ship it?", "options": ["yes", "no"]}),
    );
    answered.continues_task_instance_id = Some(ask.task_instance_id.clone());
    answered.resume = Some(ResumeContext {
        resumed_after: Some(ResumedAfter::HumanAnswer(v1::HumanAnswer {
            question_id: question.question_id,
            answer: "yes".to_owned(),
        })),
        ..ResumeContext::default()
    });
    harness.publish(&answered).await?;
    let output = completed_output(&harness.result_of(&answered.task_instance_id).await?)?;
    assert_eq!(output, json!({"answer": "yes"}));
    worker.stop().await
}

/// Serves one canned HTTP response per connection: the path picks the status.
async fn http_server() -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let n = socket.read(&mut request).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&request[..n]);
                let status = if request.starts_with("GET /404") {
                    "404 Not Found"
                } else if request.starts_with("GET /503") {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                };
                let body = if request.contains("idempotency-key:") {
                    r#"{"ok":true}"#
                } else {
                    r#"{"ok":"no key"}"#
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

#[tokio::test]
async fn http_completes_on_2xx_and_fails_by_status_class() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let base = http_server().await?;
    let worker = harness.worker("w1", &["http"], HandlerRegistry::with_builtins());
    let ok = assignment(
        "http",
        json!({"method": "POST", "url": format!("{base}/ok"), "body": {"a": 1}}),
    );
    harness.publish(&ok).await?;
    let output = completed_output(&harness.result_of(&ok.task_instance_id).await?)?;
    assert_eq!(output["status"], json!(200));
    assert_eq!(output["body"], json!({"ok": true}));

    for (path, retryable) in [("404", false), ("503", true)] {
        let task = assignment("http", json!({"url": format!("{base}/{path}")}));
        harness.publish(&task).await?;
        let (error, actual) = failure(&harness.result_of(&task.task_instance_id).await?)?;
        assert_eq!(actual, retryable, "{error}");
        assert!(error.contains(path), "{error}");
    }
    worker.stop().await
}
