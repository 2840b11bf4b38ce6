//! Where the `trellis-core` model and the wire messages of `trellis-proto` meet: every conversion
//! between the two, split by contract, each with precise [`ConvertError`](error::ConvertError)s.
//!
//! - [`error`]: what is wrong with a received message, and at which field.
//! - [`log`]: the event log (`Event`, `EventBatch`), the source of truth; encoding and decoding
//!   are exact inverses, so a replay rebuilds the state that was live.
//! - [`replay`]: the one replayer: `ExecutionStarted` and the events after it become the
//!   execution that was live, with one policy for duplicates, gaps and corrupt messages.
//! - [`worker`]: the worker contract: assignments, results (turned into events), heartbeats.
//! - [`read`]: read projections: states, progress, task instance records, the execution graph.
//! - [`plan`]: plans on the wire, their analyses and validation errors; a received plan is
//!   compiled (and so validated) like any spec.
//! - [`common`]: the pieces several contracts share: usage, subtask groups, questions.
//!
//! Wire types stop at the edge of each service: the core does not derive prost, and nothing that
//! arrives is trusted. Decoding never panics; it returns the first problem with its path.

pub mod common;
pub mod error;
pub mod log;
pub mod plan;
pub mod read;
pub mod replay;
pub mod worker;
