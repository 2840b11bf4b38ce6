//! `trellis plan …`: check a plan file and show how it would run.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use trellis_core::analysis::{Analysis, ConflictReason, analyze, op_name};
use trellis_core::plan::{Limits, Plan, compile_bytes};

use super::{EXIT_FAILURE, Failure, display_name, read_input};

/// Work with plan files (YAML or JSON; `-` reads stdin).
#[derive(Debug, Subcommand)]
#[command(after_help = "Examples:\n  \
    trellis plan validate examples/seed-001.yaml\n  \
    trellis plan analyze --json examples/feature-x.yaml | jq .waves")]
pub enum PlanCommand {
    /// Check a plan and report every problem, one per line as `FILE: path: message`.
    ///
    /// Prints `ok: plan "NAME" — N tasks, W waves` and exits 0 when the plan is valid; otherwise
    /// prints every error to stderr and exits 2.
    #[command(after_help = "Example:\n  trellis plan validate examples/feature-x.yaml")]
    Validate {
        /// The plan file, or `-` for stdin.
        file: PathBuf,
    },
    /// Show how a plan would run: waves, conflicting tasks, critical path, parallelism.
    ///
    /// Wave 1 holds the tasks with no dependencies, wave k the tasks whose dependencies are all in
    /// earlier waves. Two tasks conflict when they touch one file with a conflicting pair of
    /// operations (CREATE–CREATE, CREATE–DELETE, UPDATE–UPDATE, UPDATE–DELETE, DELETE–DELETE,
    /// DELETE–READ) or declare `conflicts_with`; conflicting tasks never run at the same time.
    #[command(after_help = "Examples:\n  \
        trellis plan analyze examples/seed-001.yaml\n  \
        trellis plan analyze --json examples/feature-x.yaml")]
    Analyze {
        /// The plan file, or `-` for stdin.
        file: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `plan` subcommand and returns the process exit code.
pub fn run(command: PlanCommand) -> ExitCode {
    match command {
        PlanCommand::Validate { file } => with_plan(&file, |out, plan, analysis| {
            writeln!(
                out,
                "ok: plan {:?} — {} tasks, {} waves",
                plan.name,
                plan.len(),
                analysis.waves.len()
            )
        }),
        PlanCommand::Analyze { file, json } => with_plan(&file, |out, plan, analysis| {
            if json {
                serde_json::to_writer_pretty(&mut *out, &analysis.report(plan))
                    .map_err(io::Error::other)?;
                writeln!(out)
            } else {
                write_analysis(out, plan, analysis)
            }
        }),
    }
}

/// Reads and compiles a plan file (or stdin for `-`), printing every problem on stderr as
/// `FILE: message`; returns the plan's bytes with the compiled plan.
///
/// # Errors
///
/// Bad input (exit 2, message already printed) for an unreadable file or an invalid plan.
pub fn load(file: &Path) -> Result<(Vec<u8>, Plan), Failure> {
    let name = display_name(file);
    let limits = Limits::default();
    let bytes = read_input(file, limits.max_input_bytes).map_err(|message| {
        eprintln!("{name}: {message}");
        Failure::bad_input("")
    })?;
    match compile_bytes(&bytes, &limits) {
        Ok(plan) => Ok((bytes, plan)),
        Err(errors) => {
            let mut err = BufWriter::new(io::stderr().lock());
            for error in &errors {
                let _ = writeln!(err, "{name}: {error}");
            }
            let _ = err.flush();
            Err(Failure::bad_input(""))
        }
    }
}

/// Loads, compiles and analyses `file`, then calls `show`; reports problems on stderr.
fn with_plan(
    file: &Path,
    show: impl FnOnce(&mut dyn Write, &Plan, &Analysis) -> io::Result<()>,
) -> ExitCode {
    let plan = match load(file) {
        Ok((_, plan)) => plan,
        Err(failure) => return ExitCode::from(failure.exit),
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
