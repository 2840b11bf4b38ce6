//! `trellis projects|tasks|lists|rules|suggestions …`: the backlog, through the planner's
//! `Backlog` API (a planner started with `--database-url`, or `trellis dev`).

mod lists;
mod render;
mod sinks;
mod suggestions;
mod tasks;
mod templates;

use std::io::{self, Write};

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tonic::{Code, Status};
use trellis_core::backlog::model::parse_task_ref;
use trellis_grpc::AuthChannel;
use trellis_proto::v1;
use trellis_proto::v1::backlog_client::BacklogClient;

use super::Failure;

pub use lists::{ListsArgs, lists};
pub use sinks::{SinksArgs, sinks};
pub use suggestions::{SuggestionsArgs, suggestions};
pub use tasks::{TasksArgs, tasks};
pub use templates::{TemplatesArgs, templates};

/// Where the planner is unless told otherwise.
pub const DEFAULT_PLANNER: &str = "http://127.0.0.1:7600";

/// The project a command works on, and the planner serving it.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// The planner serving the backlog (one started with --database-url, or `trellis dev`).
    #[arg(long, env = "TRELLIS_PLANNER", value_name = "URL", default_value = DEFAULT_PLANNER, global = true)]
    pub planner: String,
    /// The project (a slug).
    #[arg(
        long,
        short = 'P',
        env = "TRELLIS_PROJECT",
        default_value = "default",
        global = true
    )]
    pub project: String,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Projects: the scope of task numbers, lists, rules and grouping weights.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis projects create web --name \"Web app\"\n  \
    trellis projects list")]
pub struct ProjectsArgs {
    #[command(subcommand)]
    pub command: ProjectsCommand,
    #[command(flatten)]
    pub target: Target,
}

/// What `trellis projects` does.
#[derive(Debug, Subcommand)]
pub enum ProjectsCommand {
    /// Create a project (the `--project` slug names it).
    Create {
        /// The slug: 1-64 of a-z, 0-9 and '-'.
        slug: String,
        /// A display name (default: the slug).
        #[arg(long, default_value = "")]
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List the projects.
    List,
    /// Set the grouping weights (each 0-1; defaults 0.3, 0.25, 0.2, 0.15, 0.1).
    Weights {
        #[arg(long, default_value_t = 0.3)]
        file_overlap: f64,
        #[arg(long, default_value_t = 0.25)]
        dependency: f64,
        #[arg(long, default_value_t = 0.2)]
        category: f64,
        #[arg(long, default_value_t = 0.15)]
        description: f64,
        #[arg(long, default_value_t = 0.1)]
        component: f64,
    },
}

/// Validation rules: what a task must have before it can run.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis rules put needs-criteria --kind required_field --field acceptance_criteria\n  \
    trellis rules put needs-tests --kind test_required --category feature --level codebase\n  \
    trellis rules put ticket-title --kind pattern_match --field title --pattern '^\\[' --severity warning\n  \
    trellis rules put lint --kind custom --command 'jq -e \".files | length > 0\"'\n  \
    trellis rules list")]
pub struct RulesArgs {
    #[command(subcommand)]
    pub command: RulesCommand,
    #[command(flatten)]
    pub target: Target,
}

/// What `trellis rules` does.
#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Store a rule (replacing one of the same name).
    Put {
        /// The name.
        name: String,
        /// required_field, test_required, pattern_match or custom.
        #[arg(long)]
        kind: String,
        /// Only tasks of this category (repeatable; none = every category).
        #[arg(long = "category")]
        categories: Vec<String>,
        /// required_field, pattern_match: title, description, acceptance_criteria, files,
        /// codebase_tests, api_tests or ui_tests.
        #[arg(long, default_value = "")]
        field: String,
        /// pattern_match: a regular expression.
        #[arg(long, default_value = "")]
        pattern: String,
        /// test_required: codebase, api or ui (repeatable; none = any).
        #[arg(long = "level")]
        levels: Vec<String>,
        /// custom: run through `sh -c` with the task as JSON on stdin; exit 0 passes.
        #[arg(long, default_value = "")]
        command: String,
        /// error (blocks the task) or warning.
        #[arg(long, default_value = "error")]
        severity: String,
        #[arg(long, default_value = "")]
        description: String,
        /// Keep the rule but do not check it.
        #[arg(long)]
        disabled: bool,
    },
    /// List the project's rules.
    List,
    /// Delete a rule.
    Delete {
        /// The name.
        name: String,
    },
}

/// Connects to the planner's backlog.
async fn connect(url: &str) -> Result<BacklogClient<AuthChannel>, Failure> {
    let planner = crate::client::planner_channel(url).await?;
    Ok(BacklogClient::new(planner))
}

/// Turns a refused call into a message.
fn refused(url: &str, status: &Status) -> Failure {
    let message = status.message();
    match status.code() {
        Code::InvalidArgument | Code::OutOfRange => Failure::bad_input(message.to_owned()),
        Code::Unimplemented => Failure::failed(format!(
            "the planner at {url} serves no backlog: start it with --database-url (or use \
             `trellis dev`)"
        )),
        Code::Unavailable => Failure::failed(format!(
            "no planner at {url} ({message}): start one with `trellis planner --database-url \
             ...` or `trellis dev`"
        )),
        Code::Unauthenticated => Failure::failed(format!(
            "the planner at {url} refused the call: {message} (set TRELLIS_TOKEN or pass --token)"
        )),
        _ => Failure::failed(message.to_owned()),
    }
}

