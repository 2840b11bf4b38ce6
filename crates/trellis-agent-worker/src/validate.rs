//! A task's `validate:` checks, run by the worker after the handler succeeds and before the
//! result goes out (seed 001's three test levels: codebase, api, ui).
//!
//! Every check runs, in the declared order, each bounded by its timeout: a command (the task's
//! output is in the file `$TRELLIS_OUTPUT_FILE`) passes on exit status 0, a request on the
//! expected status and body. What each printed or answered goes to the task's log (source
//! `validation`) and its last [`OUTPUT_LIMIT`] bytes into its result. With one failed, the
//! attempt fails (retryable, error "validation: ...") and the task's failure policy decides; the
//! results travel in `TaskResult.validation` either way. The whole run is inside the attempt, so
//! a cancel or the task's deadline stops a check too.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use trellis_proto::v1;

use crate::builtins::{Group, http_client, tie_to_worker};
use crate::logs::LineSplitter;
use crate::sdk::{Outcome, Running};

/// Most bytes of a check's output kept in its result: the end, where the verdict usually is.
pub(crate) const OUTPUT_LIMIT: usize = 4096;

/// Runs `checks` on a completed outcome and returns the outcome to report with the checks'
/// results: the same completion when every check passed, a failure naming the first that did
/// not otherwise. Any other outcome, or no checks, is returned as is with no results.
pub(crate) async fn validate(
    checks: &[v1::Check],
    outcome: Outcome,
    running: &Running,
) -> (Outcome, Vec<v1::CheckResult>) {
    if checks.is_empty() {
        return (outcome, Vec::new());
    }
    let output = match &outcome {
        Outcome::Completed(value) => Bytes::from(value.to_string()),
        Outcome::CompletedJson(bytes) => bytes.clone(),
        _ => return (outcome, Vec::new()),
    };
    // Boxed: running checks is a large future (commands, HTTP requests) that most attempts never
    // reach; inline, every attempt's future would carry (and every move of it copy) its size.
    Box::pin(run_checks(checks, outcome, output, running)).await
}

/// Runs the checks on a completed attempt's `output` ([`validate`]).
async fn run_checks(
    checks: &[v1::Check],
    outcome: Outcome,
    output: Bytes,
    running: &Running,
) -> (Outcome, Vec<v1::CheckResult>) {
    let file = OutputFile::write(running, &output).await;
    let mut results = Vec::with_capacity(checks.len());
    for check in checks {
        let level = v1::CheckLevel::label_of(check.level);
        running.log.write(
            v1::LogSource::Validation,
            &format!("check {} ({level}) running", check.name),
        );
        let began = Instant::now();
        let timeout = Duration::from_millis(check.timeout_ms.max(1));
        let verdict = match &check.probe {
            Some(v1::check::Probe::Command(command)) => {
                run_command(&command.argv, &file, running, &check.name, timeout).await
            }
            Some(v1::check::Probe::Http(http)) => request(http, timeout).await,
            None => Verdict::fail("the check has no command and no request"),
        };
        let duration_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        let verdict = verdict.within(&file);
        running.log.write(
            v1::LogSource::Validation,
            &format!(
                "check {} ({level}) {} in {duration_ms} ms{}",
                check.name,
                if verdict.passed { "passed" } else { "failed" },
                verdict
                    .reason
                    .as_deref()
                    .map(|why| format!(": {why}"))
                    .unwrap_or_default()
            ),
        );
        results.push(v1::CheckResult {
            name: check.name.clone(),
            level: check.level,
            passed: verdict.passed,
            duration_ms,
            output: verdict.output,
        });
    }
    drop(file);
    let failed: Vec<String> = checks
        .iter()
        .zip(&results)
        .filter(|(_, result)| !result.passed)
        .map(|(check, result)| {
            let last = result.output.lines().last().unwrap_or_default();
            let last: String = last.chars().take(200).collect();
            format!(
                "{} ({}): {last}",
                check.name,
                v1::CheckLevel::label_of(check.level)
            )
        })
        .collect();
    if failed.is_empty() {
        return (outcome, results);
    }
    let error = format!(
        "validation: {} of {} checks failed: {}",
        failed.len(),
        checks.len(),
        failed.join("; ")
    );
    (Outcome::failed(error, true), results)
}

/// How one check went.
struct Verdict {
    passed: bool,
    /// Why it failed, in a few words (shown in the log line that ends the check).
    reason: Option<String>,
    /// The end of what it printed or answered.
    output: String,
}

