//! End-to-end tests of the coordinator with real agent-workers over a real `nats-server -js`
//! started per test. Nothing is mocked.

mod auth;
mod cluster;
mod engine;
mod features;
mod handoff;
mod hostile;
mod metrics;
mod offers;
mod recovery;
mod relationships;
mod run;
