//! System tests: every Trellis service runs as its own process (the `sys-*` binaries of this
//! package) against a private `nats-server` and a private PostgreSQL, and the tests kill and
//! restart them while an execution runs.

mod breakers;
mod corrupt;
mod failpoints;
mod faults;
mod harness;
mod logs;
mod outcome;
mod pause;
mod reads;
mod secrets;
mod store_crash;
mod system;
mod takeover;
mod validation;
