//! `trellis pause | resume | cancel | retry | checkpoint | answer`: change the course of an
//! execution.
//!
//! Every command is one call with one path, [`run`]: connect to the coordinator, send the
//! command's request, and print one line made of the answer, or fail with the message and exit
//! code `Client::status_failure` gives. A command adds only its request and its line.

use std::io::{self, Write};

use clap::{Args, Subcommand};
use trellis_proto::v1::{
    AnswerQuestionRequest, CancelExecutionRequest, CheckpointExecutionRequest, CheckpointKind,
    CheckpointMetadata, PauseExecutionRequest, ResumeExecutionRequest, RetryExecutionRequest,
};

use super::Failure;
use crate::client::Coordinator;
use crate::render;

/// The control commands, flattened into `trellis`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Control {
    Pause(PauseArgs),
    Resume(ResumeArgs),
    Cancel(CancelArgs),
    Retry(RetryArgs),
    Checkpoint(CheckpointArgs),
    Answer(AnswerArgs),
}

/// Pause an execution: nothing new is dispatched; running tasks finish.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis pause 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis pause --reason \"database maintenance\" 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis resume 0190a5c4-7d1e-7000-8000-000000000001")]
pub struct PauseArgs {
    /// The execution id.
    pub execution_id: String,
    /// Why, recorded in the event log.
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// Resume a paused (or waiting-for-human) execution.
#[derive(Debug, Args)]
#[command(after_help = "Example:\n  trellis resume 0190a5c4-7d1e-7000-8000-000000000001")]
pub struct ResumeArgs {
    /// The execution id.
    pub execution_id: String,
    /// Who or why, recorded in the event log.
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// Cancel an execution: running tasks are asked to stop and the execution ends cancelled.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis cancel 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis cancel --reason \"wrong branch\" 0190a5c4-7d1e-7000-8000-000000000001")]
pub struct CancelArgs {
    /// The execution id.
    pub execution_id: String,
    /// Why, recorded in the event log.
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// Run a failed or cancelled execution again: only what did not complete runs, as run N+1.
#[derive(Debug, Args)]
#[command(
    long_about = "Run a failed or cancelled execution again as a new run (run N+1). Tasks that \
        completed keep their results and do not run again; every other task runs with new \
        instance ids. The earlier runs stay in the history: `trellis tree ID` shows them side by \
        side.",
    after_help = "Examples:\n  \
        trellis retry 0190a5c4-7d1e-7000-8000-000000000001\n  \
        trellis status 0190a5c4-7d1e-7000-8000-000000000001"
)]
pub struct RetryArgs {
    /// The execution id.
    pub execution_id: String,
}

/// Take a checkpoint of an execution now.
#[derive(Debug, Args)]
#[command(
    long_about = "Take a checkpoint of an execution now: a snapshot of its state (or the events \
        since the previous checkpoint), stored with a SHA-256 checksum by the checkpoint-store. \
        Checkpoints are also taken on an interval and whenever an execution pauses; recovery \
        starts from the latest good one.",
    after_help = "Example:\n  trellis checkpoint 0190a5c4-7d1e-7000-8000-000000000001"
)]
pub struct CheckpointArgs {
    /// The execution id.
    pub execution_id: String,
}

/// Answer a question a task asked; the task continues with the answer.
#[derive(Debug, Args)]
#[command(
    long_about = "Answer a question a task asked; the task continues as a new instance with the \
        answer. `trellis status ID` lists the open questions with their ids and options; when a \
        question has options, the answer must be one of them.",
    after_help = "Examples:\n  \
        trellis status 0190a5c4-7d1e-7000-8000-000000000001\n  \
        trellis answer 0190a5c4-7d1e-7000-8000-000000000001 0190a5c4-9f00-7000-8000-00000000000a yes\n  \
        trellis answer --by alice 0190a5c4-7d1e-7000-8000-000000000001 0190a5c4-9f00-7000-8000-00000000000a \"use the v2 API\""
)]
pub struct AnswerArgs {
    /// The execution id.
    pub execution_id: String,
    /// The question id, as `trellis status` shows it.
    pub question_id: String,
    /// The answer.
    pub answer: String,
    /// Who answers, recorded in the event log; by default $USER.
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
}

