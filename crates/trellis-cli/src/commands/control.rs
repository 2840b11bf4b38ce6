//! `trellis pause | resume | pauses | drain | cancel | retry | checkpoint | answer`: change the
//! course of an execution, or of every execution on a queue, in a namespace or in the fleet.
//!
//! Every command is one call with one path, [`run`]: connect to the coordinator, send the
//! command's request, and print one line made of the answer, or fail with the message and exit
//! code `Client::status_failure` gives. A command adds only its request and its line.

use std::io::{self, Write};

use clap::ValueEnum;
use clap::{Args, Subcommand};
use trellis_proto::v1::{
    self, AnswerQuestionRequest, CancelExecutionRequest, CheckpointExecutionRequest,
    CheckpointKind, CheckpointMetadata, DrainWorkerRequest, ListPausesRequest,
    PauseExecutionRequest, PauseFleetRequest, PauseTarget, ResumeExecutionRequest,
    ResumeFleetRequest, RetryExecutionRequest, pause_target,
};

use super::Failure;
use crate::client::Coordinator;
use crate::render;

/// The control commands, flattened into `trellis`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Control {
    Pause(PauseArgs),
    Resume(ResumeArgs),
    Pauses(PausesArgs),
    Drain(DrainArgs),
    Cancel(CancelArgs),
    Retry(RetryArgs),
    Checkpoint(CheckpointArgs),
    Answer(AnswerArgs),
}

/// Pause an execution, one of its tasks or groups, a queue, a namespace or the whole fleet.
#[derive(Debug, Args)]
#[command(
    long_about = "Pause work: nothing the pause covers is dispatched until `trellis resume` with \
        the same target. Name an execution (all of it, or one plan task with --task, or one \
        subtask group with --group), or, across every execution and coordinator, a worker queue \
        (--queue), a namespace (--namespace) or everything (--all).\n\n\
        --mode drain (the default) lets running tasks finish. --mode preempt asks them to stop \
        before their next durable step; they run again from that step after the resume, losing \
        no completed step (a task without durable steps finishes as in drain).\n\n\
        `trellis pauses` lists the pauses of queues, namespaces and the fleet; `trellis status \
        ID` shows an execution's own.",
    after_help = "Examples:\n  \
        trellis pause 0190a5c4-7d1e-7000-8000-000000000001\n  \
        trellis pause --task build --mode preempt 0190a5c4-7d1e-7000-8000-000000000001\n  \
        trellis pause --group 0190a5c4-9f00-7000-8000-00000000000a 0190a5c4-7d1e-7000-8000-000000000001\n  \
        trellis pause --queue gpu --reason \"driver upgrade\"\n  \
        trellis pause --namespace team-a --mode preempt\n  \
        trellis pause --all --reason \"database maintenance\"\n  \
        trellis resume --all"
)]
pub struct PauseArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// What becomes of the tasks running now.
    #[arg(long, value_enum, default_value_t = Mode::Drain)]
    pub mode: Mode,
    /// Why, shown with the pause.
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// What a pause does to the tasks running when it is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Running tasks finish; nothing new starts.
    Drain,
    /// Running tasks stop before their next durable step and continue from it after the resume.
    Preempt,
}

/// What a pause or resume is about.
#[derive(Debug, Args)]
#[group(id = "target", required = true, multiple = true)]
pub struct TargetArgs {
    /// The execution id (with --task or --group: only that part of it).
    #[arg(group = "target", conflicts_with_all = ["queue", "namespace", "all"])]
    pub execution_id: Option<String>,
    /// Only this plan task of the execution (its id in the plan).
    #[arg(
        long,
        value_name = "TASK",
        requires = "execution_id",
        conflicts_with = "group"
    )]
    pub task: Option<String>,
    /// Only this subtask group of the execution (its id, as `trellis tree` shows it).
    #[arg(long, value_name = "GROUP", requires = "execution_id")]
    pub group: Option<String>,
    /// Every task on this worker queue, in every execution.
    #[arg(long, value_name = "QUEUE", group = "target", conflicts_with_all = ["namespace", "all"])]
    pub queue: Option<String>,
    /// Every execution of this namespace.
    #[arg(
        long,
        value_name = "NAMESPACE",
        group = "target",
        conflicts_with = "all"
    )]
    pub namespace: Option<String>,
    /// Everything: every execution on every queue.
    #[arg(long, group = "target")]
    pub all: bool,
}

