//! Generated Trellis contracts.
