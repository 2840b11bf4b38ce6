//! Integration tests of `trellis-core`, one binary (faster to link than one per file).

mod common;
mod machine;
mod machine_props;
mod questions;
mod relationships;
mod routes;
