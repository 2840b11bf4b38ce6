//! Integration tests of `trellis-wire`, one file per contract: one test binary, so the crate links
//! its tests once.

mod error;
mod execution;
mod log;
mod plan;
mod property;
mod read;
mod support;
mod worker;
