//! `trellis-core`: the pure domain of Trellis.
//!
//! It holds the model (ids, plans, task instance records), plan compilation and analysis (waves,
//! file conflicts, critical path), failure policy, the execution state machine
//! (`machine::Execution`: `apply(event)` is deterministic, `decide(now)` yields commands) and the
//! execution-graph builder of seed 000.
//!
//! Architecture invariant: this crate does no I/O. It reads no clock, no random source, no network,
//! no file; time and entropy come in as arguments. That is what makes replaying an event log
//! reproduce the exact state that was live.

pub mod analysis;
pub mod backlog;
pub mod checksum;
pub mod graph;
pub mod ids;
pub mod machine;
pub mod plan;
pub mod policy;
pub mod quota;
pub mod record;
pub mod time;
