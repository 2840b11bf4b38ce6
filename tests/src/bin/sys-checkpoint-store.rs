//! The `trellis-checkpoint-store` binary, hosted here so the system tests can run it as a process.

fn main() -> std::process::ExitCode {
    trellis_checkpoint_store::main_entry()
}
