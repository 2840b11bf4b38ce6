//! Integration tests of `trellis-proto`: one test binary (see STYLE.md, "One integration-test
//! binary per crate").

mod convert;
mod descriptor;
mod generated;
mod plan;
mod round_trip;
