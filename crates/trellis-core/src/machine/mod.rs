//! The execution state machine.
