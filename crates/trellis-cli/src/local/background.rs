//! Background services of the embedded cluster: on a thread and runtime of their own, at a
//! lower CPU priority than the executions' path.

use std::future::Future;

use tokio::sync::mpsc;

use super::report_stop;
use crate::commands::Failure;

/// How much lower than the rest of the process a background service's threads run: with nice
/// 10 a thread gets about a tenth of the share of a thread at 0 while both want a core, and any
/// core nobody else wants.
const BACKGROUND_NICE: i32 = 10;

/// Runs a background service of the cluster (the checkpoint-store, whose read model's ingest and
/// SQLite writes use a quarter of the machine under load) on a thread of its own at a lower CPU
/// priority ([`BACKGROUND_NICE`]), with a runtime of its own. Every thread it starts (SQLite's
/// connection threads, its blocking pool) inherits the priority, so while the cores are saturated
/// the executions' own path (coordinator, workers, NATS) runs first and the read model catches up
/// after; with cores to spare nothing changes. A failure is reported as [`super::supervise`] reports
/// one.
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
            lower_this_threads_priority(name);
            if let Err(err) = runtime.block_on(service()) {
                report_stop(name, err, &stopped);
            }
        })
        .map_err(|e| Failure::failed(format!("cannot start the {name}'s thread: {e}")))?;
    Ok(())
}

/// Lowers the calling thread's CPU priority by [`BACKGROUND_NICE`] (Linux, where the nice value
/// belongs to a thread and the threads it starts inherit it); elsewhere does nothing. A refusal
/// only costs the priority, so it is said and the service runs on.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn lower_this_threads_priority(name: &str) {
    // SAFETY: `gettid`, `getpriority` and `setpriority` take and return plain integers and touch
    // no memory of ours; the id is this thread's own, so reading its nice value cannot fail (and
    // a failure's -1 would only lower it by one less). Nice values end at 19.
    let refused = unsafe {
        let tid = libc::gettid() as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        let lowered = now.saturating_add(BACKGROUND_NICE).min(19);
        libc::setpriority(libc::PRIO_PROCESS, tid, lowered) != 0
    };
    if refused {
        let err = std::io::Error::last_os_error();
        eprintln!(
            "trellis: cannot lower the {name}'s CPU priority ({err}); it runs at the others'"
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_this_threads_priority(_name: &str) {}

/// Linux only: elsewhere the priority is left as it is.
#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::{BACKGROUND_NICE, in_background};

    /// The calling thread's nice value, from `/proc/thread-self/stat` (its 19th field).
    fn own_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("a Linux /proc");
        // The command name may hold spaces: the fields after it start at its closing parenthesis.
        let after_name = &stat[stat.rfind(')').expect("a command name") + 2..];
        let nice = after_name.split(' ').nth(16).expect("a nice field");
        nice.parse().expect("a number")
    }

    /// A background service runs below the rest of the process, and so does every thread it
    /// starts (SQLite's connection threads, its blocking pool); the caller's thread stays as it
    /// was.
    #[test]
    fn a_background_service_and_its_threads_run_at_a_lower_priority() {
        let caller = own_nice();
        let (report, _stopped) = tokio::sync::mpsc::unbounded_channel();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        in_background(
            "test-service",
            move || async move {
                let started = std::thread::spawn(own_nice).join().expect("the thread ran");
                let blocking = tokio::task::spawn_blocking(own_nice).await?;
                let _ = seen_tx.send((own_nice(), started, blocking));
                Ok(())
            },
            &report,
        )
        .expect("the service starts");
        let (service, started, blocking) = seen_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the service reports");
        let lowered = (caller + BACKGROUND_NICE).min(19);
        assert_eq!(
            (service, started, blocking),
            (lowered, lowered, lowered),
            "the service's thread, a thread it starts, its blocking pool"
        );
        assert_eq!(own_nice(), caller, "the caller's priority is its own");
    }
}
