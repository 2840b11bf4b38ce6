//! `trellis plan …`: check a plan file and show how it would run.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use trellis_core::analysis::{Analysis, ConflictReason, analyze, op_name};
use trellis_core::plan::{Limits, Plan, PlanErrors};
use trellis_proto::v1;
use trellis_wire::plan;

use super::{EXIT_FAILURE, Failure, display_name, read_input};
use crate::render::plan_graph;

/// Work with plan files (YAML or JSON; `-` reads stdin).
#[derive(Debug, Subcommand)]
#[command(after_help = "Examples:\n  \
    trellis plan validate examples/seed-001.yaml\n  \
    trellis plan analyze --json examples/feature-x.yaml | jq .waves\n  \
    trellis plan graph examples/feature-x.yaml > plan.mmd\n  \
    trellis plan validate --param env=prod --param 'regions=[\"eu\",\"us\"]' examples/services.yaml")]
pub enum PlanCommand {
    /// Check a plan and report every problem, one per line as `FILE: path: message`.
    ///
    /// Prints `ok: plan "NAME" — N tasks, W waves` and exits 0 when the plan is valid; otherwise
    /// prints every error to stderr (with a `hint:` line where there is a likely fix) and exits 2.
    #[command(after_help = "Example:\n  trellis plan validate examples/feature-x.yaml")]
    Validate(PlanArgs),
    /// Show how a plan would run: waves, conflicting tasks, critical path, parallelism.
    ///
    /// Wave 1 holds the tasks with no dependencies, wave k the tasks whose dependencies are all in
    /// earlier waves. Two tasks conflict when they touch one file with a conflicting pair of
    /// operations (CREATE–CREATE, CREATE–DELETE, UPDATE–UPDATE, UPDATE–DELETE, DELETE–DELETE,
    /// DELETE–READ) or declare `conflicts_with`; conflicting tasks never run at the same time, so
    /// a task that conflicts with one declared before it in its wave is blocked until it ends.
    #[command(after_help = "Examples:\n  \
        trellis plan analyze examples/seed-001.yaml\n  \
        trellis plan analyze --json examples/feature-x.yaml")]
    Analyze {
        #[command(flatten)]
        plan: PlanArgs,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Draw a plan as a Mermaid flowchart or a Graphviz DOT graph.
    ///
    /// Waves are ranks (left to right), arrows are dependencies, dashed arrows lead to subtasks
    /// and fallbacks, and conflicts are red dashed links labelled with the file and operations;
    /// tasks blocked by a conflict in their wave are outlined in red.
    #[command(after_help = "Examples:\n  \
        trellis plan graph examples/feature-x.yaml > plan.mmd\n  \
        trellis plan graph --format dot examples/feature-x.yaml | dot -Tsvg > plan.svg")]
    Graph {
        #[command(flatten)]
        plan: PlanArgs,
        /// The output syntax.
        #[arg(long, value_enum, default_value_t = GraphFormat::Mermaid)]
        format: GraphFormat,
    },
}

/// The plan file and how to compile it.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The plan file, or `-` for stdin.
    pub file: PathBuf,
    /// A value for one of the plan's `params` (repeatable). The value is read as JSON when it
    /// parses (`3`, `true`, `["a","b"]`), otherwise as a string (`env=prod`).
    #[arg(long = "param", short = 'p', value_name = "NAME=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// Compile through this planner service (e.g. http://127.0.0.1:7600) instead of in this
    /// process.
    #[arg(long, env = "TRELLIS_PLANNER", value_name = "URL")]
    pub planner: Option<String>,
}

/// The syntax `trellis plan graph` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// A Mermaid flowchart (renders on GitHub and in most Markdown viewers).
    Mermaid,
    /// A Graphviz digraph (`dot -Tsvg`).
    Dot,
}

/// Parses `NAME=VALUE`.
pub fn parse_param(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_owned(), value.to_owned()))
        }
        _ => Err(format!("expected NAME=VALUE, found {text:?}")),
    }
}