/// Runs a control command: one request to the coordinator, one line printed.
pub async fn run(coordinator_url: &str, command: Control) -> Result<(), Failure> {
    let what = command.subject();
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let client = &mut coordinator.client;
    let line = match command {
        Control::Pause(args) => client
            .pause_execution(PauseExecutionRequest {
                execution_id: args.execution_id,
                reason: args.reason,
            })
            .await
            .map(|response| state_line(&what, response.into_inner().state)),
        Control::Resume(args) => client
            .resume_execution(ResumeExecutionRequest {
                execution_id: args.execution_id,
                reason: args.reason,
            })
            .await
            .map(|response| state_line(&what, response.into_inner().state)),
        Control::Cancel(args) => client
            .cancel_execution(CancelExecutionRequest {
                execution_id: args.execution_id,
                reason: args.reason,
            })
            .await
            .map(|response| state_line(&what, response.into_inner().state)),
        Control::Retry(RetryArgs { execution_id }) => client
            .retry_execution(RetryExecutionRequest { execution_id })
            .await
            .map(|response| {
                format!(
                    "{what} is running again as run {}: only what did not complete runs",
                    response.into_inner().run_number
                )
            }),
        Control::Checkpoint(CheckpointArgs { execution_id }) => client
            .checkpoint_execution(CheckpointExecutionRequest { execution_id })
            .await
            .map(|response| checkpoint_line(&what, response.into_inner().checkpoint)),
        Control::Answer(args) => client
            .answer_question(AnswerQuestionRequest {
                execution_id: args.execution_id,
                question_id: args.question_id,
                answer: args.answer,
                answered_by: args
                    .by
                    .or_else(|| std::env::var("USER").ok())
                    .filter(|name| !name.is_empty())
                    .unwrap_or_else(|| "cli".to_owned()),
            })
            .await
            .map(|response| {
                let response = response.into_inner();
                format!(
                    "answered {what}: the task continues as instance {} (event {})",
                    response.task_instance_id, response.sequence
                )
            }),
    }
    .map_err(|status| coordinator.status_failure(&status, &what))?;
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    Ok(out.flush()?)
}

impl Control {
    /// Returns what the command acts on, as messages name it: `execution <id>`, or
    /// `question <id> of execution <id>`.
    fn subject(&self) -> String {
        match self {
            Self::Pause(PauseArgs { execution_id, .. })
            | Self::Resume(ResumeArgs { execution_id, .. })
            | Self::Cancel(CancelArgs { execution_id, .. })
            | Self::Retry(RetryArgs { execution_id })
            | Self::Checkpoint(CheckpointArgs { execution_id }) => {
                format!("execution {execution_id}")
            }
            Self::Answer(args) => format!(
                "question {} of execution {}",
                args.question_id, args.execution_id
            ),
        }
    }
}

/// The line after a pause, resume or cancel: the execution's state now.
fn state_line(what: &str, state: i32) -> String {
    format!("{what} is {}", render::execution_state_name(state))
}

/// The line after a checkpoint: what was stored.
fn checkpoint_line(what: &str, checkpoint: Option<CheckpointMetadata>) -> String {
    let Some(checkpoint) = checkpoint else {
        return format!("{what}: the coordinator answered without a checkpoint");
    };
    let kind = match CheckpointKind::try_from(checkpoint.kind) {
        Ok(CheckpointKind::Full) => "full",
        Ok(CheckpointKind::Delta) => "delta",
        _ => "unknown kind",
    };
    format!(
        "checkpoint {} of {what}: {kind}, up to event {}, {} bytes, sha256 {}",
        checkpoint.checkpoint_id,
        checkpoint.event_sequence,
        checkpoint.size_bytes,
        checkpoint
            .checksum_sha256
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}
