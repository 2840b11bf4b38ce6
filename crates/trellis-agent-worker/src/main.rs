//! Entry point of the `trellis-agent-worker` binary; everything is in the library
//! ([`trellis_agent_worker::main_entry`]) so other packages can host the same binary.

fn main() -> std::process::ExitCode {
    trellis_agent_worker::main_entry()
}
