//! `trellis logs`: the log lines an execution's tasks wrote (`GetTaskLogs`), named by their plan
//! task, optionally followed live.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, BufWriter, Write};

use clap::Args;
use trellis_proto::v1::GetTaskLogsRequest;

use super::Failure;
use crate::client::Coordinator;
use crate::render::logs;

/// Print the log lines of an execution's tasks, and optionally follow them live.
///
/// A task's lines are what its handler wrote with `ctx.log` and, for a `shell` task, its
/// command's stdout and stderr line by line, each with the time it was written, the task, the
/// attempt (`build#2`) and where it came from. They are kept for 7 days.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis logs 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis logs 0190a5c4-7d1e-7000-8000-000000000001 build\n  \
    trellis logs --attempt 2 0190a5c4-7d1e-7000-8000-000000000001 build\n  \
    trellis logs -f 0190a5c4-7d1e-7000-8000-000000000001\n  \
    trellis logs --json 0190a5c4-7d1e-7000-8000-000000000001 | jq -r 'select(.source == \"stderr\") | .text'")]
pub struct LogsArgs {
    /// The execution id.
    pub execution_id: String,
    /// Only this task: a plan task id (every instance of it) or a task instance id.
    pub task: Option<String>,
    /// Only this attempt (from 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub attempt: Option<u32>,
    /// Keep printing lines as tasks write them, until the execution ends.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Print one JSON object per line (`task_id`, `attempt`, `worker_id`, `at_unix_ms`,
    /// `source`, `text`, `cut_from_bytes`; `dropped` for lines a worker had to drop).
    #[arg(long)]
    pub json: bool,
}

/// The task ids of the execution's instances, by instance id.
async fn task_names(
    coordinator: &mut Coordinator,
    execution_id: &str,
) -> Result<HashMap<String, String>, Failure> {
    let graph = coordinator.graph(execution_id, 0).await?;
    Ok(graph
        .nodes
        .into_iter()
        .filter_map(|node| node.record)
        .map(|record| (record.task_instance_id, record.task_id))
        .collect())
}

pub async fn run(coordinator_url: &str, args: LogsArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let what = format!("execution {}", args.execution_id);
    let mut names = task_names(&mut coordinator, &args.execution_id).await?;
    // A task instance id asks the server for that instance; a plan task id picks its instances
    // here, since more may come (a retry's fallback, a parent resumed after its group).
    let (instance, only_task) = match args.task.as_deref() {
        None => (String::new(), None),
        Some(task) if uuid::Uuid::parse_str(task).is_ok() => (task.to_owned(), None),
        Some(task) => {
            if !names.values().any(|name| name == task) {
                let known: BTreeSet<&str> = names.values().map(String::as_str).collect();
                return Err(Failure::bad_input(format!(
                    "{what} has no task {task:?} (its tasks: {})",
                    known.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
            (String::new(), Some(task.to_owned()))
        }
    };
    let mut stream = coordinator
        .client
        .get_task_logs(GetTaskLogsRequest {
            execution_id: args.execution_id.clone(),
            task_instance_id: instance,
            attempt: args.attempt.unwrap_or(0),
            follow: args.follow,
        })
        .await
        .map_err(|status| coordinator.status_failure(&status, &what))?
        .into_inner();
    let mut out = BufWriter::new(io::stdout().lock());
    let mut printed = 0usize;
    // Instances the names were read again for: each at most once.
    let mut looked_up = BTreeSet::new();
    loop {
        let item = match stream.message().await {
            Ok(Some(item)) => item,
            Ok(None) => break,
            Err(status) => return Err(coordinator.status_failure(&status, &what)),
        };
        let Some(batch) = item.batch else {
            continue;
        };
        if !names.contains_key(&batch.task_instance_id)
            && looked_up.insert(batch.task_instance_id.clone())
        {
            // An instance created after the names were read (a subtask, a resumed parent).
            names = task_names(&mut coordinator, &args.execution_id).await?;
        }
        let task = names
            .get(&batch.task_instance_id)
            .cloned()
            .unwrap_or_else(|| batch.task_instance_id.clone());
        if only_task.as_ref().is_some_and(|only| *only != task) {
            continue;
        }
        if args.json {
            for object in logs::json(&batch, &task) {
                writeln!(out, "{object}")?;
            }
        } else {
            for line in logs::text(&batch, &task) {
                writeln!(out, "{line}")?;
            }
        }
        printed += batch.lines.len();
        if args.follow {
            out.flush()?;
        }
    }
    out.flush()?;
    if printed == 0 && !args.json {
        eprintln!("no log lines (tasks write them with ctx.log, shell tasks with their output)");
    }
    Ok(())
}
