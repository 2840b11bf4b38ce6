//! `trellis suggestions …`: grouping suggestions, made and resolved.

use std::io::{self, Write};

use clap::{Args, Subcommand};
use tonic::Status;
use trellis_proto::v1;

use super::render::write_suggestions;
use super::{Failure, Target, connect, refused, task_ref};

/// Grouping suggestions: which queued tasks belong in one list.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis suggestions run\n  \
    trellis suggestions list --status pending\n  \
    trellis suggestions accept 0190a5c4-... --name auth-fixes\n  \
    trellis suggestions modify 0190a5c4-... T-3 T-5\n  \
    trellis suggestions reject 0190a5c4-...")]
pub struct SuggestionsArgs {
    #[command(subcommand)]
    pub command: SuggestionsCommand,
    #[command(flatten)]
    pub target: Target,
}

/// What `trellis suggestions` does.
#[derive(Debug, Subcommand)]
pub enum SuggestionsCommand {
    /// Score the queued tasks now and store the groups found.
    Run {
        /// The score (0-1) two tasks need to be grouped; default 0.4.
        #[arg(long, default_value_t = 0.0)]
        threshold: f64,
    },
    /// List suggestions.
    List {
        /// pending, accepted, modified or rejected.
        #[arg(long)]
        status: Option<String>,
    },
    /// Accept a suggestion: create its list and move its tasks there.
    Accept {
        /// The suggestion's id (from `trellis suggestions list`).
        id: String,
        /// The list's name (default: the suggested one).
        #[arg(long)]
        name: Option<String>,
    },
    /// Accept a suggestion with other tasks.
    Modify {
        /// The suggestion's id (from `trellis suggestions list`).
        id: String,
        #[arg(required = true, num_args = 2..)]
        tasks: Vec<String>,
        #[arg(long)]
        name: Option<String>,
    },
    /// Reject a suggestion.
    Reject {
        /// The suggestion's id (from `trellis suggestions list`).
        id: String,
    },
}

/// `trellis suggestions …`.
pub async fn suggestions(args: SuggestionsArgs) -> Result<(), Failure> {
    let target = args.target;
    let url = target.planner.as_str();
    let project = target.project.clone();
    let mut client = connect(url).await?;
    let fail = |status: Status| refused(url, &status);
    let mut out = io::stdout().lock();
    let resolve = |id: String, action: &str, name: Option<String>, tasks: Vec<u32>| {
        v1::ResolveSuggestionRequest {
            project: project.clone(),
            id,
            action: action.to_owned(),
            list: name.unwrap_or_default(),
            tasks,
        }
    };
    let resolved = match args.command {
        SuggestionsCommand::Run { threshold } => {
            let found = client
                .suggest_groups(v1::SuggestGroupsRequest {
                    project: project.clone(),
                    threshold,
                })
                .await
                .map_err(fail)?
                .into_inner()
                .suggestions;
            if found.is_empty() && !target.json {
                writeln!(out, "no new groups among the queued tasks")?;
            }
            return write_suggestions(&mut out, &found, target.json);
        }
        SuggestionsCommand::List { status } => {
            let found = client
                .list_suggestions(v1::ListSuggestionsRequest {
                    project: project.clone(),
                    status: status.unwrap_or_default(),
                })
                .await
                .map_err(fail)?
                .into_inner()
                .suggestions;
            return write_suggestions(&mut out, &found, target.json);
        }
        SuggestionsCommand::Accept { id, name } => resolve(id, "accept", name, Vec::new()),
        SuggestionsCommand::Modify { id, tasks, name } => {
            let tasks = tasks
                .iter()
                .map(|task| task_ref(task))
                .collect::<Result<_, _>>()?;
            resolve(id, "modify", name, tasks)
        }
        SuggestionsCommand::Reject { id } => resolve(id, "reject", None, Vec::new()),
    };
    let action = resolved.action.clone();
    let answer = client
        .resolve_suggestion(resolved)
        .await
        .map_err(fail)?
        .into_inner();
    let verb = if action == "modify" {
        "accepted with other tasks"
    } else {
        "accepted"
    };
    match answer.list {
        Some(list) => writeln!(
            out,
            "{verb}: list {} with {} tasks (trellis lists show {})",
            list.name, list.total_tasks, list.name
        )?,
        None => writeln!(out, "rejected")?,
    }
    Ok(())
}
