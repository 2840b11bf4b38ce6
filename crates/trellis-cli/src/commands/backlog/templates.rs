//! `trellis templates put|list|delete`: task templates, the fields a new task takes when it leaves
//! them empty (`trellis tasks add --template NAME`).

use std::io::{self, Write};

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tonic::Status;
use trellis_proto::v1;

use super::tasks::{TaskFlags, task_fields};
use super::{Failure, Target, connect, refused};

/// Task templates (seed 001): defaults a new task takes for each field it leaves empty.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis templates put bugfix --description \"A bug with a regression test\" -c bug -p p2 \\\n    \
    --criterion \"a test reproduces the bug\" --codebase-test \"cargo test\"\n  \
    trellis tasks add \"Fix the signup redirect\" --template bugfix -f src/signup.rs:update\n  \
    trellis templates list")]
pub struct TemplatesArgs {
    #[command(subcommand)]
    pub command: TemplatesCommand,
    #[command(flatten)]
    pub target: Target,
}

/// What `trellis templates` does.
#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once per command; boxing would only complicate clap's flattening"
)]
pub enum TemplatesCommand {
    /// Store a template (replacing one of the same name; its usage count stays).
    Put {
        /// Its name (a slug).
        name: String,
        /// What the template is for.
        #[arg(long = "about", default_value = "")]
        about: String,
        #[command(flatten)]
        fields: TaskFlags,
    },
    /// List the project's templates.
    List,
    /// Delete a template.
    Delete {
        /// Its name.
        name: String,
    },
}

fn template_json(template: &v1::TaskTemplate) -> Value {
    let defaults = template.defaults.clone().unwrap_or_default();
    json!({
        "name": template.name,
        "description": template.description,
        "defaults": {
            "description": defaults.description,
            "category": defaults.category,
            "priority": defaults.priority,
            "effort": defaults.effort,
            "phase": defaults.phase,
            "files": defaults.files.iter().map(|f| json!({"path": f.path, "operation": f.operation})).collect::<Vec<_>>(),
            "acceptance_criteria": defaults.acceptance_criteria,
            "codebase_tests": defaults.codebase_tests,
            "api_tests": defaults.api_tests,
            "ui_tests": defaults.ui_tests,
        },
        "usage_count": template.usage_count,
        "created_at_unix_ms": template.created_at_unix_ms,
        "updated_at_unix_ms": template.updated_at_unix_ms,
    })
}

/// `trellis templates …`.
pub async fn templates(args: TemplatesArgs) -> Result<(), Failure> {
    let target = args.target;
    let url = target.planner.as_str();
    let project = target.project.clone();
    let mut client = connect(url).await?;
    let fail = |status: Status| refused(url, &status);
    let mut out = io::stdout().lock();
    match args.command {
        TemplatesCommand::Put {
            name,
            about,
            fields,
        } => {
            let (defaults, _) = task_fields(None, fields)?;
            let stored = client
                .put_template(v1::PutTemplateRequest {
                    project,
                    template: Some(v1::TaskTemplate {
                        name,
                        description: about,
                        defaults: Some(defaults),
                        ..v1::TaskTemplate::default()
                    }),
                })
                .await
                .map_err(fail)?
                .into_inner();
            if target.json {
                writeln!(out, "{}", template_json(&stored))?;
            } else {
                writeln!(
                    out,
                    "stored template {} (used by {} task(s))",
                    stored.name, stored.usage_count
                )?;
            }
        }
        TemplatesCommand::List => {
            let templates = client
                .list_templates(v1::ListTemplatesRequest { project })
                .await
                .map_err(fail)?
                .into_inner()
                .templates;
            if target.json {
                let templates: Vec<Value> = templates.iter().map(template_json).collect();
                writeln!(out, "{}", json!({ "templates": templates }))?;
            } else if templates.is_empty() {
                writeln!(
                    out,
                    "no templates yet: trellis templates put NAME -c bug ..."
                )?;
            } else {
                for template in &templates {
                    let defaults = template.defaults.clone().unwrap_or_default();
                    writeln!(
                        out,
                        "{:<20} {:<12} {:<3} used {:>4}×  {}",
                        template.name,
                        defaults.category,
                        defaults.priority,
                        template.usage_count,
                        template.description
                    )?;
                }
            }
        }
        TemplatesCommand::Delete { name } => {
            let deleted = client
                .delete_template(v1::DeleteTemplateRequest {
                    project: project.clone(),
                    name: name.clone(),
                })
                .await
                .map_err(fail)?
                .into_inner()
                .deleted;
            if !deleted {
                return Err(Failure::bad_input(format!(
                    "project {project} has no template {name} (trellis templates list)"
                )));
            }
            writeln!(out, "deleted template {name}")?;
        }
    }
    Ok(())
}
