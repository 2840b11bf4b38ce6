//! A stop signal as a process manager sends it: at any moment after a service is ready. A test
//! binary of its own, since the signal goes to the whole process.

#![cfg(unix)]

use std::time::Duration;

/// A SIGTERM that arrives after `shutdown_signal` is called but before its future is first
/// polled completes the future. Were the handler installed by the first poll, SIGTERM's default
/// action would end this test process instead.
#[tokio::test]
async fn a_sigterm_before_the_first_poll_stops_gracefully() {
    let stop = trellis_telemetry::shutdown_signal();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill -TERM of this process: {status}");
    tokio::time::timeout(Duration::from_secs(10), stop)
        .await
        .expect("the SIGTERM completes the shutdown signal within 10 s");
}
