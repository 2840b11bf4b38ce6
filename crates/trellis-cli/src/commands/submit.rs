//! `trellis submit`: check a plan locally, start an execution of it, and optionally follow it to
//! the end with a live progress bar or a JSON line per event.

use std::cell::OnceCell;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::ops::ControlFlow;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use trellis_proto::v1::start_execution_request::PlanSource;
use trellis_proto::v1::{
    ExecutionOptions, ExecutionState, GetExecutionRequest, ObserveExecutionResponse, Progress,
    StartExecutionRequest, StartExecutionResponse,
};

use super::{Failure, plan};
use crate::client::Coordinator;
use crate::render::{self, events, progress};

/// Start an execution of a plan.
#[derive(Debug, Args)]
#[command(
    long_about = "Start an execution of a plan.\n\n\
        The plan is compiled first (here, or by the planner service given with --planner, whose \
        compiled plan is then what the coordinator runs): an invalid plan prints every error and \
        exits 2 without contacting the coordinator. --param gives values to the plan's params. Otherwise the execution starts and its id is printed. With \
        --wait, follow it to the end with a live progress bar (counts by state, percent, ETA, \
        \"wave k of n\") and exit 0 if it completed, 1 if it failed or was cancelled.",
    after_help = "Examples:\n  \
        trellis submit examples/feature-x.yaml\n  \
        trellis submit --wait examples/seed-001.yaml\n  \
        trellis submit --planner http://127.0.0.1:7600 --param env=prod examples/services.yaml\n  \
        trellis submit --wait --json --label team=infra plan.yaml | jq -c 'select(.kind == \"task_failed\")'\n  \
        cat plan.json | trellis submit -"
)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub plan: plan::PlanArgs,
    /// Follow the execution until it ends; exit 0 if it completed, 1 otherwise.
    #[arg(long)]
    pub wait: bool,
    /// Print JSON: the start as one object, or with --wait one object per event line and a final
    /// summary object.
    #[arg(long)]
    pub json: bool,
    /// A label on the execution, shown in listings and usable as a filter (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Starting again with the same key returns the execution already started with it.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// The namespace to run in (default: the token's own, or `default` without authentication).
    #[arg(long, env = "TRELLIS_NAMESPACE", value_name = "NAME")]
    pub namespace: Option<String>,
}

/// Runs `trellis submit`.
pub async fn run(coordinator_url: &str, args: SubmitArgs) -> Result<(), Failure> {
    run_with_id(coordinator_url, args).await.map(|_| ())
}

/// Runs `trellis submit` and returns the execution id.
pub async fn run_with_id(coordinator_url: &str, args: SubmitArgs) -> Result<String, Failure> {
    let (spec, plan) = plan::load(
        &args.plan.file,
        &args.plan.params,
        args.plan.planner.as_deref(),
    )
    .await?;
    // Through a planner the coordinator gets the compiled plan; otherwise the spec, which it
    // compiles itself.
    let plan_source = if args.plan.planner.is_some() {
        PlanSource::Plan(trellis_wire::plan::to_proto(&plan))
    } else {
        PlanSource::Spec(spec)
    };

    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let request = StartExecutionRequest {
        plan_source: Some(plan_source),
        options: Some(ExecutionOptions {
            idempotency_key: args.idempotency_key.clone().unwrap_or_default(),
            labels: args.labels.iter().cloned().collect(),
            namespace: args.namespace.clone().unwrap_or_default(),
        }),
    };
    let what = format!("plan {:?}", plan.name);
    if !args.wait {
        let started = coordinator
            .client
            .start_execution(request)
            .await
            .map_err(|status| coordinator.status_failure(&status, &what))?
            .into_inner();
        print_started(&started, args.json)?;
        return Ok(started.execution_id);
    }

    // With --wait, one call starts the execution and follows it.
    let mode = if args.json {
        Mode::Json
    } else if io::stdout().is_terminal() && io::stderr().is_terminal() {
        Mode::Bar(new_bar())
    } else {
        Mode::Quiet
    };
    let mut tracker = progress::Tracker::new();
    let started_id = OnceCell::new();
    let watch = coordinator.run(
        request,
        &what,
        |started| {
            let _ = started_id.set(started.execution_id.clone());
            if args.json {
                // With --wait, JSON is one object per event and the summary.
                return Ok(());
            }
            print_started(started, false)
        },
        |item| show(item, &mut tracker, &mode),
    );
    let watched = tokio::select! {
        watched = watch => watched,
        _ = tokio::signal::ctrl_c() => Err(Failure::failed(match started_id.get() {
            Some(id) => format!(
                "stopped watching; the execution keeps running: `trellis events {id} --follow`"
            ),
            None => "stopped before the coordinator answered; the execution may have started: \
                `trellis list` shows it"
                .to_owned(),
        })),
    };
    if let Mode::Bar(bar) = &mode {
        bar.finish_and_clear();
    }
    let execution_id = watched?;
    finish(&mut coordinator, &execution_id, &tracker, &mode).await?;
    Ok(execution_id)
}

