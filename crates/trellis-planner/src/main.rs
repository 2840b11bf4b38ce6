//! Entry point of the `trellis-planner` binary.

fn main() -> std::process::ExitCode {
    eprintln!(
        "trellis-planner: this service is not available yet; use `trellis plan validate|analyze`"
    );
    std::process::ExitCode::from(2)
}
