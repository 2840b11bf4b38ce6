//! Integration tests of `trellis-proto`: one test binary, so the crate links its tests once.

mod descriptor;
mod generated;
mod round_trip;
