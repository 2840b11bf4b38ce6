//! Work that can wait while the cores are busy: large plans are compiled and built, and large
//! executions leaving memory are freed, on one thread of lower CPU priority, so the milliseconds
//! a plan of thousands of tasks takes do not take a core from the turns and hops of the
//! executions already running; with cores to spare nothing changes.

use std::sync::OnceLock;
use std::sync::mpsc;

use tokio::sync::oneshot;

/// How much lower than the rest of the process the thread runs: with nice 10 a thread gets about
/// a tenth of the share of a thread at 0 while both want a core, and any core nobody else wants.
pub const BACKGROUND_NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// The lowered thread's queue; `None` when the thread could not be started.
static LOWERED: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

/// Runs `job` on the process's lowered thread ([`BACKGROUND_NICE`]), or on tokio's blocking
/// pool where that thread cannot be started (so it must be called within a runtime). Jobs on
/// the lowered thread run one at a time, in the order they came; one that panics ends alone.
pub fn spawn(job: impl FnOnce() + Send + 'static) {
    let queue = LOWERED.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("trellis-lowered".to_owned())
            .spawn(move || {
                lower_this_thread("the thread of large plans");
                for job in rx {
                    // A job's panic is its own: the next job still runs.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .ok()
            .map(|_| tx)
    });
    let job: Job = Box::new(job);
    let refused = match queue {
        Some(queue) => queue.send(job).err().map(|mpsc::SendError(job)| job),
        None => Some(job),
    };
    if let Some(job) = refused {
        drop(tokio::task::spawn_blocking(job));
    }
}

/// Runs `job` as [`spawn`] does and returns its result; `Err` when it panicked.
pub async fn lowered<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (done_tx, done_rx) = oneshot::channel();
    spawn(move || {
        let _ = done_tx.send(job());
    });
    done_rx.await.map_err(|_| "it panicked".to_owned())
}

/// Lowers the calling thread's CPU priority by [`BACKGROUND_NICE`] (Linux, where the nice value
/// belongs to a thread and the threads it starts inherit it); elsewhere does nothing. A refusal
/// only costs the priority, so it is said and the thread runs on; `what` names it.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn lower_this_thread(what: &str) {
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
        tracing::warn!(%err, "cannot lower the CPU priority of {what}; it runs at the others'");
    }
}

#[cfg(not(target_os = "linux"))]
pub fn lower_this_thread(_what: &str) {}

/// Puts the calling thread in Linux's idle scheduling class (`SCHED_IDLE`, inherited by the
/// threads it starts): it runs on what the process's other threads and every other process leave
/// of the cores, and a thread of the normal class that wakes takes the core from it at once.
/// Stricter than [`lower_this_thread`], whose nice 10 still takes a share while the cores are
/// saturated: for work whose lag costs nobody a wait (the embedded cluster's read model). Elsewhere
/// does nothing; a refusal only costs the class, so it is said and the thread runs on.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn idle_this_thread(what: &str) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` only reads the parameter, borrowed for the call; pid 0 is
    // the calling thread, and SCHED_IDLE takes a static priority of 0.
    let refused = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0;
    if refused {
        let err = std::io::Error::last_os_error();
        tracing::warn!(%err, "cannot put {what} in the idle scheduling class; it runs lowered only");
    }
}

#[cfg(not(target_os = "linux"))]
pub fn idle_this_thread(_what: &str) {}

/// Linux only: elsewhere the priority is left as it is.
#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use trellis_testkit::this_threads_nice;

    fn own_nice() -> i32 {
        this_threads_nice().expect("a Linux /proc")
    }

    /// A job runs on a thread below the caller's priority, and the caller's stays as it was.
    #[tokio::test]
    async fn a_lowered_job_runs_below_the_callers_priority() {
        let caller = own_nice();
        let nice = lowered(own_nice).await.expect("the job ran");
        assert_eq!(nice, (caller + BACKGROUND_NICE).min(19));
        assert_eq!(own_nice(), caller, "the caller's priority is its own");
    }

    /// A job that panics is an error for its caller; the thread goes on with the next job.
    #[tokio::test]
    async fn a_panicking_job_fails_alone() {
        let failed = lowered(|| -> u32 { panic!("a job that fails") }).await;
        assert_eq!(failed, Err("it panicked".to_owned()));
        assert_eq!(lowered(|| 7).await, Ok(7), "the next job runs");
    }
}
