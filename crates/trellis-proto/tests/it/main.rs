//! Integration tests of `trellis-proto`: one test binary, so the crate links its tests once.

mod convert;
mod descriptor;
mod generated;
mod plan;
mod round_trip;
