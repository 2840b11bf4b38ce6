//! Entry point of the `trellis-coordinator` binary; everything is in the library
//! ([`trellis_coordinator::main_entry`]) so other packages can host the same binary.

/// mimalloc hands memory back to the system once it has stayed freed a while
/// ([`trellis_coordinator::allocator`]): a coordinator's resident memory falls again after
/// finished executions leave it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    trellis_coordinator::allocator::tune();
    trellis_coordinator::main_entry()
}
