//! How the embedded cluster and the nats-server it starts share the machine's cores.
//!
//! `trellis dev`, `demo` and `bench` run every service in one process beside a nats-server. Left
//! to their defaults, tokio starts a worker thread per core and Go runs its scheduler on every
//! core (`GOMAXPROCS`), so on a small machine both processes' schedulers wake and spin on every
//! core, and most hops of a task wake a thread on a core the other process holds. Split instead,
//! each process keeps to its share: on the two-core machine of the README's table one task's p50
//! fell from 1.00–1.07 to 0.78–0.82 ms with `throughput` as high as before
//! (docs/performance-cores.md). A server that syncs every write keeps every core.
//!
//! A runtime of one core runs on tokio's current-thread scheduler: one thread polls every task,
//! the command's own future and the I/O driver, so a wake from one service's task to another's
//! never crosses threads (with one worker on the multi-thread scheduler, the command's future ran
//! on the main thread beside it, and the scheduler woke and parked the worker across threads).
//! One task's p50 fell from 0.77–0.84 to 0.73–0.76 ms, `executions` rose by a sixth.

use std::num::NonZeroUsize;

use super::SyncMode;

/// The environment variable that sets tokio's worker threads; when set, it decides.
pub(crate) const RUNTIME_THREADS_ENV: &str = "TOKIO_WORKER_THREADS";
/// The environment variable that sets the Go scheduler's processors; when set, the nats-server
/// inherits it unchanged.
pub(crate) const NATS_PROCS_ENV: &str = "GOMAXPROCS";

/// Cores for this process's runtime and for the nats-server it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CoreSplit {
    /// Threads of the process's tokio runtime (the services' own path; the read model and large
    /// plans run on lowered threads of their own beside them).
    pub(crate) runtime: usize,
    /// `GOMAXPROCS` of the nats-server.
    pub(crate) nats: usize,
}

impl CoreSplit {
    /// Half of `cores` for the nats-server (at least one), the rest (at least one) for the
    /// runtime: 2 → 1 + 1, 3 → 2 + 1, 8 → 4 + 4.
    pub(crate) fn of(cores: NonZeroUsize) -> Self {
        let cores = cores.get();
        let nats = (cores / 2).max(1);
        Self {
            runtime: cores.saturating_sub(nats).max(1),
            nats,
        }
    }

    /// The split of the cores this process may run on (its CPU affinity and cgroup quota); two
    /// when that cannot be read.
    pub(crate) fn here() -> Self {
        Self::of(
            std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN.saturating_add(1)),
        )
    }
}

/// The scheduler of the process's runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheduler {
    /// The current-thread scheduler: the split gave the runtime one core.
    CurrentThread,
    /// The multi-thread scheduler with this many workers.
    Workers(usize),
    /// The multi-thread scheduler with the workers [`RUNTIME_THREADS_ENV`] asks for (tokio reads
    /// it itself).
    FromEnvironment,
}

impl Scheduler {
    /// The scheduler for a runtime given `threads` cores.
    pub(crate) fn for_threads(threads: usize) -> Self {
        if threads <= 1 {
            Self::CurrentThread
        } else {
            Self::Workers(threads)
        }
    }

    /// The environment's choice when it makes one, else the split's.
    pub(crate) fn here() -> Self {
        if std::env::var_os(RUNTIME_THREADS_ENV).is_some() {
            Self::FromEnvironment
        } else {
            Self::for_threads(CoreSplit::here().runtime)
        }
    }

    /// A builder of a runtime on this scheduler (with nothing enabled yet).
    pub(crate) fn builder(self) -> tokio::runtime::Builder {
        match self {
            Self::CurrentThread => tokio::runtime::Builder::new_current_thread(),
            Self::Workers(threads) => {
                let mut builder = tokio::runtime::Builder::new_multi_thread();
                builder.worker_threads(threads);
                builder
            }
            Self::FromEnvironment => tokio::runtime::Builder::new_multi_thread(),
        }
    }
}

/// The `GOMAXPROCS` to start the nats-server with: the split's when it writes at its interval;
/// `None` (the environment's, or Go's default of every core) when the environment sets one, or
/// when the server syncs every write: its threads then wait on the disk in turn, and with a
/// processor per core it kept serving meanwhile (`--sync always` `throughput` 28,759–32,778
/// against 24,717–26,977 tasks/s on one).
pub(crate) fn nats_procs(sync: SyncMode) -> Option<usize> {
    (sync == SyncMode::Interval && std::env::var_os(NATS_PROCS_ENV).is_none())
        .then(|| CoreSplit::here().nats)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use super::{CoreSplit, Scheduler};

    fn split(cores: usize) -> (usize, usize) {
        let cores = NonZeroUsize::new(cores).expect("a test passes a positive count");
        let CoreSplit { runtime, nats } = CoreSplit::of(cores);
        (runtime, nats)
    }

    #[test]
    fn the_cores_are_shared_and_neither_side_gets_none() {
        assert_eq!(split(1), (1, 1), "one core: both get it");
        assert_eq!(split(2), (1, 1));
        assert_eq!(split(3), (2, 1));
        assert_eq!(split(8), (4, 4));
        assert_eq!(split(64), (32, 32));
    }

    /// One core for the runtime means one thread for every task: the current-thread scheduler.
    #[test]
    fn a_runtime_of_one_core_runs_on_the_current_thread() {
        assert_eq!(Scheduler::for_threads(1), Scheduler::CurrentThread);
        assert_eq!(Scheduler::for_threads(2), Scheduler::Workers(2));
        let runtime = Scheduler::for_threads(1)
            .builder()
            .build()
            .expect("a runtime starts");
        assert_eq!(
            runtime.handle().runtime_flavor(),
            tokio::runtime::RuntimeFlavor::CurrentThread
        );
        let runtime = Scheduler::for_threads(2)
            .builder()
            .build()
            .expect("a runtime starts");
        assert_eq!(runtime.metrics().num_workers(), 2);
    }
}
