//! Entry point of the `trellis-checkpoint-store` binary; everything is in the library
//! ([`trellis_checkpoint_store::main_entry`]) so other packages can host the same binary.

fn main() -> std::process::ExitCode {
    trellis_checkpoint_store::main_entry()
}
