//! The execution-graph builder of seed 000.
