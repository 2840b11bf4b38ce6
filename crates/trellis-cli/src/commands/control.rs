//! `trellis pause | resume | cancel | retry | checkpoint | answer`: change the course of an
//! execution.

use std::io::{self, Write};

use clap::Args;
use trellis_proto::v1::{
    AnswerQuestionRequest, CancelExecutionRequest, CheckpointExecutionRequest,
    PauseExecutionRequest, ResumeExecutionRequest, RetryExecutionRequest,
};

use super::Failure;
use crate::client::Coordinator;
use crate::render;

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

/// Runs `trellis pause`.
pub async fn pause(coordinator_url: &str, args: PauseArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let what = format!("execution {}", args.execution_id);
    let response = coordinator
        .client
        .pause_execution(PauseExecutionRequest {
            execution_id: args.execution_id.clone(),
            reason: args.reason,
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, &what))?
        .into_inner();
    say(&format!(
        "{what} is {}",
        render::execution_state_name(response.state)
    ))
}

/// Runs `trellis resume`.
pub async fn resume(coordinator_url: &str, args: ResumeArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let what = format!("execution {}", args.execution_id);
    let response = coordinator
        .client
        .resume_execution(ResumeExecutionRequest {
            execution_id: args.execution_id.clone(),
            reason: args.reason,
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, &what))?
        .into_inner();
    say(&format!(
        "{what} is {}",
        render::execution_state_name(response.state)
    ))
}

/// Runs `trellis cancel`.
pub async fn cancel(coordinator_url: &str, args: CancelArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let what = format!("execution {}", args.execution_id);
    let response = coordinator
        .client
        .cancel_execution(CancelExecutionRequest {
            execution_id: args.execution_id.clone(),
            reason: args.reason,
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, &what))?
        .into_inner();
    say(&format!(
        "{what} is {}",
        render::execution_state_name(response.state)
    ))
}

/// Runs `trellis retry`.
pub async fn retry(coordinator_url: &str, args: RetryArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let what = format!("execution {}", args.execution_id);
    let response = coordinator
        .client
        .retry_execution(RetryExecutionRequest {
            execution_id: args.execution_id.clone(),
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, &what))?
        .into_inner();
    say(&format!(
        "{what} is running again as run {}: only what did not complete runs",
        response.run_number
    ))
}

/// Runs `trellis checkpoint`.
pub async fn checkpoint(coordinator_url: &str, args: CheckpointArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let what = format!("execution {}", args.execution_id);
    let response = coordinator
        .client
        .checkpoint_execution(CheckpointExecutionRequest {
            execution_id: args.execution_id.clone(),
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, &what))?
        .into_inner();
    let Some(checkpoint) = response.checkpoint else {
        return say(&format!(
            "{what}: the coordinator answered without a checkpoint"
        ));
    };
    let kind = match trellis_proto::v1::CheckpointKind::try_from(checkpoint.kind) {
        Ok(trellis_proto::v1::CheckpointKind::Full) => "full",
        Ok(trellis_proto::v1::CheckpointKind::Delta) => "delta",
        _ => "unknown kind",
    };
    say(&format!(
        "checkpoint {} of {what}: {kind}, up to event {}, {} bytes, sha256 {}",
        checkpoint.checkpoint_id,
        checkpoint.event_sequence,
        checkpoint.size_bytes,
        checkpoint
            .checksum_sha256
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

/// Runs `trellis answer`.
pub async fn answer(coordinator_url: &str, args: AnswerArgs) -> Result<(), Failure> {
    let answered_by = args
        .by
        .or_else(|| std::env::var("USER").ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "cli".to_owned());
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let what = format!(
        "question {} of execution {}",
        args.question_id, args.execution_id
    );
    let response = coordinator
        .client
        .answer_question(AnswerQuestionRequest {
            execution_id: args.execution_id,
            question_id: args.question_id,
            answer: args.answer,
            answered_by,
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, &what))?
        .into_inner();
    say(&format!(
        "answered {what}: the task continues as instance {} (event {})",
        response.task_instance_id, response.sequence
    ))
}

fn say(line: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    Ok(out.flush()?)
}