/// Runs a `plan` subcommand and returns the process exit code.
pub fn run(command: PlanCommand) -> ExitCode {
    match command {
        PlanCommand::Validate(args) => with_plan(&args, |out, plan, analysis| {
            writeln!(
                out,
                "ok: plan {:?} — {} tasks, {} waves",
                plan.name,
                plan.len(),
                analysis.waves.len()
            )
        }),
        PlanCommand::Analyze { plan, json } => with_plan(&plan, |out, plan, analysis| {
            if json {
                serde_json::to_writer_pretty(&mut *out, &analysis.report(plan))
                    .map_err(io::Error::other)?;
                writeln!(out)
            } else {
                write_analysis(out, plan, analysis)
            }
        }),
        PlanCommand::Graph { plan, format } => with_plan(&plan, |out, plan, analysis| {
            out.write_all(
                match format {
                    GraphFormat::Mermaid => plan_graph::mermaid(plan, analysis),
                    GraphFormat::Dot => plan_graph::dot(plan, analysis),
                }
                .as_bytes(),
            )
        }),
    }
}

/// Reads a plan file (or stdin for `-`) and compiles it with `params`, through `planner` when
/// one is given; every problem is printed on stderr as `FILE: message`, with a `hint:` line where
/// the compiler has one. Returns the spec as sent with the compiled plan.
///
/// # Errors
///
/// Bad input (exit 2, message already printed) for an unreadable file or an invalid plan; a
/// failure when the planner cannot be reached.
pub async fn load(
    file: &Path,
    params: &[(String, String)],
    planner: Option<&str>,
) -> Result<(v1::PlanSpec, Plan), Failure> {
    let name = display_name(file);
    let limits = Limits::default();
    let bytes = read_input(file, limits.max_input_bytes).map_err(|message| {
        eprintln!("{name}: {message}");
        Failure::bad_input("")
    })?;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        // The compiler reports where the bad byte is.
        Err(_) => match trellis_core::plan::parse_spec_bytes(bytes, &limits) {
            Err(errors) => return Err(report(&name, &plan::errors_to_proto(&errors))),
            Ok(_) => return Err(Failure::bad_input(format!("{name}: not UTF-8"))),
        },
    };
    let format = if text.trim_start().starts_with('{') {
        v1::PlanFormat::Json
    } else {
        v1::PlanFormat::Yaml
    };
    let spec = v1::PlanSpec {
        text,
        format: format.into(),
        source_name: name.clone(),
        params: params.iter().cloned().collect(),
    };
    let compiled = match planner {
        None => plan::compile_wire_spec(&spec, &limits)
            .map_err(|errors| report(&name, &plan::errors_to_proto(&errors)))?,
        Some(url) => {
            let mut client = crate::client::planner(url).await?;
            let response = client
                .compile_plan(v1::CompilePlanRequest {
                    spec: Some(spec.clone()),
                })
                .await
                .map_err(|status| {
                    Failure::failed(format!(
                        "the planner at {url} refused the request: {}",
                        status.message()
                    ))
                })?
                .into_inner();
            match response.result {
                Some(v1::compile_plan_response::Result::Plan(plan)) => {
                    // Nothing on the wire is trusted: the plan is validated again here.
                    plan::compile_wire_plan(&plan, &limits).map_err(|errors: PlanErrors| {
                        report(&name, &plan::errors_to_proto(&errors))
                    })?
                }
                Some(v1::compile_plan_response::Result::Errors(errors)) => {
                    return Err(report(&name, &errors));
                }
                None => {
                    return Err(Failure::failed(format!(
                        "the planner at {url} answered without a plan or errors"
                    )));
                }
            }
        }
    };
    // The plan runs as written; what may surprise its author is said once, on stderr.
    for warning in compiled.warnings() {
        eprintln!("{name}: warning: {warning}");
    }
    Ok((spec, compiled))
}

/// Prints validation errors on stderr, one per line as `FILE: path: message (line L, column C)`
/// followed by `  hint: ...` where there is one, and returns the bad-input failure.
fn report(name: &str, errors: &v1::PlanValidationErrors) -> Failure {
    let mut err = BufWriter::new(io::stderr().lock());
    for error in &errors.errors {
        let _ = writeln!(err, "{name}: {}", error_line(error));
        if !error.hint.is_empty() {
            let _ = writeln!(err, "  hint: {}", error.hint);
        }
    }
    let _ = err.flush();
    Failure::bad_input("")
}

