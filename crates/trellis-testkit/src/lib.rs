//! Test support shared by Trellis tests: plan fixtures today; NATS and PostgreSQL harnesses as the
//! services that need them arrive.