impl TargetArgs {
    /// Returns the fleet target, or `None` for an execution.
    fn fleet(&self) -> Option<PauseTarget> {
        let target = if let Some(queue) = &self.queue {
            pause_target::Target::Queue(queue.clone())
        } else if let Some(namespace) = &self.namespace {
            pause_target::Target::Namespace(namespace.clone())
        } else if self.all {
            pause_target::Target::All(true)
        } else {
            return None;
        };
        Some(PauseTarget {
            target: Some(target),
        })
    }

    /// Returns true for one task or group of an execution.
    fn is_part(&self) -> bool {
        self.task.is_some() || self.group.is_some()
    }

    /// Returns what the command acts on, as messages name it.
    fn subject(&self) -> String {
        if let Some(queue) = &self.queue {
            return format!("queue {queue}");
        }
        if let Some(namespace) = &self.namespace {
            return format!("namespace {namespace}");
        }
        if self.all {
            return "the whole fleet".to_owned();
        }
        let execution = format!(
            "execution {}",
            self.execution_id.as_deref().unwrap_or_default()
        );
        match (&self.task, &self.group) {
            (Some(task), _) => format!("task {task} of {execution}"),
            (_, Some(group)) => format!("group {group} of {execution}"),
            _ => execution,
        }
    }
}

/// Resume what `trellis pause` paused, with the same target.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis resume 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis resume --task build 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis resume --queue gpu\n  \
    trellis resume --all")]
pub struct ResumeArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Who or why, recorded in the coordinator's log.
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// List the pauses of queues, namespaces and the fleet in force.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  trellis pauses\n  trellis pauses --json")]
pub struct PausesArgs {
    /// One JSON object per pause.
    #[arg(long)]
    pub json: bool,
}