/// Formats one validation error as the compiler's `Display` does.
fn error_line(error: &v1::PlanValidationError) -> String {
    let at = (error.line > 0).then(|| format!("line {}, column {}", error.line, error.column));
    match (error.path.is_empty(), at) {
        (false, Some(at)) => format!("{}: {} ({at})", error.path, error.message),
        (false, None) => format!("{}: {}", error.path, error.message),
        (true, Some(at)) => format!("{at}: {}", error.message),
        (true, None) => error.message.clone(),
    }
}

/// Loads, compiles and analyses the plan of `args`, then calls `show`; reports problems on
/// stderr.
fn with_plan(
    args: &PlanArgs,
    show: impl FnOnce(&mut dyn Write, &Plan, &Analysis) -> io::Result<()>,
) -> ExitCode {
    let loaded = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(load(&args.file, &args.params, args.planner.as_deref())),
        Err(e) => Err(Failure::failed(format!(
            "cannot start the async runtime: {e}"
        ))),
    };
    let plan = match loaded {
        Ok((_, plan)) => plan,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("trellis: {}", failure.message);
            }
            return ExitCode::from(failure.exit);
        }
    };
    let analysis = analyze(&plan);
    let mut out = BufWriter::new(io::stdout().lock());
    match show(&mut out, &plan, &analysis).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is the reader's choice, not an error worth a message.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trellis: cannot write output: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn write_analysis(out: &mut dyn Write, plan: &Plan, analysis: &Analysis) -> io::Result<()> {
    let id = |t: usize| plan.tasks[t].id.as_str();
    let list = |tasks: &[usize]| tasks.iter().map(|&t| id(t)).collect::<Vec<_>>().join(", ");
    writeln!(
        out,
        "plan {:?}: {} tasks, {} waves",
        plan.name,
        plan.len(),
        analysis.waves.len()
    )?;
    for (w, wave) in analysis.waves.iter().enumerate() {
        writeln!(out, "wave {}: {}", w + 1, list(wave))?;
    }
    if !analysis.fallback_only.is_empty() {
        writeln!(out, "fallback only: {}", list(&analysis.fallback_only))?;
    }
    if !analysis.subtasks.is_empty() {
        let subtasks: Vec<String> = analysis
            .subtasks
            .iter()
            .filter_map(|&t| {
                plan.tasks[t]
                    .subtask_of
                    .map(|p| format!("{} (of {})", id(t), id(p)))
            })
            .collect();
        writeln!(out, "subtasks: {}", subtasks.join(", "))?;
    }
    if analysis.conflict_pairs.is_empty() {
        writeln!(out, "conflicts: none")?;
    } else {
        writeln!(out, "conflicts: {}", analysis.conflict_pairs.len())?;
        for pair in &analysis.conflict_pairs {
            let reasons: Vec<String> = pair
                .reasons
                .iter()
                .map(|reason| match reason {
                    ConflictReason::File { path, op_a, op_b } => {
                        format!("{path} ({} / {})", op_name(*op_a), op_name(*op_b))
                    }
                    ConflictReason::Declared => "conflicts_with".to_owned(),
                })
                .collect();
            writeln!(
                out,
                "  {} <-> {}: {}",
                id(pair.a),
                id(pair.b),
                reasons.join(", ")
            )?;
        }
    }
    if !analysis.blocked.is_empty() {
        writeln!(out, "blocked by conflicts: {}", analysis.blocked.len())?;
        for blocked in &analysis.blocked {
            writeln!(
                out,
                "  {} waits for {} (wave {})",
                id(blocked.task),
                list(&blocked.by),
                analysis.wave_of[blocked.task].map_or(0, |w| w + 1)
            )?;
        }
    }
    let path = &analysis.critical_path;
    let names: Vec<&str> = path.tasks.iter().map(|&t| id(t)).collect();
    match analysis.report(plan).critical_path.total_timeout {
        Some(total) => writeln!(
            out,
            "critical path: {} ({} tasks, {total} of timeouts)",
            names.join(" -> "),
            names.len(),
        )?,
        None => writeln!(
            out,
            "critical path: {} ({} tasks)",
            names.join(" -> "),
            names.len()
        )?,
    }
    let p = &analysis.max_parallelism;
    writeln!(
        out,
        "max parallelism: {} (wave {}), {} with conflicting tasks serialised (wave {})",
        p.widest_wave,
        p.widest_wave_idx + 1,
        p.without_conflicts,
        p.without_conflicts_wave_idx + 1
    )
}
