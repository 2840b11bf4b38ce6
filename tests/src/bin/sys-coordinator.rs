//! The `trellis-coordinator` binary, hosted here so the system tests can run it as a process.

fn main() -> std::process::ExitCode {
    trellis_coordinator::main_entry()
}
