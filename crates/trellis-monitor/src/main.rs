//! Entry point of the `trellis-monitor` binary; everything is in the library
//! ([`trellis_monitor::main_entry`]) so other packages can host the same binary.

fn main() -> std::process::ExitCode {
    trellis_monitor::main_entry()
}
