//! `validate:` checks against separate processes (a coordinator, a worker, a real NATS, a local
//! HTTP service): checks at the three levels pass; a failing check fails the attempt and the
//! task's failure policy decides (a retry that then passes, a skip); every result is in the task
//! record, per attempt, and the checks' lines are in the task's log.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trellis_proto::v1;

use crate::system::{Options, System, is_terminal};

/// How long the execution may take.
const WAIT: Duration = Duration::from_secs(90);

/// Serves `GET /health` with 200 "ok" and everything else with 404, until the test ends.
async fn service() -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let n = stream.read(&mut request).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&request[..n]);
                let (status, body) = if request.starts_with("GET /health ") {
                    ("200 OK", "service ok")
                } else {
                    ("404 Not Found", "no such page")
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    Ok(port)
}

/// The record of plan task `task_id` whose instance ran last.
fn record<'g>(
    graph: &'g v1::ExecutionGraph,
    task_id: &str,
) -> anyhow::Result<&'g v1::TaskInstance> {
    graph
        .nodes
        .iter()
        .filter_map(|node| node.record.as_ref())
        .find(|record| record.task_id == task_id)
        .with_context(|| format!("no record of task {task_id}"))
}

/// `(name, level, passed)` of each check result.
fn verdicts(results: &[v1::CheckResult]) -> Vec<(String, &'static str, bool)> {
    results
        .iter()
        .map(|r| (r.name.clone(), v1::CheckLevel::label_of(r.level), r.passed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_pass_and_fail_at_every_level_and_the_failure_policy_decides() -> anyhow::Result<()>
{
    let port = service().await?;
    let marker = tempfile::tempdir()?;
    let marker = marker.path().join("ran-once");
    let plan = format!(
        r#"name: validated
options: {{failure: {{continue_on_partial_failure: true}}}}
tasks:
- id: build
  type: shell
  input: {{command: [sh, -c, 'echo built']}}
  validate:
  - {{name: lint, level: codebase, command: 'grep -q built "$TRELLIS_OUTPUT_FILE" && echo output has it'}}
  - {{name: health, level: api, http: {{url: "http://127.0.0.1:{port}/health", body_contains: ok}}}}
  - {{name: screen, level: ui, command: [sh, -c, 'echo page renders']}}
- id: flaky
  type: noop
  retry: {{max: 2, backoff: {{kind: constant, base: 10ms}}}}
  validate:
  - {{name: tests, level: codebase, command: 'if [ -e {marker} ]; then echo green; else touch {marker}; echo red; exit 1; fi'}}
- id: broken
  type: noop
  on_failure: [skip]
  validate:
  - {{name: missing, level: api, http: {{url: "http://127.0.0.1:{port}/missing"}}}}
  - {{name: slow, level: ui, command: 'sleep 30', timeout: 300ms}}
"#,
        marker = marker.display()
    );
    let system = System::start(Options {
        workers: 1,
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let id = system.start_plan(0, &plan).await?;
            let deadline = tokio::time::Instant::now() + WAIT;
            let ended = system
                .wait_until(0, &id, deadline, "the end of the execution", is_terminal)
                .await?;
            ensure!(
                ended.state == v1::ExecutionState::Completed as i32,
                "the execution should complete (broken is skipped): {}",
                ended.reason
            );
            let graph = system.graph(0, &id).await?;

            // Every check of `build` passed, at each level.
            let build = record(&graph, "build")?;
            ensure!(
                build.state == v1::TaskState::Completed as i32,
                "build: {build:?}"
            );
            ensure!(
                verdicts(&build.validation)
                    == [
                        ("lint".to_owned(), "codebase", true),
                        ("health".to_owned(), "api", true),
                        ("screen".to_owned(), "ui", true),
                    ],
                "build's checks: {:?}",
                build.validation
            );
            ensure!(
                build.validation[0].output.contains("output has it")
                    && build.validation[1].output.contains("service ok"),
                "the checks' outputs are kept: {:?}",
                build.validation
            );

            // `flaky` failed its check once, was retried by its policy, and passed.
            let flaky = record(&graph, "flaky")?;
            ensure!(
                flaky.state == v1::TaskState::Completed as i32 && flaky.attempt == 2,
                "flaky should complete at attempt 2: {flaky:?}"
            );
            ensure!(
                verdicts(&flaky.validation) == [("tests".to_owned(), "codebase", true)],
                "flaky's second attempt passed: {:?}",
                flaky.validation
            );
            let first = flaky
                .earlier_attempts
                .first()
                .context("flaky keeps its first attempt")?;
            ensure!(
                first
                    .error
                    .starts_with("validation: 1 of 1 checks failed: tests (codebase)")
                    && verdicts(&first.validation) == [("tests".to_owned(), "codebase", false)]
                    && first.validation[0].output.contains("red"),
                "flaky's first attempt failed validation: {first:?}"
            );

            // `broken` failed both checks (a 404 and a timeout) and its policy skipped it.
            let broken = record(&graph, "broken")?;
            ensure!(
                broken.state == v1::TaskState::Skipped as i32,
                "broken should be skipped: {broken:?}"
            );
            let checks = if broken.validation.is_empty() {
                &broken
                    .earlier_attempts
                    .last()
                    .context("broken's checks are recorded")?
                    .validation
            } else {
                &broken.validation
            };
            ensure!(
                verdicts(checks)
                    == [
                        ("missing".to_owned(), "api", false),
                        ("slow".to_owned(), "ui", false),
                    ],
                "broken's checks: {checks:?}"
            );
            ensure!(
                checks[0].output.contains("answered 404") && checks[1].output.contains("timed out"),
                "why each failed: {checks:?}"
            );
            ensure!(
                checks[1].duration_ms < 10_000,
                "the slow check is stopped at its timeout: {checks:?}"
            );

            // The checks wrote their lines to the task's log.
            let mut stream = system
                .client(0)?
                .get_task_logs(v1::GetTaskLogsRequest {
                    execution_id: id.clone(),
                    task_instance_id: build.task_instance_id.clone(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let mut lines = Vec::new();
            while let Some(item) = stream.message().await? {
                lines.extend(
                    item.batch
                        .into_iter()
                        .flat_map(|b| b.lines)
                        .filter(|l| l.source == v1::LogSource::Validation as i32)
                        .map(|l| l.text),
                );
            }
            ensure!(
                lines.iter().any(|l| l == "output has it")
                    && lines
                        .iter()
                        .any(|l| l.starts_with("check health (api) passed")),
                "the checks' log lines: {lines:?}"
            );
            Ok(())
        })
        .await
}
