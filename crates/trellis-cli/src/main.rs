//! The `trellis` command line.
//!
//! `main` only parses arguments and maps the outcome to an exit code; each command group lives in
//! its own module under `commands/`, the coordinator client is created in `client`, and what is
//! printed is built in `render`.
//!
//! Exit codes: 0 success, 1 a failure (no coordinator, an execution that failed, a refused call),
//! 2 bad usage or bad input (an invalid plan, an unreadable file, an invalid request).

mod client;
mod commands;
mod local;

/// mimalloc hands memory back to the system once it has stayed freed a while
/// (`trellis_coordinator::allocator`): a coordinator (or `trellis dev`) shrinks again after
/// finished executions leave its memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
mod render;

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
        cat plan.json | trellis plan validate -\n  \
        trellis demo\n  \
        trellis dev\n  \
        trellis submit --wait examples/seed-001.yaml\n  \
        trellis tree 0190a5c4-7d1e-7000-8000-000000000001\n  \
        trellis logs -f 0190a5c4-7d1e-7000-8000-000000000001 build\n  \
        TRELLIS_COORDINATOR=http://coordinator:7400 trellis list --state running"
)]
struct Cli {
    /// The coordinator's gRPC address.
    #[arg(
        long,
        global = true,
        env = "TRELLIS_COORDINATOR",
        value_name = "URL",
        default_value = client::DEFAULT_COORDINATOR
    )]
    coordinator: String,
    #[command(flatten)]
    client: trellis_grpc::ClientArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(subcommand)]
    Plan(commands::plan::PlanCommand),
    Submit(commands::submit::SubmitArgs),
    Status(commands::inspect::StatusArgs),
    List(commands::inspect::ListArgs),
    Tree(commands::inspect::TreeArgs),
    Events(commands::inspect::EventsArgs),
    Logs(commands::logs::LogsArgs),
    Output(commands::output::OutputArgs),
    // pause, resume, cancel, retry, checkpoint and answer, each with its own help.
    #[command(flatten)]
    Control(commands::control::Control),
    Workers(commands::workers::WorkersArgs),
    /// Projects of the backlog: the scope of task numbers, lists, rules and grouping weights.
    Projects(commands::backlog::ProjectsArgs),
    /// The backlog: tasks in the evaluation queue or in task lists, before they run.
    Tasks(commands::backlog::TasksArgs),
    /// Task lists: ordered groups of backlog tasks that run together.
    Lists(commands::backlog::ListsArgs),
    /// Validation rules a backlog task must pass before it can run.
    Rules(commands::backlog::RulesArgs),
    /// Grouping suggestions: which queued tasks belong in one list.
    Suggestions(commands::backlog::SuggestionsArgs),
    /// Notification sinks: webhooks and chat bots told of questions and ended executions.
    Sinks(commands::backlog::SinksArgs),
    /// Task templates: the fields a new backlog task takes when it leaves them empty.
    Templates(commands::backlog::TemplatesArgs),
    Cluster(commands::cluster::ClusterArgs),
    Dev(commands::dev::DevArgs),
    Coordinator(trellis_coordinator::Args),
    /// Run the planner service in the foreground: compiles and analyses plans over gRPC.
    Planner(trellis_planner::Args),
    /// Run the monitor in the foreground: the live web UI and JSON API (needs NATS and a
    /// coordinator).
    Monitor(trellis_monitor::Args),
    #[command(subcommand)]
    Token(commands::token::TokenCommand),
    Demo(commands::demo::DemoArgs),
    Bench(commands::bench::BenchArgs),
}

fn main() -> ExitCode {
    trellis_coordinator::allocator::tune();
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
    // Every gRPC call of this process carries these credentials.
    match cli.client.load() {
        // One command's calls (the planner's, then the coordinator's) are one trace.
        Ok(security) => client::init(trellis_grpc::ClientSecurity {
            traceparent: Some(trellis_telemetry::propagation::new_root_traceparent()),
            ..security
        }),
        Err(e) => {
            eprintln!("trellis: {e}");
            return ExitCode::from(commands::EXIT_BAD_INPUT);
        }
    }
    let url = cli.coordinator.as_str();
    use commands::{control, inspect, run_remote, submit, workers};
    match cli.command {
        Command::Plan(command) => commands::plan::run(command),
        Command::Submit(args) => run_remote(submit::run(url, args)),
        Command::Status(args) => run_remote(inspect::status(url, args)),
        Command::List(args) => run_remote(inspect::list(url, args)),
        Command::Tree(args) => run_remote(inspect::tree(url, args)),
        Command::Events(args) => run_remote(inspect::events(url, args)),
        Command::Logs(args) => run_remote(commands::logs::run(url, args)),
        Command::Output(args) => run_remote(commands::output::run(url, args)),
        Command::Control(command) => run_remote(control::run(url, command)),
        Command::Workers(args) => run_remote(workers::run(url, args)),
        Command::Projects(args) => run_remote(commands::backlog::projects(args)),
        Command::Tasks(args) => run_remote(commands::backlog::tasks(args)),
        Command::Lists(args) => run_remote(commands::backlog::lists(args)),
        Command::Rules(args) => run_remote(commands::backlog::rules(args)),
        Command::Suggestions(args) => run_remote(commands::backlog::suggestions(args)),
        Command::Sinks(args) => run_remote(commands::backlog::sinks(args)),
        Command::Templates(args) => run_remote(commands::backlog::templates(args)),
        Command::Cluster(args) => run_remote(commands::cluster::run(url, args)),
        Command::Dev(args) => local::run_local(commands::dev::run(args)),
        Command::Coordinator(args) => trellis_coordinator::run_with(args, &cli.client),
        Command::Planner(args) => trellis_planner::run_with(args, &cli.client),
        Command::Monitor(args) => trellis_monitor::run_with(args, url.to_owned(), &cli.client),
        Command::Token(command) => commands::token::run(command),
        Command::Demo(args) => local::run_local(commands::demo::run(args)),
        Command::Bench(args) => local::run_local(commands::bench::run(args)),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
