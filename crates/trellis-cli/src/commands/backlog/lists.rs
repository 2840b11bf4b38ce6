//! `trellis lists …`: task lists, their order and their runs.

use std::io::{self, Write};

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tonic::Status;
use trellis_grpc::AuthChannel;
use trellis_proto::v1;
use trellis_proto::v1::backlog_client::BacklogClient;

use super::render::{
    list_json, run_json, task_json, write_list_line, write_run_line, write_task_line,
};
use super::{Failure, Target, connect, refused, task_ref};

/// Task lists: ordered groups of tasks that run together.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis lists create auth --max-parallel 2\n  \
    trellis lists add auth T-3 T-4\n  \
    trellis lists move auth T-4 1\n  \
    trellis lists remove auth T-3\n  \
    trellis lists show auth\n  \
    trellis lists run auth --wait")]
pub struct ListsArgs {
    #[command(subcommand)]
    pub command: ListsCommand,
    #[command(flatten)]
    pub target: Target,
}

/// What `trellis lists` does.
#[derive(Debug, Subcommand)]
pub enum ListsCommand {
    /// Create a list.
    Create {
        /// A slug, unique in the project.
        name: String,
        #[arg(long, default_value = "")]
        description: String,
        /// How many of its tasks may run at once.
        #[arg(long, default_value_t = 3)]
        max_parallel: u32,
        /// Start a run by itself once the list is ready.
        #[arg(long)]
        auto_execute: bool,
    },
    /// Move tasks into a list, at its end, in the order given.
    Add {
        /// The list (its name).
        list: String,
        #[arg(required = true)]
        tasks: Vec<String>,
    },
    /// Move a task to a position (from 1) of a list.
    Move {
        /// The list (its name).
        list: String,
        /// The task, as T-<number> or <number>.
        task: String,
        /// The place in the list, from 1.
        position: u32,
    },
    /// Take a task out of a list, back to the evaluation queue.
    Remove {
        /// The list (its name).
        list: String,
        /// The task, as T-<number> or <number>.
        task: String,
    },
    /// Show a list and its tasks in order.
    Show {
        /// The list (its name).
        list: String,
    },
    /// Run a list: compile it into a plan (waves and conflicts from its tasks' files, its
    /// max-parallel as the concurrency, its tasks' tests as validate checks) and start it; each
    /// run is a new execution, and the list's items follow it.
    #[command(after_help = "Examples:\n  \
        trellis lists run auth --wait            # tasks run with the `agent` handler\n  \
        trellis lists run auth --type noop       # try it with a built-in handler\n  \
        trellis lists runs auth")]
    Run {
        /// The list (its name).
        list: String,
        /// The handler type every task runs with (the one your build agents register).
        #[arg(long = "type", default_value = "agent")]
        task_type: String,
        /// The worker queue (default: the default queue).
        #[arg(long, default_value = "")]
        queue: String,
        /// Wait for the run to end, showing its progress; exit 1 unless every task completed.
        #[arg(long)]
        wait: bool,
    },
    /// Show a list's runs, newest first.
    Runs {
        /// The list (its name).
        list: String,
    },
    /// List the project's lists.
    List,
}

