//! Entry point of the `trellis-monitor` binary.

fn main() -> std::process::ExitCode {
    eprintln!(
        "trellis-monitor: this service is not available yet; use `trellis plan validate|analyze`"
    );
    std::process::ExitCode::from(2)
}
