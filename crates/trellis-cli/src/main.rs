//! The `trellis` command line.
fn main() {}