fn task_ref(text: &str) -> Result<u32, Failure> {
    parse_task_ref("task", text).map_err(|err| Failure::bad_input(err.to_string()))
}

/// `trellis projects …`.
pub async fn projects(args: ProjectsArgs) -> Result<(), Failure> {
    let target = args.target;
    let url = target.planner.as_str();
    let mut client = connect(url).await?;
    let fail = |status: Status| refused(url, &status);
    let mut out = io::stdout().lock();
    match args.command {
        ProjectsCommand::Create {
            slug,
            name,
            description,
        } => {
            let project = client
                .create_project(v1::CreateProjectRequest {
                    project: slug,
                    name,
                    description,
                    weights: None,
                })
                .await
                .map_err(fail)?
                .into_inner();
            writeln!(out, "created project {}", project.project)?;
        }
        ProjectsCommand::List => {
            let projects = client
                .list_projects(v1::ListProjectsRequest {})
                .await
                .map_err(fail)?
                .into_inner()
                .projects;
            if target.json {
                let projects: Vec<Value> = projects
                    .iter()
                    .map(|p| json!({"project": p.project, "name": p.name, "description": p.description}))
                    .collect();
                writeln!(out, "{}", json!({ "projects": projects }))?;
            } else if projects.is_empty() {
                writeln!(out, "no projects yet: trellis projects create SLUG")?;
            } else {
                for project in projects {
                    writeln!(out, "{:<24} {}", project.project, project.name)?;
                }
            }
        }
        ProjectsCommand::Weights {
            file_overlap,
            dependency,
            category,
            description,
            component,
        } => {
            client
                .set_grouping_weights(v1::SetGroupingWeightsRequest {
                    project: target.project.clone(),
                    weights: Some(v1::GroupingWeights {
                        file_overlap,
                        dependency,
                        category,
                        description,
                        component,
                    }),
                })
                .await
                .map_err(fail)?;
            writeln!(out, "weights of {} set", target.project)?;
        }
    }
    Ok(())
}

/// `trellis rules …`.
pub async fn rules(args: RulesArgs) -> Result<(), Failure> {
    let target = args.target;
    let url = target.planner.as_str();
    let project = target.project.clone();
    let mut client = connect(url).await?;
    let fail = |status: Status| refused(url, &status);
    let mut out = io::stdout().lock();
    match args.command {
        RulesCommand::Put {
            name,
            kind,
            categories,
            field,
            pattern,
            levels,
            command,
            severity,
            description,
            disabled,
        } => {
            let rule = client
                .put_rule(v1::PutRuleRequest {
                    project,
                    rule: Some(v1::ValidationRuleSpec {
                        name,
                        description,
                        kind,
                        categories,
                        field,
                        pattern,
                        levels,
                        command,
                        severity,
                        enabled: !disabled,
                    }),
                })
                .await
                .map_err(fail)?
                .into_inner();
            writeln!(out, "stored rule {}", rule.name)?;
        }
        RulesCommand::List => {
            let rules = client
                .list_rules(v1::ListRulesRequest { project })
                .await
                .map_err(fail)?
                .into_inner()
                .rules;
            if rules.is_empty() && !target.json {
                writeln!(out, "no rules yet: trellis rules put NAME --kind ...")?;
            }
            for rule in &rules {
                let scope = if rule.categories.is_empty() {
                    "all categories".to_owned()
                } else {
                    rule.categories.join(",")
                };
                let detail = match rule.kind.as_str() {
                    "required_field" => rule.field.clone(),
                    "pattern_match" => format!("{} ~ {}", rule.field, rule.pattern),
                    "test_required" if rule.levels.is_empty() => "any level".to_owned(),
                    "test_required" => rule.levels.join(" or "),
                    _ => rule.command.clone(),
                };
                if target.json {
                    writeln!(
                        out,
                        "{}",
                        json!({"name": rule.name, "kind": rule.kind, "categories": rule.categories,
                               "field": rule.field, "pattern": rule.pattern, "levels": rule.levels,
                               "command": rule.command, "severity": rule.severity,
                               "enabled": rule.enabled})
                    )?;
                } else {
                    writeln!(
                        out,
                        "{:<20} {:<8} {:<15} {detail}  ({scope}){}",
                        rule.name,
                        rule.severity,
                        rule.kind,
                        if rule.enabled { "" } else { " disabled" }
                    )?;
                }
            }
        }
        RulesCommand::Delete { name } => {
            let deleted = client
                .delete_rule(v1::DeleteRuleRequest {
                    project,
                    name: name.clone(),
                })
                .await
                .map_err(fail)?
                .into_inner()
                .deleted;
            if !deleted {
                return Err(Failure::failed(format!("no rule {name}")));
            }
            writeln!(out, "deleted rule {name}")?;
        }
    }
    Ok(())
}