/// Prints a start's answer: the id, or with `json` the id and whether it is new.
fn print_started(started: &StartExecutionResponse, json: bool) -> Result<(), Failure> {
    let mut out = BufWriter::new(io::stdout().lock());
    if json {
        writeln!(
            out,
            "{}",
            json!({"execution_id": started.execution_id, "created": started.created})
        )?;
    } else {
        writeln!(out, "{}", started.execution_id)?;
    }
    out.flush()?;
    Ok(())
}

/// How `--wait` shows what happens.
#[derive(Debug)]
enum Mode {
    /// A live progress bar on stderr, for a terminal.
    Bar(ProgressBar),
    /// One JSON object per event on stdout.
    Json,
    /// Nothing until the end (stdout is a pipe or a file).
    Quiet,
}

fn new_bar() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{spinner} [{bar:30}] {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar.set_message("waiting for the first event");
    bar
}

/// Feeds one item of the execution's stream to `tracker` and shows progress; breaks once the
/// execution is over.
fn show(
    item: ObserveExecutionResponse,
    tracker: &mut progress::Tracker,
    mode: &Mode,
) -> Result<ControlFlow<()>, Failure> {
    tracker.apply(&item);
    match mode {
        Mode::Bar(bar) => {
            if let Some(snapshot) = tracker.snapshot() {
                bar.set_position((snapshot.percent.clamp(0.0, 100.0) * 10.0) as u64);
                bar.set_message(bar_message(snapshot, tracker));
            } else if let Some(event) = &item.event {
                // Replayed history carries no snapshot: say where the replay is.
                bar.set_message(format!(
                    "#{} {}",
                    event.sequence,
                    events::kind_name(event.kind.as_ref())
                ));
            }
        }
        Mode::Json => {
            if let Some(event) = &item.event {
                let mut out = io::stdout().lock();
                writeln!(out, "{}", events::json(event))?;
            }
        }
        Mode::Quiet => {}
    }
    // The last event of an execution ends the log; no need to wait for the stream to close.
    Ok(if tracker.is_over() {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    })
}

fn bar_message(snapshot: &Progress, tracker: &progress::Tracker) -> String {
    let line = progress::line(snapshot);
    match tracker.state() {
        ExecutionState::Paused if tracker.reason().is_empty() => format!("paused · {line}"),
        ExecutionState::Paused => format!("paused ({}) · {line}", tracker.reason()),
        ExecutionState::WaitingForHuman => format!("waiting for an answer · {line}"),
        _ => line,
    }
}

/// Prints the outcome and returns success only for a completed execution.
async fn finish(
    coordinator: &mut Coordinator,
    execution_id: &str,
    tracker: &progress::Tracker,
    mode: &Mode,
) -> Result<(), Failure> {
    let mut state = tracker.state();
    let mut reason = tracker.reason().to_owned();
    // The coordinator always sends a snapshot with the last event of an execution; it holds the
    // final counts and the reason.
    let final_snapshot = tracker
        .snapshot()
        .filter(|snapshot| snapshot.sequence >= tracker.last_sequence() && tracker.is_over());
    let progress = match final_snapshot {
        Some(snapshot) => snapshot.clone(),
        None => {
            // The stream ended without the last event and its snapshot (a coordinator that
            // closed it): ask for the summary instead.
            let execution = coordinator
                .client
                .get_execution(GetExecutionRequest {
                    execution_id: execution_id.to_owned(),
                })
                .await
                .map_err(|status| {
                    coordinator.status_failure(&status, &format!("execution {execution_id}"))
                })?
                .into_inner()
                .execution
                .unwrap_or_default();
            state = ExecutionState::try_from(execution.state).unwrap_or_default();
            reason.clone_from(&execution.reason);
            progress::of_execution(&execution)
        }
    };
    let state_name = render::execution_state_name(state as i32);
    let mut out = BufWriter::new(io::stdout().lock());
    match mode {
        Mode::Json => writeln!(
            out,
            "{}",
            json!({
                "execution_id": execution_id,
                "state": state_name,
                "reason": reason,
                "counts": render::counts_json(&progress.counts.unwrap_or_default()),
                "seconds": tracker.elapsed_ms() as f64 / 1000.0,
                "last_sequence": tracker.last_sequence(),
            })
        )?,
        Mode::Bar(_) | Mode::Quiet => {
            let took = render::format_duration_ms(tracker.elapsed_ms());
            let counts = progress::line(&Progress {
                waves: 0,
                eta_ms: None,
                ..progress
            });
            if reason.is_empty() {
                writeln!(out, "{state_name} in {took}: {counts}")?;
            } else {
                writeln!(out, "{state_name} in {took}: {reason} ({counts})")?;
            }
        }
    }
    out.flush()?;
    match state {
        ExecutionState::Completed => Ok(()),
        ExecutionState::Failed | ExecutionState::Cancelled => Err(Failure::silent()),
        _ => Err(Failure::failed(format!(
            "the event stream ended while execution {execution_id} is {state_name}; \
             watch again with `trellis events {execution_id} --follow`"
        ))),
    }
}

/// Parses `KEY=VALUE`.
fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(
            parse_label("team=infra"),
            Ok(("team".to_owned(), "infra".to_owned()))
        );
        assert_eq!(parse_label("k="), Ok(("k".to_owned(), String::new())));
        assert!(parse_label("=v").is_err());
        assert!(parse_label("novalue").is_err());
    }
}
