//! Background services of the embedded cluster: on a thread and runtime of their own, in the
//! idle scheduling class, below the executions' path.

use std::future::Future;

use tokio::sync::mpsc;
use trellis_coordinator::priority::{idle_this_thread, lower_this_thread};

use super::report_stop;
use crate::commands::Failure;

/// Runs a background service of the cluster (the checkpoint-store, whose read model's ingest and
/// SQLite writes take most of a core while `throughput` runs) on a thread of its own with a
/// runtime of its own, [`BACKGROUND_NICE`](trellis_coordinator::priority::BACKGROUND_NICE)
/// lower and in the idle scheduling class
/// ([`idle_this_thread`](trellis_coordinator::priority::idle_this_thread)). Every thread it
/// starts (SQLite's connection threads, its blocking pool) inherits both, so while the cores are
/// saturated the executions' own path (coordinator, workers, NATS) and the lowered thread that
/// builds large plans run first and the read model catches up after; with cores to spare
/// nothing changes. At nice 10 alone the read model still took its share of a saturated
/// machine: four rounds of `trellis bench --scenario throughput --scenario executions
/// --scenario latency --scenario loaded` gave 45,703–50,137 against 35,291–48,410 tasks/s and
/// 6,987–7,643 against 6,478–7,271 executions/s with the idle class. A failure is reported as
/// [`super::supervise`] reports one.
pub(super) fn in_background<M, F>(
    name: &'static str,
    service: M,
    stopped: &mpsc::UnboundedSender<String>,
) -> Result<(), Failure>
where
    M: FnOnce() -> F + Send + 'static,
    F: Future<Output = Result<(), std::io::Error>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::failed(format!("cannot start the {name}'s runtime: {e}")))?;
    let stopped = stopped.clone();
    std::thread::Builder::new()
        .name(format!("trellis-{name}"))
        .spawn(move || {
            lower_this_thread(&format!("the {name}"));
            idle_this_thread(&format!("the {name}"));
            if let Err(err) = runtime.block_on(service()) {
                report_stop(name, err, &stopped);
            }
        })
        .map_err(|e| Failure::failed(format!("cannot start the {name}'s thread: {e}")))?;
    Ok(())
}

/// Linux only: elsewhere the priority is left as it is.
#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::in_background;
    use trellis_coordinator::priority::BACKGROUND_NICE;
    use trellis_testkit::{SCHED_IDLE, this_threads_nice, this_threads_policy};

    /// The calling thread's nice value and scheduling policy.
    fn own_priority() -> (i32, u32) {
        let nice = this_threads_nice().expect("a Linux /proc");
        (nice, this_threads_policy().expect("a Linux /proc"))
    }

    /// A background service runs below the rest of the process, in the idle class, and so does
    /// every thread it starts (SQLite's connection threads, its blocking pool); the caller's
    /// thread stays as it was.
    #[test]
    fn a_background_service_and_its_threads_run_at_a_lower_priority() {
        let caller = own_priority();
        let (report, _stopped) = tokio::sync::mpsc::unbounded_channel();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        in_background(
            "test-service",
            move || async move {
                let started = std::thread::spawn(own_priority)
                    .join()
                    .expect("the thread ran");
                let blocking = tokio::task::spawn_blocking(own_priority).await?;
                let _ = seen_tx.send((own_priority(), started, blocking));
                Ok(())
            },
            &report,
        )
        .expect("the service starts");
        let (service, started, blocking) = seen_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the service reports");
        let lowered = ((caller.0 + BACKGROUND_NICE).min(19), SCHED_IDLE);
        assert_eq!(
            (service, started, blocking),
            (lowered, lowered, lowered),
            "the service's thread, a thread it starts, its blocking pool"
        );
        assert_eq!(own_priority(), caller, "the caller's priority is its own");
    }
}