/// `trellis lists …`.
pub async fn lists(args: ListsArgs) -> Result<(), Failure> {
    let target = args.target;
    let url = target.planner.as_str();
    let project = target.project.clone();
    let mut client = connect(url).await?;
    let fail = |status: Status| refused(url, &status);
    let mut out = io::stdout().lock();
    match args.command {
        ListsCommand::Create {
            name,
            description,
            max_parallel,
            auto_execute,
        } => {
            let list = client
                .create_list(v1::CreateListRequest {
                    project,
                    name,
                    description,
                    max_parallel_agents: max_parallel,
                    auto_execute,
                })
                .await
                .map_err(fail)?
                .into_inner();
            writeln!(out, "created list {}", list.name)?;
        }
        ListsCommand::Add { list, tasks } => {
            for task in &tasks {
                let moved = client
                    .move_task(v1::MoveTaskRequest {
                        project: project.clone(),
                        number: task_ref(task)?,
                        list: list.clone(),
                        position: 0,
                    })
                    .await
                    .map_err(fail)?
                    .into_inner();
                writeln!(out, "{} is #{} of {list}", moved.display_id, moved.position)?;
            }
        }
        ListsCommand::Move {
            list,
            task,
            position,
        } => {
            if position == 0 {
                return Err(Failure::bad_input("position: counts from 1"));
            }
            let moved = client
                .move_task(v1::MoveTaskRequest {
                    project,
                    number: task_ref(&task)?,
                    list: list.clone(),
                    position,
                })
                .await
                .map_err(fail)?
                .into_inner();
            writeln!(out, "{} is #{} of {list}", moved.display_id, moved.position)?;
        }
        ListsCommand::Remove { list, task } => {
            let number = task_ref(&task)?;
            let current = client
                .get_task(v1::GetTaskRequest {
                    project: project.clone(),
                    number,
                })
                .await
                .map_err(fail)?
                .into_inner();
            if current.list != list {
                return Err(Failure::bad_input(format!(
                    "{} is not in list {list}",
                    current.display_id
                )));
            }
            let moved = client
                .move_task(v1::MoveTaskRequest {
                    project,
                    number,
                    list: String::new(),
                    position: 0,
                })
                .await
                .map_err(fail)?
                .into_inner();
            writeln!(out, "{} is back in the evaluation queue", moved.display_id)?;
        }
        ListsCommand::Show { list } => {
            let shown = client
                .get_list(v1::GetListRequest {
                    project,
                    name: list,
                })
                .await
                .map_err(fail)?
                .into_inner();
            let Some(list) = shown.list else {
                return Err(Failure::failed("the planner answered without the list"));
            };
            if target.json {
                let tasks: Vec<Value> = shown.tasks.iter().map(task_json).collect();
                let mut value = list_json(&list);
                value["tasks"] = Value::Array(tasks);
                writeln!(out, "{value}")?;
            } else {
                write_list_line(&mut out, &list)?;
                if !list.description.is_empty() {
                    writeln!(out, "  {}", list.description)?;
                }
                for task in &shown.tasks {
                    write!(out, "  {:>3}. ", task.position)?;
                    write_task_line(&mut out, task)?;
                }
            }
        }
        ListsCommand::Run {
            list,
            task_type,
            queue,
            wait,
        } => {
            let run = client
                .run_list(v1::RunListRequest {
                    project: project.clone(),
                    name: list.clone(),
                    task_type,
                    queue,
                })
                .await
                .map_err(fail)?
                .into_inner();
            if target.json && !wait {
                writeln!(out, "{}", run_json(&run))?;
                return Ok(());
            }
            if !target.json {
                writeln!(
                    out,
                    "run {} of {list} started: execution {} ({} tasks)",
                    run.run_number, run.execution_id, run.tasks_total
                )?;
            }
            if wait {
                drop(out);
                return wait_run(&mut client, url, &project, &list, run, target.json).await;
            }
        }
        ListsCommand::Runs { list } => {
            let runs = client
                .list_runs(v1::ListRunsRequest {
                    project,
                    name: list,
                })
                .await
                .map_err(fail)?
                .into_inner()
                .runs;
            if target.json {
                let runs: Vec<Value> = runs.iter().map(run_json).collect();
                writeln!(out, "{}", json!({ "runs": runs }))?;
            } else if runs.is_empty() {
                writeln!(out, "no runs yet: trellis lists run LIST")?;
            }
            for run in runs.iter().filter(|_| !target.json) {
                write_run_line(&mut out, run)?;
            }
        }
        ListsCommand::List => {
            let lists = client
                .list_lists(v1::ListListsRequest { project })
                .await
                .map_err(fail)?
                .into_inner()
                .lists;
            if target.json {
                let lists: Vec<Value> = lists.iter().map(list_json).collect();
                writeln!(out, "{}", json!({ "lists": lists }))?;
            } else if lists.is_empty() {
                writeln!(out, "no lists yet: trellis lists create NAME")?;
            } else {
                for list in &lists {
                    write_list_line(&mut out, list)?;
                }
            }
        }
    }
    Ok(())
}

/// How often `lists run --wait` reads the run.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Waits for a run to end with a progress bar; fails (exit 1) unless every task completed.
async fn wait_run(
    client: &mut BacklogClient<AuthChannel>,
    url: &str,
    project: &str,
    list: &str,
    mut run: v1::ListRunView,
    json_output: bool,
) -> Result<(), Failure> {
    let bar = indicatif::ProgressBar::new(u64::from(run.tasks_total)).with_style(
        indicatif::ProgressStyle::with_template("{prefix} {bar:30} {pos}/{len} tasks {msg}")
            .map_err(|e| Failure::failed(e.to_string()))?,
    );
    bar.set_prefix(format!("{list} run {}", run.run_number));
    if json_output {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    while run.status == "running" || run.status == "starting" {
        tokio::time::sleep(WAIT_POLL).await;
        let runs = client
            .list_runs(v1::ListRunsRequest {
                project: project.to_owned(),
                name: list.to_owned(),
            })
            .await
            .map_err(|status| refused(url, &status))?
            .into_inner()
            .runs;
        if let Some(now) = runs.into_iter().find(|r| r.run_number == run.run_number) {
            run = now;
        }
        bar.set_position(u64::from(run.tasks_completed + run.tasks_failed));
        if run.tasks_failed > 0 {
            bar.set_message(format!("({} failed)", run.tasks_failed));
        }
    }
    bar.finish_and_clear();
    let mut out = io::stdout().lock();
    if json_output {
        writeln!(out, "{}", run_json(&run))?;
    } else {
        write_run_line(&mut out, &run)?;
    }
    if run.status == "completed" && run.tasks_completed == run.tasks_total {
        Ok(())
    } else {
        Err(Failure::silent())
    }
}
