//! Custom validation rules: a command run through `sh -c` with the task as JSON on stdin; exit
//! status 0 passes, anything else is a finding whose message is the first line of its output.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use trellis_core::backlog::BacklogTask;
use trellis_core::backlog::rules::{Finding, Rule, RuleKind};

/// How long a custom rule's command may run; past it the command is killed and the rule fails.
pub const CUSTOM_RULE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most characters of a command's output kept in a finding.
const MAX_MESSAGE_CHARS: usize = 300;

/// Runs a custom rule on `task`; `None` when it passes (or is not a custom rule).
pub async fn run(rule: &Rule, task: &BacklogTask) -> Option<Finding> {
    let RuleKind::Custom { command } = &rule.kind else {
        return None;
    };
    let fail = |message: String| {
        Some(Finding {
            rule: rule.name.clone(),
            severity: rule.severity,
            message,
        })
    };
    let json = match serde_json::to_vec(task) {
        Ok(json) => json,
        Err(err) => return fail(format!("rule {}: cannot encode the task: {err}", rule.name)),
    };
    let mut child = match tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(err) => return fail(format!("rule {}: cannot run {command:?}: {err}", rule.name)),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input closes the pipe early: not a failure.
        let _ = stdin.write_all(&json).await;
    }
    let output = match tokio::time::timeout(CUSTOM_RULE_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(err)) => return fail(format!("rule {}: {command:?} failed: {err}", rule.name)),
        Err(_) => {
            return fail(format!(
                "rule {}: {command:?} ran past {}s",
                rule.name,
                CUSTOM_RULE_TIMEOUT.as_secs()
            ));
        }
    };
    if output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(if output.stdout.is_empty() {
        &output.stderr
    } else {
        &output.stdout
    })
    .lines()
    .next()
    .unwrap_or_default()
    .chars()
    .take(MAX_MESSAGE_CHARS)
    .collect::<String>();
    let status = output
        .status
        .code()
        .map_or_else(|| "a signal".to_owned(), |code| format!("status {code}"));
    fail(if text.is_empty() {
        format!(
            "rule {} failed ({command:?} exited with {status})",
            rule.name
        )
    } else {
        format!("{text} (rule {}, {status})", rule.name)
    })
}