impl Verdict {
    fn pass(output: String) -> Self {
        Verdict {
            passed: true,
            reason: None,
            output,
        }
    }

    fn fail(reason: impl Into<String>) -> Self {
        let reason = reason.into();
        Verdict {
            passed: false,
            output: reason.clone(),
            reason: Some(reason),
        }
    }

    /// Keeps the last [`OUTPUT_LIMIT`] bytes of the output, and says when the output file could
    /// not be written (a command then could not read it).
    fn within(mut self, file: &OutputFile) -> Self {
        if !self.passed
            && let Some(error) = &file.error
        {
            self.output.push_str(&format!(
                "\n(the output file could not be written: {error})"
            ));
        }
        self.output = tail(&self.output, OUTPUT_LIMIT);
        self
    }
}

/// Returns the last `limit` bytes of `text`, cut at a character boundary.
fn tail(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

/// The task's output in a file of its own for the checks' commands; removed when dropped.
struct OutputFile {
    path: PathBuf,
    error: Option<String>,
}

impl OutputFile {
    async fn write(running: &Running, output: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!(
            "trellis-output-{}-{}.json",
            running.task_instance_id, running.attempt
        ));
        let error = tokio::fs::write(&path, output)
            .await
            .err()
            .map(|error| error.to_string());
        OutputFile { path, error }
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs a check's command: stdout and stderr go to the log line by line and are kept (their
/// end) as its output; it passes on exit status 0 within `timeout`.
async fn run_command(
    argv: &[String],
    file: &OutputFile,
    running: &Running,
    name: &str,
    timeout: Duration,
) -> Verdict {
    let Some((program, args)) = argv.split_first() else {
        return Verdict::fail("the check's command is empty");
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("TRELLIS_OUTPUT_FILE", &file.path)
        .env("TRELLIS_TASK_INSTANCE_ID", &running.task_instance_id)
        .env("TRELLIS_CHECK_NAME", name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    tie_to_worker(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(error) => return Verdict::fail(format!("failed to start {program:?}: {error}")),
    };
    // Everything the command started dies with the check, however it ends.
    let _group = child.id().map(Group);
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let run = async {
        let (status, mut out, err) = tokio::join!(
            child.wait(),
            capture(stdout, running),
            capture(stderr, running)
        );
        out.push_str(&err);
        (status, out)
    };
    let Ok((status, printed)) = tokio::time::timeout(timeout, run).await else {
        return Verdict::fail(format!("timed out after {}", format_args!("{timeout:?}")));
    };
    match status {
        Ok(status) if status.success() => Verdict::pass(printed),
        Ok(status) => {
            let how = status.code().map_or_else(
                || "was killed by a signal".to_owned(),
                |code| format!("exited with status {code}"),
            );
            Verdict {
                passed: false,
                reason: Some(format!("{program} {how}")),
                output: if printed.is_empty() {
                    format!("{program} {how}")
                } else {
                    printed
                },
            }
        }
        Err(error) => Verdict::fail(format!("failed to wait for {program:?}: {error}")),
    }
}

/// Reads a pipe to its end, writing each line to the log (source `validation`) and keeping
/// the last [`OUTPUT_LIMIT`] bytes or so.
async fn capture(pipe: Option<impl AsyncRead + Unpin>, running: &Running) -> String {
    let Some(mut pipe) = pipe else {
        return String::new();
    };
    let mut kept: Vec<u8> = Vec::new();
    let mut lines = LineSplitter::default();
    let mut log = |line, cut_from| running.log.push(v1::LogSource::Validation, line, cut_from);
    let mut chunk = [0u8; 8192];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                lines.feed(&chunk[..n], &mut log);
                kept.extend_from_slice(&chunk[..n]);
                if kept.len() > 2 * OUTPUT_LIMIT {
                    kept.drain(..kept.len() - OUTPUT_LIMIT);
                }
            }
        }
    }
    lines.end(&mut log);
    String::from_utf8_lossy(&kept).into_owned()
}

/// Sends a check's request: it passes when the answer has the expected status and, if asked,
/// a body containing the expected text.
async fn request(http: &v1::HttpProbe, timeout: Duration) -> Verdict {
    let method = match reqwest::Method::from_bytes(http.method.as_bytes()) {
        Ok(method) => method,
        Err(_) => return Verdict::fail(format!("{:?} is not an HTTP method", http.method)),
    };
    let answer = http_client()
        .request(method.clone(), &http.url)
        .timeout(timeout)
        .send()
        .await;
    let response = match answer {
        Ok(response) => response,
        Err(error) if error.is_timeout() => {
            return Verdict::fail(format!(
                "{method} {} timed out after {}",
                http.url,
                format_args!("{timeout:?}")
            ));
        }
        Err(error) => return Verdict::fail(format!("{method} {} failed: {error}", http.url)),
    };
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    let shown = format!(
        "{method} {} answered {status}\n{}",
        http.url,
        tail(&body, 2048)
    );
    if u32::from(status) != http.status {
        return Verdict {
            passed: false,
            reason: Some(format!("answered {status}, expected {}", http.status)),
            output: shown,
        };
    }
    if let Some(expected) = &http.body_contains
        && !body.contains(expected.as_str())
    {
        return Verdict {
            passed: false,
            reason: Some(format!("the body does not contain {expected:?}")),
            output: shown,
        };
    }
    Verdict::pass(shown)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn running() -> Running {
        let assignment = v1::TaskAssignment {
            execution_id: "e".to_owned(),
            task_instance_id: uuid::Uuid::now_v7().to_string(),
            attempt: 1,
            ..Default::default()
        };
        Running::new(&assignment, 0, None, (0, "results".into()), None)
    }

    fn command(name: &str, level: v1::CheckLevel, script: &str, timeout_ms: u64) -> v1::Check {
        v1::Check {
            name: name.to_owned(),
            level: level.into(),
            probe: Some(v1::check::Probe::Command(v1::CommandProbe {
                argv: vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()],
            })),
            timeout_ms,
        }
    }

    /// Every attempt awaits `validate`, inside the attempt's future that is moved (copied) as
    /// it is spawned: what it carries for the checks most attempts never run stays boxed.
    #[test]
    fn an_attempt_without_checks_carries_no_room_for_them() {
        let running = running();
        let future = validate(&[], Outcome::Completed(json!(1)), &running);
        let size = size_of_val(&future);
        assert!(size <= 512, "validate's future takes {size} bytes");
    }

    #[tokio::test]
    async fn passing_checks_keep_the_completion_and_read_the_output() {
        let running = running();
        let checks = [
            command(
                "reads",
                v1::CheckLevel::Codebase,
                r#"grep -q '"answer":42' "$TRELLIS_OUTPUT_FILE" && echo found it"#,
                10_000,
            ),
            command("ui", v1::CheckLevel::Ui, "echo fine", 10_000),
        ];
        let (outcome, results) =
            validate(&checks, Outcome::Completed(json!({"answer": 42})), &running).await;
        assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
        assert!(results.iter().all(|r| r.passed), "{results:?}");
        assert_eq!(results[0].output, "found it\n");
        assert_eq!(results[1].level, v1::CheckLevel::Ui as i32);
    }

    #[tokio::test]
    async fn a_failed_or_slow_check_fails_the_attempt_and_every_check_runs() {
        let running = running();
        let checks = [
            command(
                "tests",
                v1::CheckLevel::Codebase,
                "echo 3 failed >&2; exit 1",
                10_000,
            ),
            command("slow", v1::CheckLevel::Ui, "sleep 20", 200),
            command("after", v1::CheckLevel::Codebase, "echo still ran", 10_000),
        ];
        let began = Instant::now();
        let (outcome, results) = validate(
            &checks,
            Outcome::CompletedJson(Bytes::from_static(b"{}")),
            &running,
        )
        .await;
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the slow one is cut at its timeout"
        );
        let Outcome::Failed { error, retryable } = outcome else {
            panic!("the attempt should fail: {outcome:?}");
        };
        assert!(retryable);
        assert_eq!(
            error,
            "validation: 2 of 3 checks failed: tests (codebase): 3 failed; slow (ui): timed out after 200ms"
        );
        let passed: Vec<bool> = results.iter().map(|r| r.passed).collect();
        assert_eq!(passed, [false, false, true]);
    }

    #[tokio::test]
    async fn other_outcomes_are_not_checked() {
        let running = running();
        let checks = [command("x", v1::CheckLevel::Codebase, "exit 1", 1000)];
        let (outcome, results) = validate(&checks, Outcome::failed("boom", true), &running).await;
        assert!(matches!(outcome, Outcome::Failed { .. }) && results.is_empty());
    }

    #[test]
    fn tail_keeps_the_end_at_a_character_boundary() {
        assert_eq!(tail("short", 10), "short");
        assert_eq!(tail("abcdef", 3), "def");
        // "é" is two bytes: a cut inside it moves past it.
        assert_eq!(tail("aéb", 2), "b");
    }
}
