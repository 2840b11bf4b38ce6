//! `trellis tasks …`: tasks in the evaluation queue or in lists.

use std::io::{self, Write};

use clap::{Args, Subcommand};
use tonic::Status;
use trellis_proto::v1;

use super::render::{print_change, print_one, print_tasks, task_json, write_task_detail};
use super::{Failure, Target, connect, refused, task_ref};

/// The fields of a task, as flags (for `tasks add` and `tasks edit`).
#[derive(Debug, Default, Args)]
pub struct TaskFlags {
    /// What it is about, for people.
    #[arg(long, short = 'd')]
    pub description: Option<String>,
    /// feature, bug, task, improvement, refactor, test, docs, infra or research (default task).
    #[arg(long, short = 'c')]
    pub category: Option<String>,
    /// p1 (most urgent) to p4 (default p3).
    #[arg(long, short = 'p')]
    pub priority: Option<String>,
    /// trivial, small, medium, large or epic (default medium).
    #[arg(long, short = 'e')]
    pub effort: Option<String>,
    /// 1 database, 2 types, 3 API, 4 UI, 5 tests (default 3).
    #[arg(long)]
    pub phase: Option<u32>,
    /// A file it touches, PATH:OPERATION with CREATE, UPDATE, DELETE or READ (repeatable;
    /// given on an edit, replaces the list).
    #[arg(long = "file", short = 'f', value_name = "PATH:OP")]
    pub files: Vec<String>,
    /// An acceptance criterion (repeatable).
    #[arg(long = "criterion", value_name = "TEXT")]
    pub criteria: Vec<String>,
    /// A codebase-level test command (repeatable).
    #[arg(long = "codebase-test", value_name = "CMD")]
    pub codebase_tests: Vec<String>,
    /// An API-level test command (repeatable).
    #[arg(long = "api-test", value_name = "CMD")]
    pub api_tests: Vec<String>,
    /// A UI-level test command (repeatable).
    #[arg(long = "ui-test", value_name = "CMD")]
    pub ui_tests: Vec<String>,
    /// A task this one waits for, such as T-3 (repeatable).
    #[arg(long = "depends-on", value_name = "TASK")]
    pub depends_on: Vec<String>,
    /// Another relationship, KIND:TASK such as related_to:T-4 (repeatable).
    #[arg(long = "relate", value_name = "KIND:TASK")]
    pub relate: Vec<String>,
}

/// Tasks before they run: the evaluation queue and the task lists.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis tasks add \"Fix login redirect\" -c bug -p p1 -f src/auth.rs:update --depends-on T-2\n  \
    trellis tasks add \"Fix the signup redirect\" --template bugfix -f src/signup.rs:update\n  \
    trellis tasks list --queue\n  \
    trellis tasks show T-3\n  \
    trellis tasks edit T-3 --priority p2 --criterion \"redirects to /home\"\n  \
    trellis tasks block T-3 --reason \"waiting for the design\"\n  \
    trellis tasks check T-3")]
pub struct TasksArgs {
    #[command(subcommand)]
    pub command: TasksCommand,
    #[command(flatten)]
    pub target: Target,
}

/// What `trellis tasks` does.
#[derive(Debug, Subcommand)]
pub enum TasksCommand {
    /// Add a task to the evaluation queue (or straight into a list with --list); the project's
    /// rules check it, and for a queued task the groups it fits are suggested.
    Add {
        /// One line, at most 200 characters.
        title: String,
        /// Put it in this list instead of the evaluation queue.
        #[arg(long)]
        list: Option<String>,
        /// Start from this template: each field not given here takes the template's.
        #[arg(long, short = 't')]
        template: Option<String>,
        #[command(flatten)]
        fields: TaskFlags,
    },
    /// List tasks: all, the evaluation queue, or one list.
    List {
        /// Only the evaluation queue.
        #[arg(long, conflicts_with = "list")]
        queue: bool,
        /// Only this list.
        #[arg(long)]
        list: Option<String>,
        /// Only this status (draft, evaluating, pending, blocked, in_progress, validating,
        /// completed, failed).
        #[arg(long)]
        status: Option<String>,
    },
    /// Show one task in full.
    Show {
        /// The task, as T-<number> or <number>.
        task: String,
    },
    /// Change the fields given as flags; the rest stay as they are.
    Edit {
        /// The task, as T-<number> or <number>.
        task: String,
        #[arg(long)]
        title: Option<String>,
        #[command(flatten)]
        fields: TaskFlags,
    },
    /// Block a task (manual by default) with a reason.
    Block {
        /// The task, as T-<number> or <number>.
        task: String,
        #[arg(long, short = 'r')]
        reason: String,
        /// validation, dependency, manual or conflict.
        #[arg(long, default_value = "manual")]
        kind: String,
        /// For a dependency block: the task it waits for.
        #[arg(long)]
        by: Option<String>,
    },
    /// Resolve a task's open blocks (all, or one kind).
    Unblock {
        /// The task, as T-<number> or <number>.
        task: String,
        #[arg(long)]
        kind: Option<String>,
        #[arg(long, default_value = "")]
        resolution: String,
    },
    /// Check a task against the project's rules, custom commands included.
    Check {
        /// The task, as T-<number> or <number>.
        task: String,
    },
}

