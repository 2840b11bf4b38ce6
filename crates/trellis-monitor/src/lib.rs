//! The Trellis monitor service.
//!
//! This crate is the service's library; `main.rs` is a thin shell around it. The service itself
//! is not built yet: its binary says so and exits with status 2.

/// Runs the `trellis-monitor` binary, which says the service is not available yet and returns
/// status 2.
pub fn main_entry() -> std::process::ExitCode {
    eprintln!(
        "trellis-monitor: this service is not available yet; use `trellis plan validate|analyze`"
    );
    std::process::ExitCode::from(2)
}
