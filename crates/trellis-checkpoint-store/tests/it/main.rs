//! Tests of the checkpoint-store against real parts: SQLite files, a fresh PostgreSQL database per
//! test, a private `nats-server -js` per test, and the tonic server on a free port. Nothing is
//! mocked.

mod conformance;
mod driver;
mod grpc;
mod read_model;
mod support;
mod tls;