/// Drain a worker before maintenance: it takes no new task, finishes the running ones, then exits.
#[derive(Debug, Args)]
#[command(
    long_about = "Drain a worker before maintenance: it takes no new task, finishes the ones it \
        runs (reporting `draining` meanwhile in `trellis workers`), then exits. Its queue's other \
        workers take the work. In Kubernetes the same happens on a pod's termination \
        (SIGTERM), within terminationGracePeriodSeconds.",
    after_help = "Examples:\n  trellis workers\n  trellis drain worker-7f9c-4242 --reason \"kernel update\""
)]
pub struct DrainArgs {
    /// The worker id, as `trellis workers` shows it.
    pub worker_id: String,
    /// Why, logged by the worker.
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
        Control::Pause(args) => {
            let mode = match args.mode {
                Mode::Drain => v1::PauseMode::Drain,
                Mode::Preempt => v1::PauseMode::Preempt,
            };
            match args.target.fleet() {
                Some(target) => client
                    .pause_fleet(PauseFleetRequest {
                        target: Some(target),
                        mode: mode as i32,
                        reason: args.reason,
                    })
                    .await
                    .map(|_| paused_line(&what, args.mode)),
                None => {
                    let part = args.target.is_part();
                    client
                        .pause_execution(PauseExecutionRequest {
                            execution_id: args.target.execution_id.unwrap_or_default(),
                            reason: args.reason,
                            task_id: args.target.task.unwrap_or_default(),
                            group_id: args.target.group.unwrap_or_default(),
                            mode: mode as i32,
                        })
                        .await
                        .map(|response| {
                            if part {
                                paused_line(&what, args.mode)
                            } else {
                                format!(
                                    "{}; {}",
                                    state_line(&what, response.into_inner().state),
                                    mode_meaning(args.mode)
                                )
                            }
                        })
                }
            }
        }
        Control::Resume(args) => match args.target.fleet() {
            Some(target) => client
                .resume_fleet(ResumeFleetRequest {
                    target: Some(target),
                })
                .await
                .map(|response| {
                    if response.into_inner().resumed {
                        format!("resumed {what}: its tasks are dispatched again")
                    } else {
                        format!("{what} was not paused; nothing changed")
                    }
                }),
            None => {
                let part = args.target.is_part();
                client
                    .resume_execution(ResumeExecutionRequest {
                        execution_id: args.target.execution_id.unwrap_or_default(),
                        reason: args.reason,
                        task_id: args.target.task.unwrap_or_default(),
                        group_id: args.target.group.unwrap_or_default(),
                    })
                    .await
                    .map(|response| {
                        if part {
                            format!("resumed {what}: its tasks are dispatched again")
                        } else {
                            state_line(&what, response.into_inner().state)
                        }
                    })
            }
        },
        Control::Pauses(args) => client
            .list_pauses(ListPausesRequest {})
            .await
            .map(|response| pauses_text(&response.into_inner().pauses, args.json)),
        Control::Drain(args) => client
            .drain_worker(DrainWorkerRequest {
                worker_id: args.worker_id,
                reason: args.reason,
            })
            .await
            .map(|_| {
                format!("{what} is draining: it takes no new task and exits once its running tasks are done")
            }),
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
            Self::Pause(PauseArgs { target, .. }) | Self::Resume(ResumeArgs { target, .. }) => {
                target.subject()
            }
            Self::Pauses(_) => "the pauses".to_owned(),
            Self::Drain(args) => format!("worker {}", args.worker_id),
            Self::Cancel(CancelArgs { execution_id, .. })
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

/// The line after a pause of part of an execution or of the fleet.
fn paused_line(what: &str, mode: Mode) -> String {
    format!("paused {what}: {}", mode_meaning(mode))
}

/// What a pause in `mode` does, in words.
fn mode_meaning(mode: Mode) -> &'static str {
    match mode {
        Mode::Drain => "nothing new starts; running tasks finish (drain)",
        Mode::Preempt => {
            "nothing new starts; running tasks stop before their next durable step and continue \
             from it after the resume (preempt)"
        }
    }
}

/// Lists fleet pauses: a table, or one JSON object per line.
fn pauses_text(pauses: &[v1::FleetPause], json: bool) -> String {
    let target_of =
        |pause: &v1::FleetPause| match pause.target.as_ref().and_then(|t| t.target.as_ref()) {
            Some(pause_target::Target::Queue(queue)) => ("queue", queue.clone()),
            Some(pause_target::Target::Namespace(namespace)) => ("namespace", namespace.clone()),
            Some(pause_target::Target::All(_)) | None => ("all", String::new()),
        };
    let mode_of = render::events::pause_mode_name;
    if json {
        return pauses
            .iter()
            .map(|pause| {
                let (kind, name) = target_of(pause);
                serde_json::json!({
                    "target": kind,
                    "name": name,
                    "mode": mode_of(pause.mode),
                    "reason": pause.reason,
                    "since_unix_ms": pause.since_unix_ms,
                    "by": pause.by,
                })
                .to_string()
            })
            .collect::<Vec<_>>()
            .join("\n");
    }
    if pauses.is_empty() {
        return "no queue, namespace or fleet is paused".to_owned();
    }
    let mut lines = vec![format!(
        "{:<10} {:<20} {:<8} {:<24} {:<12} REASON",
        "TARGET", "NAME", "MODE", "SINCE", "BY"
    )];
    for pause in pauses {
        let (kind, name) = target_of(pause);
        lines.push(format!(
            "{kind:<10} {:<20} {:<8} {:<24} {:<12} {}",
            if name.is_empty() { "-" } else { &name },
            mode_of(pause.mode),
            render::format_time(pause.since_unix_ms),
            pause.by,
            pause.reason
        ));
    }
    lines.join("\n")
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
