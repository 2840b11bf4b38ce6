//! Executions leaving memory. A large one's state is handed to the executor, which drops it on a
//! blocking thread, as a large start's state is built there ([`Answer::Build`]): freeing tens of
//! thousands of instances takes milliseconds (`machine/drop_20k_done`), a pause every other
//! execution of the coordinator would wait through in the turn.
//!
//! [`Answer::Build`]: super::Answer::Build

use trellis_core::ids::ExecutionId;

use super::Coordinator;
use super::live::Live;

/// The state of executions that left memory this turn, too large to drop in it. Dropping it
/// does what dropping each execution would; nothing else is done with it.
#[derive(Default)]
pub struct Retired(pub(super) Vec<Live>);

impl Retired {
    /// Whether it holds no execution.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many executions it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl std::fmt::Debug for Retired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retired")
            .field("executions", &self.0.len())
            .finish()
    }
}

impl Coordinator {
    /// Drops `id` from memory with its idempotency keys, to be loaded again from its log: its
    /// state goes through [`Coordinator::retire`].
    pub(super) fn unload(&mut self, id: ExecutionId) {
        if let Some(live) = self.executions.remove(&id) {
            self.retire(live);
        }
        self.by_key.retain(|_, v| *v != id);
    }

    /// Lets go of an execution's state: dropped here if it is small, else handed out with the
    /// turn's effects ([`super::Effects::retired`]). An execution counts as large from as many
    /// instances as a plan whose state is built off the loop (`Config::build_off_the_loop`;
    /// 0: none is).
    pub(super) fn retire(&mut self, live: Live) {
        let large = self.config.build_off_the_loop;
        if large > 0 && live.machine.n_instances() >= large {
            self.pending.retired.0.push(live);
        }
        // A small one is dropped here, on return.
    }
}
