//! The Trellis checkpoint-store service.
//!
//! This crate is the service's library; `main.rs` is a thin shell around it. The service itself
//! is not built yet: its binary says so and exits with status 2.