/// Reads the flags into wire fields and the names of the fields they set.
pub(super) fn task_fields(
    title: Option<String>,
    flags: TaskFlags,
) -> Result<(v1::BacklogTaskFields, Vec<String>), Failure> {
    let mut mask = Vec::new();
    let mut set = |name: &str, given: bool| {
        if given {
            mask.push(name.to_owned());
        }
    };
    set("title", title.is_some());
    set("description", flags.description.is_some());
    set("category", flags.category.is_some());
    set("priority", flags.priority.is_some());
    set("effort", flags.effort.is_some());
    set("phase", flags.phase.is_some());
    set("files", !flags.files.is_empty());
    set("acceptance_criteria", !flags.criteria.is_empty());
    set("codebase_tests", !flags.codebase_tests.is_empty());
    set("api_tests", !flags.api_tests.is_empty());
    set("ui_tests", !flags.ui_tests.is_empty());
    set(
        "relationships",
        !flags.depends_on.is_empty() || !flags.relate.is_empty(),
    );
    let files = flags
        .files
        .iter()
        .map(|file| {
            let (path, operation) = file.rsplit_once(':').ok_or_else(|| {
                Failure::bad_input(format!(
                    "--file {file:?}: expected PATH:OPERATION, such as src/auth.rs:update"
                ))
            })?;
            Ok(v1::BacklogFile {
                path: path.to_owned(),
                operation: operation.to_owned(),
            })
        })
        .collect::<Result<_, Failure>>()?;
    let mut relationships = Vec::new();
    for task in &flags.depends_on {
        relationships.push(v1::BacklogRelationship {
            kind: "depends_on".to_owned(),
            target: task_ref(task)?,
        });
    }
    for relation in &flags.relate {
        let (kind, task) = relation.split_once(':').ok_or_else(|| {
            Failure::bad_input(format!(
                "--relate {relation:?}: expected KIND:TASK, such as related_to:T-4"
            ))
        })?;
        relationships.push(v1::BacklogRelationship {
            kind: kind.to_owned(),
            target: task_ref(task)?,
        });
    }
    let fields = v1::BacklogTaskFields {
        title: title.unwrap_or_default(),
        description: flags.description.unwrap_or_default(),
        category: flags.category.unwrap_or_default(),
        priority: flags.priority.unwrap_or_default(),
        effort: flags.effort.unwrap_or_default(),
        phase: flags.phase.unwrap_or(0),
        files,
        acceptance_criteria: flags.criteria,
        codebase_tests: flags.codebase_tests,
        api_tests: flags.api_tests,
        ui_tests: flags.ui_tests,
        relationships,
    };
    Ok((fields, mask))
}

/// `trellis tasks …`.
pub async fn tasks(args: TasksArgs) -> Result<(), Failure> {
    let target = args.target;
    let url = target.planner.as_str();
    let project = target.project.clone();
    let mut client = connect(url).await?;
    let fail = |status: Status| refused(url, &status);
    match args.command {
        TasksCommand::Add {
            title,
            list,
            template,
            fields,
        } => {
            let (fields, _) = task_fields(Some(title), fields)?;
            let change = client
                .add_task(v1::AddTaskRequest {
                    project,
                    fields: Some(fields),
                    queue: String::new(),
                    list: list.unwrap_or_default(),
                    template: template.unwrap_or_default(),
                })
                .await
                .map_err(fail)?
                .into_inner();
            print_change("added", &change, target.json)
        }
        TasksCommand::List {
            queue,
            list,
            status,
        } => {
            let tasks = client
                .list_tasks(v1::ListTasksRequest {
                    project,
                    queue: if queue {
                        "evaluation".into()
                    } else {
                        String::new()
                    },
                    list: list.unwrap_or_default(),
                    status: status.unwrap_or_default(),
                })
                .await
                .map_err(fail)?
                .into_inner()
                .tasks;
            print_tasks(&tasks, target.json)
        }
        TasksCommand::Show { task } => {
            let task = client
                .get_task(v1::GetTaskRequest {
                    project,
                    number: task_ref(&task)?,
                })
                .await
                .map_err(fail)?
                .into_inner();
            let mut out = io::stdout().lock();
            if target.json {
                writeln!(out, "{}", task_json(&task))?;
            } else {
                write_task_detail(&mut out, &task)?;
            }
            Ok(())
        }
        TasksCommand::Edit {
            task,
            title,
            fields,
        } => {
            let number = task_ref(&task)?;
            let (fields, mask) = task_fields(title, fields)?;
            if mask.is_empty() {
                return Err(Failure::bad_input(
                    "nothing to change: give the fields to edit as flags (see `trellis tasks \
                     edit --help`)",
                ));
            }
            let change = client
                .edit_task(v1::EditTaskRequest {
                    project,
                    number,
                    fields: Some(fields),
                    update_mask: mask,
                })
                .await
                .map_err(fail)?
                .into_inner();
            print_change("edited", &change, target.json)
        }
        TasksCommand::Block {
            task,
            reason,
            kind,
            by,
        } => {
            let blocking_task = by.as_deref().map(task_ref).transpose()?.unwrap_or(0);
            let task = client
                .block_task(v1::BlockTaskRequest {
                    project,
                    number: task_ref(&task)?,
                    kind,
                    reason,
                    blocking_task,
                })
                .await
                .map_err(fail)?
                .into_inner();
            print_one("blocked", &task, target.json)
        }
        TasksCommand::Unblock {
            task,
            kind,
            resolution,
        } => {
            let task = client
                .unblock_task(v1::UnblockTaskRequest {
                    project,
                    number: task_ref(&task)?,
                    kind: kind.unwrap_or_default(),
                    resolution,
                })
                .await
                .map_err(fail)?
                .into_inner();
            print_one("unblocked", &task, target.json)
        }
        TasksCommand::Check { task } => {
            let change = client
                .check_task(v1::CheckTaskRequest {
                    project,
                    number: task_ref(&task)?,
                })
                .await
                .map_err(fail)?
                .into_inner();
            print_change("checked", &change, target.json)
        }
    }
}
