//! Entry point of the `trellis-checkpoint-store` binary.

fn main() -> std::process::ExitCode {
    eprintln!(
        "trellis-checkpoint-store: this service is not available yet; use `trellis plan validate|analyze`"
    );
    std::process::ExitCode::from(2)
}
