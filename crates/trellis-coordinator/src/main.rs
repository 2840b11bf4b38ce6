//! Entry point of the `trellis-coordinator` binary; everything is in the library
//! ([`trellis_coordinator::main_entry`]) so other packages can host the same binary.

fn main() -> std::process::ExitCode {
    trellis_coordinator::main_entry()
}
