//! Entry point of the `trellis-agent-worker` binary.

fn main() -> std::process::ExitCode {
    eprintln!(
        "trellis-agent-worker: this service is not available yet; use `trellis plan validate|analyze`"
    );
    std::process::ExitCode::from(2)
}
