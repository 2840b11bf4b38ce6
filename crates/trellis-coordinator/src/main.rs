//! Entry point of the `trellis-coordinator` binary.

fn main() -> std::process::ExitCode {
    eprintln!(
        "trellis-coordinator: this service is not available yet; use `trellis plan validate|analyze`"
    );
    std::process::ExitCode::from(2)
}
