//! `trellis status | list | tree | events`: look at executions without changing them.

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};
use std::ops::ControlFlow;

use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use trellis_proto::v1::{Execution, ExecutionState, ListExecutionsRequest, PageRequest};

use super::Failure;
use crate::client::Coordinator;
use crate::render::{self, checks, events, progress, tree};

/// Show one execution: state, progress, times, usage and open questions.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis status 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis status --json 0190a5c4-7d1e-7000-8000-000000000001 | jq .counts")]
pub struct StatusArgs {
    /// The execution id, as printed by `trellis submit`.
    pub execution_id: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// List executions, newest first.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis list\n  \
    trellis list --state running --state paused\n  \
    trellis list --json --limit 500 | jq -r '.executions[].execution_id'")]
pub struct ListArgs {
    /// Only executions in this state (repeatable).
    #[arg(long, value_enum)]
    pub state: Vec<StateFilter>,
    /// Only executions whose plan name contains this text, ignoring case.
    #[arg(long, value_name = "TEXT")]
    pub name: Option<String>,
    /// Only executions of this namespace (a token sees only its own anyway).
    #[arg(long, value_name = "NAME")]
    pub namespace: Option<String>,
    /// At most this many executions.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// An execution state, as `--state` takes it.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateFilter {
    Pending,
    Running,
    Paused,
    WaitingForHuman,
    Completed,
    Failed,
    Cancelled,
}

impl From<StateFilter> for ExecutionState {
    fn from(filter: StateFilter) -> Self {
        match filter {
            StateFilter::Pending => Self::Pending,
            StateFilter::Running => Self::Running,
            StateFilter::Paused => Self::Paused,
            StateFilter::WaitingForHuman => Self::WaitingForHuman,
            StateFilter::Completed => Self::Completed,
            StateFilter::Failed => Self::Failed,
            StateFilter::Cancelled => Self::Cancelled,
        }
    }
}

/// Show an execution as a tree: task instances, the subtask groups they spawned, and the parents
/// resumed after them.
#[derive(Debug, Args)]
#[command(
    long_about = "Show an execution as a tree: task instances, the subtask groups they spawned, \
        and the parents resumed after them.\n\n\
        Each line is an instance (`task_id [state] attempt n`) or a group \
        (`group <id> (k subtasks, rule)`); a group's members hang under it, and the parent's \
        instance resumed after the group follows it as `resumed: task_id ...`.",
    after_help = "Examples:\n  \
        trellis tree 0190a5c4-7d1e-7000-8000-000000000001\n  \
        trellis tree --run 2 0190a5c4-7d1e-7000-8000-000000000001\n  \
        trellis tree --json 0190a5c4-7d1e-7000-8000-000000000001 | jq '.nodes | length'"
)]
pub struct TreeArgs {
    /// The execution id.
    pub execution_id: String,
    /// Only this run; by default every run.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub run: u32,
    /// Print the flat graph (nodes and groups pointing at each other by index) as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Print an execution's event log, and optionally follow it live.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis events 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis events --follow --from 120 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis events --json 0190a5c4-7d1e-7000-8000-000000000001 | jq -c 'select(.kind == \"task_failed\")'")]
pub struct EventsArgs {
    /// The execution id.
    pub execution_id: String,
    /// The first event sequence to print (the log starts at 1).
    #[arg(long, value_name = "SEQ", default_value_t = 1)]
    pub from: u64,
    /// Keep printing new events as they happen, until the execution ends.
    #[arg(long)]
    pub follow: bool,
    /// Print one JSON object per event line.
    #[arg(long)]
    pub json: bool,
}

/// Runs `trellis status`.
pub async fn status(coordinator_url: &str, args: StatusArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let execution = coordinator.execution(&args.execution_id).await?;
    // The checks live in the task records: read them from the graph, when it can be had (the
    // status is worth printing without them).
    let checked = coordinator
        .graph(&args.execution_id, 0)
        .await
        .map(|graph| checks::summary(&graph))
        .unwrap_or_default();
    let mut out = BufWriter::new(io::stdout().lock());
    if args.json {
        let mut object = execution_json(&execution);
        object["checks"] = json!({
            "passed": checked.passed,
            "failed": checked.failed.iter().map(|(task, check, level)| {
                json!({"task_id": task, "name": check, "level": level})
            }).collect::<Vec<_>>(),
        });
        writeln!(out, "{object}")?;
    } else {
        let mut text = status_text(&execution);
        if let Some(line) = checked.line() {
            text.push_str(&line);
        }
        out.write_all(text.as_bytes())?;
    }
    Ok(out.flush()?)
}

/// Runs `trellis list`.
pub async fn list(coordinator_url: &str, args: ListArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let mut executions: Vec<Execution> = Vec::new();
    let mut page_token = String::new();
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    loop {
        let request = ListExecutionsRequest {
            states: args
                .state
                .iter()
                .map(|&s| ExecutionState::from(s) as i32)
                .collect(),
            name_contains: args.name.clone().unwrap_or_default(),
            namespace: args.namespace.clone().unwrap_or_default(),
            page: Some(PageRequest {
                page_size: args
                    .limit
                    .saturating_sub(u32::try_from(executions.len()).unwrap_or(u32::MAX))
                    .min(1000),
                page_token,
            }),
            ..ListExecutionsRequest::default()
        };
        let response = coordinator
            .client
            .list_executions(request)
            .await
            .map_err(|status| coordinator.status_failure(&status, "list of executions"))?
            .into_inner();
        let n_before = executions.len();
        executions.extend(response.executions);
        page_token = response.page.unwrap_or_default().next_page_token;
        if page_token.is_empty() || executions.len() >= limit || executions.len() == n_before {
            break;
        }
    }
    executions.truncate(limit);
    let mut out = BufWriter::new(io::stdout().lock());
    if args.json {
        let items: Vec<Value> = executions.iter().map(execution_json).collect();
        writeln!(out, "{}", json!({"executions": items}))?;
    } else {
        out.write_all(list_table(&executions).as_bytes())?;
    }
    Ok(out.flush()?)
}

/// Runs `trellis tree`.
pub async fn tree(coordinator_url: &str, args: TreeArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let graph = coordinator.graph(&args.execution_id, args.run).await?;
    // Best effort: the tree is still worth showing without the group rules and routed-out tasks.
    let execution = coordinator.execution(&args.execution_id).await.ok();
    let rules = match &execution {
        Some(execution) if !graph.groups.is_empty() => {
            group_rules(
                &mut coordinator,
                &args.execution_id,
                execution.last_sequence,
            )
            .await
        }
        _ => HashMap::new(),
    };
    let skipped = execution
        .map(|execution| execution.skipped)
        .unwrap_or_default();
    let mut out = BufWriter::new(io::stdout().lock());
    if args.json {
        writeln!(out, "{}", tree::json(&graph, &rules, &skipped))?;
    } else {
        if graph.root_indices.is_empty() {
            writeln!(out, "no task instances yet")?;
        } else {
            let text = tree::render(&graph, &rules).map_err(Failure::failed)?;
            out.write_all(text.as_bytes())?;
        }
        out.write_all(tree::skipped_text(&skipped).as_bytes())?;
    }
    Ok(out.flush()?)
}

/// Reads the completion rule of each subtask group from the event log (up to `last_sequence`),
/// which the graph does not carry. Best effort: the tree is still worth showing without them.
async fn group_rules(
    coordinator: &mut Coordinator,
    execution_id: &str,
    last_sequence: u64,
) -> HashMap<String, String> {
    let mut rules = HashMap::new();
    let _ = coordinator
        .observe(execution_id, 1, |item| {
            let Some(event) = &item.event else {
                return Ok(ControlFlow::Continue(()));
            };
            if let Some((group_id, rule)) = events::group_rule(event.kind.as_ref()) {
                rules.insert(group_id, rule);
            }
            Ok(if event.sequence >= last_sequence {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })
        .await;
    rules
}

/// Runs `trellis events`.
pub async fn events(coordinator_url: &str, args: EventsArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    // Without --follow, stop at the last event that exists now instead of waiting for more.
    let stop_at = if args.follow {
        u64::MAX
    } else {
        let last_sequence = coordinator
            .execution(&args.execution_id)
            .await?
            .last_sequence;
        if last_sequence < args.from {
            return Ok(());
        }
        last_sequence
    };
    let mut out = BufWriter::new(io::stdout().lock());
    let json = args.json;
    coordinator
        .observe(&args.execution_id, args.from, |item| {
            let Some(event) = &item.event else {
                return Ok(ControlFlow::Continue(()));
            };
            if json {
                writeln!(out, "{}", events::json(event))?;
            } else {
                writeln!(out, "{}", events::line(event))?;
            }
            if event.sequence >= stop_at {
                return Ok(ControlFlow::Break(()));
            }
            // Following live, each event is shown as it comes.
            if stop_at == u64::MAX {
                out.flush()?;
            }
            Ok(ControlFlow::Continue(()))
        })
        .await?;
    Ok(out.flush()?)
}

/// Returns an execution summary as JSON.
fn execution_json(execution: &Execution) -> Value {
    let progress = progress::of_execution(execution);
    let questions: Vec<Value> = execution
        .open_questions
        .iter()
        .map(|open| {
            let question = open.question.clone().unwrap_or_default();
            json!({
                "question_id": question.question_id,
                "task_instance_id": open.task_instance_id,
                "task_id": open.task_id,
                "type": question.question_type,
                "priority": question.priority,
                "text": question.text,
                "options": question.options,
                "asked_at_unix_ms": open.asked_at_unix_ms,
                "expires_at_unix_ms": question.expires_at_unix_ms,
            })
        })
        .collect();
    json!({
        "execution_id": execution.execution_id,
        "name": execution.name,
        "state": render::execution_state_name(execution.state),
        "run_number": execution.run_number,
        "counts": render::counts_json(&execution.counts.unwrap_or_default()),
        "percent": progress.percent,
        "eta_ms": progress.eta_ms,
        "wave": progress.wave,
        "waves": progress.waves,
        "usage": render::usage_json(execution.usage.as_ref()),
        "created_at_unix_ms": execution.created_at_unix_ms,
        "started_at_unix_ms": execution.started_at_unix_ms,
        "ended_at_unix_ms": execution.ended_at_unix_ms,
        "reason": execution.reason,
        "last_sequence": execution.last_sequence,
        "labels": execution.labels,
        "open_questions": questions,
        "holds": execution.holds.iter().map(|hold| json!({
            "task_id": hold.task_id,
            "group_id": hold.group_id,
            "mode": events::pause_mode_name(hold.mode),
            "reason": hold.reason,
            "since_unix_ms": hold.since_unix_ms,
        })).collect::<Vec<_>>(),
    })
}

/// Returns `trellis status`'s text: one `field  value` line each, then the open questions with
/// the command that answers them.
fn status_text(execution: &Execution) -> String {
    let mut lines: Vec<(&str, String)> = vec![
        ("execution", execution.execution_id.clone()),
        ("plan", execution.name.clone()),
        (
            "state",
            format!(
                "{} (run {})",
                render::execution_state_name(execution.state),
                execution.run_number
            ),
        ),
        (
            "progress",
            progress::line(&progress::of_execution(execution)),
        ),
        ("created", render::format_time(execution.created_at_unix_ms)),
    ];
    if let Some(started) = execution.started_at_unix_ms {
        lines.push(("started", render::format_time(started)));
    }
    if let Some(ended) = execution.ended_at_unix_ms {
        lines.push(("ended", render::format_time(ended)));
        if let Some(started) = execution.started_at_unix_ms {
            let took = u64::try_from(ended - started).unwrap_or(0);
            lines.push(("took", render::format_duration_ms(took)));
        }
    }
    if let Some(usage) = execution
        .usage
        .filter(|u| u.tokens_used > 0 || u.cost > 0.0)
    {
        lines.push((
            "usage",
            format!("{} tokens, cost {:.4}", usage.tokens_used, usage.cost),
        ));
    }
    if !execution.reason.is_empty() {
        lines.push(("reason", execution.reason.clone()));
    }
    if !execution.labels.is_empty() {
        let mut labels: Vec<String> = execution
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        labels.sort();
        lines.push(("labels", labels.join(" ")));
    }
    for hold in &execution.holds {
        let part = if hold.task_id.is_empty() {
            format!("group {}", hold.group_id)
        } else {
            format!("task {}", hold.task_id)
        };
        lines.push((
            "paused",
            format!(
                "{part} ({}) since {}: {}; resume: trellis resume --{} {} {}",
                events::pause_mode_name(hold.mode),
                render::format_time(hold.since_unix_ms),
                hold.reason,
                if hold.task_id.is_empty() {
                    "group"
                } else {
                    "task"
                },
                if hold.task_id.is_empty() {
                    &hold.group_id
                } else {
                    &hold.task_id
                },
                execution.execution_id
            ),
        ));
    }
    let mut res = String::new();
    for (field, value) in lines {
        res.push_str(&format!("{field:<10} {value}\n"));
    }
    if !execution.open_questions.is_empty() {
        res.push_str(&format!(
            "questions  {} open\n",
            execution.open_questions.len()
        ));
        for open in &execution.open_questions {
            let question = open.question.clone().unwrap_or_default();
            res.push_str(&format!(
                "  {} from {}: {:?}",
                question.question_id, open.task_id, question.text
            ));
            if !question.options.is_empty() {
                res.push_str(&format!(" [{}]", question.options.join(" | ")));
            }
            res.push('\n');
            res.push_str(&format!(
                "    answer: trellis answer {} {} ANSWER\n",
                execution.execution_id, question.question_id
            ));
        }
    }
    res
}

/// Returns `trellis list`'s table.
fn list_table(executions: &[Execution]) -> String {
    let header = ["ID", "STATE", "RUN", "DONE", "CREATED", "NAME"].map(str::to_owned);
    let rows: Vec<[String; 6]> = executions
        .iter()
        .map(|execution| {
            let counts = execution.counts.unwrap_or_default();
            let n_done = counts.completed + counts.failed + counts.skipped + counts.cancelled;
            [
                execution.execution_id.clone(),
                render::execution_state_name(execution.state),
                execution.run_number.to_string(),
                format!("{n_done}/{}", render::total(&counts)),
                render::format_time(execution.created_at_unix_ms),
                execution.name.clone(),
            ]
        })
        .collect();
    render::table(&header, &rows)
}

#[cfg(test)]
mod tests {
    use trellis_proto::v1::{OpenQuestion, Progress, Question, TaskStateCounts};

    use super::*;

    fn execution() -> Execution {
        Execution {
            execution_id: "e-1".to_owned(),
            name: "feature-x".to_owned(),
            state: ExecutionState::WaitingForHuman as i32,
            run_number: 1,
            counts: Some(TaskStateCounts {
                completed: 2,
                waiting_for_human: 1,
                pending: 1,
                ..TaskStateCounts::default()
            }),
            created_at_unix_ms: 1_793_628_187_000,
            started_at_unix_ms: Some(1_793_628_188_000),
            open_questions: vec![OpenQuestion {
                task_instance_id: "i-ask".to_owned(),
                task_id: "ask".to_owned(),
                question: Some(Question {
                    question_id: "q-1".to_owned(),
                    text: "Ship it?".to_owned(),
                    options: vec!["yes".to_owned(), "no".to_owned()],
                    ..Question::default()
                }),
                asked_at_unix_ms: 0,
            }],
            ..Execution::default()
        }
    }

    #[test]
    fn status_names_the_answer_command() {
        assert_eq!(
            status_text(&execution()),
            "execution  e-1\n\
             plan       feature-x\n\
             state      waiting_for_human (run 1)\n\
             progress   2 completed · 0 running · 1 waiting · 1 pending · 50%\n\
             created    2026-11-02 14:03:07Z\n\
             started    2026-11-02 14:03:08Z\n\
             questions  1 open\n  \
               q-1 from ask: \"Ship it?\" [yes | no]\n    \
                 answer: trellis answer e-1 q-1 ANSWER\n"
        );
        let object = execution_json(&execution());
        assert_eq!(object["state"], "waiting_for_human");
        assert_eq!(object["open_questions"][0]["question_id"], "q-1");
    }

    #[test]
    fn status_shows_the_coordinators_progress() {
        let execution = Execution {
            progress: Some(Progress {
                counts: Some(TaskStateCounts {
                    completed: 2,
                    running: 2,
                    ..TaskStateCounts::default()
                }),
                total: 4,
                done: 2,
                percent: 50.0,
                eta_ms: Some(4_000),
                wave: 2,
                waves: 3,
                ..Progress::default()
            }),
            ..execution()
        };
        assert!(
            status_text(&execution).contains(
                "progress   wave 2 of 3 · 2 completed · 2 running · 0 pending · 50% · ETA 4.0s\n"
            ),
            "{}",
            status_text(&execution)
        );
        let object = execution_json(&execution);
        assert_eq!(object["wave"], 2);
        assert_eq!(object["waves"], 3);
        assert_eq!(object["eta_ms"], 4_000);
    }

    #[test]
    fn list_is_a_table() {
        assert_eq!(
            list_table(&[execution()]),
            "ID   STATE              RUN  DONE  CREATED               NAME\n\
             e-1  waiting_for_human  1    2/4   2026-11-02 14:03:07Z  feature-x\n"
        );
    }
}
