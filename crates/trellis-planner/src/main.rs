//! Entry point of the `trellis-planner` binary; everything is in the library
//! ([`trellis_planner::main_entry`]).

fn main() -> std::process::ExitCode {
    trellis_planner::main_entry()
}
