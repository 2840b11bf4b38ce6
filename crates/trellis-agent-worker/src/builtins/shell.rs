//! The `shell` handler: runs a command (no shell unless the command names one), writes its stdout
//! and stderr to the task's log line by line as they come, keeps a bounded copy of each for the
//! output, and kills the process when the task is cancelled.
//!
//! The command runs as the leader of a process group of its own, and everything in that group is
//! killed when the task ends in any way (done, cancelled, handed back, the worker stopping), so
//! nothing it started runs on unobserved. On Linux the command is also killed when the worker
//! process dies (`PR_SET_PDEATHSIG`), even by SIGKILL; what the command itself started before
//! that outlives it only if it left the group.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use trellis_proto::v1::LogSource;

use crate::logs::LineSplitter;
use crate::sdk::{Outcome, TaskContext};

/// Most bytes kept of each of stdout and stderr; the rest is read and dropped.
const CAPTURE_LIMIT: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellInput {
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// Runs `command` and completes with `{exit_code, stdout, stderr, stdout_truncated,
/// stderr_truncated}`, or with what the command wrote to `$TRELLIS_OUTPUT_FILE` (JSON) if it
/// wrote anything there; a non-zero exit fails the attempt (retryable). The outputs of the
/// task's dependencies are in `$TRELLIS_UPSTREAM_DIR/<task>.json`.
pub(super) async fn run(ctx: TaskContext) -> Outcome {
    let ShellInput { command, env, cwd } = match super::input(&ctx) {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    let Some((program, args)) = command.split_first() else {
        return Outcome::failed("shell command is empty", false);
    };
    let files = match Files::create(&ctx).await {
        Ok(files) => files,
        Err(error) => return Outcome::failed(error, true),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(&env)
        .env("TRELLIS_TASK_INSTANCE_ID", ctx.task_instance_id())
        .env("TRELLIS_IDEMPOTENCY_KEY", ctx.idempotency_key())
        .env("TRELLIS_UPSTREAM_DIR", files.upstream())
        .env("TRELLIS_OUTPUT_FILE", files.output())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Cancellation drops this future; the child must not outlive it.
        .kill_on_drop(true);
    if let Some(cwd) = &cwd {
        cmd.current_dir(cwd);
    }
    tie_to_worker(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        // A missing program or a bad working directory will not fix itself.
        Err(error) => {
            return Outcome::failed(format!("failed to start {program:?}: {error}"), false);
        }
    };
    let _group = child.id().map(Group);
    ctx.progress(0, format!("running {program}"));
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let cancel = ctx.cancellation().clone();
    let (status, (stdout, stdout_truncated), (stderr, stderr_truncated)) = tokio::select! {
        _ = cancel.cancelled() => {
            let _ = child.kill().await;
            return Outcome::failed("cancelled", false);
        }
        done = async {
            tokio::join!(
                child.wait(),
                capture(stdout, &ctx, LogSource::Stdout),
                capture(stderr, &ctx, LogSource::Stderr),
            )
        } => done,
    };
    let status = match status {
        Ok(status) => status,
        Err(error) => {
            return Outcome::failed(format!("failed to wait for {program:?}: {error}"), true);
        }
    };
    let exit_code = status.code();
    if !status.success() {
        let tail: String = stderr
            .lines()
            .last()
            .unwrap_or_default()
            .chars()
            .take(200)
            .collect();
        let how = exit_code.map_or_else(
            || "was killed by a signal".to_owned(),
            |code| format!("exited with status {code}"),
        );
        return Outcome::failed(format!("{program} {how}: {tail}"), true);
    }
    match files.read_output().await {
        Ok(Some(output)) => return Outcome::CompletedJson(output),
        Ok(None) => {}
        Err(error) => return Outcome::failed(error, false),
    }
    Outcome::Completed(json!({
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_truncated": stdout_truncated,
        "stderr_truncated": stderr_truncated,
    }))
}

/// The files a command shares with its task: `$TRELLIS_UPSTREAM_DIR/<task>.json`, the output of
/// each dependency, and `$TRELLIS_OUTPUT_FILE`, which the command may write to set the task's
/// output. A directory of its own per attempt, removed when dropped.
struct Files {
    dir: PathBuf,
}

impl Files {
    async fn create(ctx: &TaskContext) -> Result<Files, String> {
        let dir = std::env::temp_dir().join(format!(
            "trellis-shell-{}-{}",
            ctx.task_instance_id(),
            ctx.attempt()
        ));
        let files = Files { dir };
        let upstream = files.upstream();
        let failed =
            |error: std::io::Error| format!("cannot prepare {}: {error}", files.dir.display());
        tokio::fs::create_dir_all(&upstream).await.map_err(failed)?;
        for (task_id, output) in ctx.upstream_outputs() {
            // Plan task ids are made of letters, digits, `_`, `.` and `-`: a plain file name.
            tokio::fs::write(upstream.join(format!("{task_id}.json")), output)
                .await
                .map_err(failed)?;
        }
        Ok(files)
    }

    fn upstream(&self) -> PathBuf {
        self.dir.join("upstream")
    }

    fn output(&self) -> PathBuf {
        self.dir.join("output.json")
    }

    /// Returns what the command wrote to `$TRELLIS_OUTPUT_FILE`, checked to be JSON; `None` when
    /// it wrote nothing there.
    async fn read_output(&self) -> Result<Option<Bytes>, String> {
        let path = self.output();
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => return Ok(None),
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(format!("cannot read $TRELLIS_OUTPUT_FILE: {error}")),
        };
        if let Err(error) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
            return Err(format!(
                "$TRELLIS_OUTPUT_FILE is not JSON ({} bytes): {error}",
                bytes.len()
            ));
        }
        Ok(Some(Bytes::from(bytes)))
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The command's process group: killed whole when dropped, however the task ended.
pub(crate) struct Group(pub(crate) u32);

impl Drop for Group {
    // No safe wrapper for killpg exists in std or tokio.
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        let Ok(pgid) = libc::pid_t::try_from(self.0) else {
            return;
        };
        // SAFETY: killpg only sends a signal; the group is the one the child leads (its pid,
        // which is not reused while any member of the group lives). A group already gone
        // answers ESRCH, which is fine.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

/// Makes the command the leader of a new process group and, on Linux, has the kernel kill it
/// when the worker process dies.
// `pre_exec` is unsafe by signature (its closure runs between fork and exec), and std has no safe
// way to set a parent-death signal.
#[allow(unsafe_code)]
pub(crate) fn tie_to_worker(cmd: &mut Command) {
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let worker = std::process::id();
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: prctl and getppid are, and nothing allocates.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The worker died before the call: the signal will never come.
                if u32::try_from(libc::getppid()) != Ok(worker) {
                    return Err(std::io::Error::other("the worker is gone"));
                }
                Ok(())
            });
        }
    }
}

/// Reads a pipe to its end, writing each line to the task's log as `source` and keeping the first
/// [`CAPTURE_LIMIT`] bytes (lossy UTF-8).
async fn capture(
    pipe: Option<impl AsyncRead + Unpin>,
    ctx: &TaskContext,
    source: LogSource,
) -> (String, bool) {
    let Some(mut pipe) = pipe else {
        return (String::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut lines = LineSplitter::default();
    let mut log = |line, cut_from| ctx.log_output(source, line, cut_from);
    let mut chunk = [0u8; 8192];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                lines.feed(&chunk[..n], &mut log);
                let room = CAPTURE_LIMIT - kept.len();
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
    }
    lines.end(&mut log);
    (String::from_utf8_lossy(&kept).into_owned(), truncated)
}
