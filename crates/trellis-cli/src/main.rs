//! The `trellis` command line.
//!
//! `main` only parses arguments and maps the outcome to an exit code; each command group lives in
//! its own module under `commands/`.
//!
//! Exit codes: 0 success, 1 an unexpected failure (such as a closed stdout), 2 bad usage or bad
//! input (an invalid plan, an unreadable file).

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Durable execution of task graphs.
#[derive(Debug, Parser)]
#[command(
    name = "trellis",
    version,
    about = "Trellis: a distributed, durable engine for task graphs",
    long_about = "Trellis: a distributed, durable engine for task graphs.\n\n\
        A plan is a YAML or JSON file listing tasks, their dependencies, the files they touch and \
        what to do when they fail. Trellis compiles it, shows how it would run (waves, conflicts, \
        critical path), and runs it durably across workers.",
    after_help = "Examples:\n  \
        trellis plan validate examples/feature-x.yaml\n  \
        trellis plan analyze examples/seed-001.yaml\n  \
        trellis plan analyze --json examples/feature-x.yaml\n  \
        cat plan.json | trellis plan validate -"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(subcommand)]
    Plan(commands::plan::PlanCommand),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` are "errors" printed to stdout with success.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(commands::EXIT_BAD_INPUT)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Plan(command) => commands::plan::run(command),
    }
}
