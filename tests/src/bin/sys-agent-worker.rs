//! The `trellis-agent-worker` binary, hosted here so the system tests can run it as a process.

fn main() -> std::process::ExitCode {
    trellis_agent_worker::main_entry()
}
