//! The checkpoint-store's metrics (Prometheus names; counters are scraped with `_total`):
//!
//! - `trellis_store_checkpoints` by `kind` (full, delta): checkpoints stored;
//! - `trellis_store_checkpoint_size_bytes` by `kind` and `trellis_store_checkpoint_write_seconds`
//!   by `kind`: their sizes, and the time from receiving one to having it in the database;
//! - `trellis_store_events_ingested`: events of the log taken into the read model;
//! - `trellis_store_read_model_write_seconds`: the time of each read-model transaction;
//! - `trellis_store_log_batches_copied`: task log batches of `TRELLIS_LOGS` copied into the store.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use trellis_telemetry::Registry;
use trellis_telemetry::metrics::{
    HistogramFamily, Labels1, latency_buckets, latency_family, size_family,
};

/// The store's metric families.
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    pub(crate) checkpoints: Family<Labels1, Counter>,
    pub(crate) checkpoint_bytes: HistogramFamily<Labels1>,
    pub(crate) checkpoint_seconds: HistogramFamily<Labels1>,
    pub(crate) events_ingested: Counter,
    pub(crate) write_seconds: Histogram,
    pub(crate) log_batches_copied: Counter,
}

impl Metrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        Self {
            checkpoints: registry.metric(
                "trellis_store_checkpoints",
                "Checkpoints stored, by kind.",
                Family::default,
            ),
            checkpoint_bytes: registry.metric(
                "trellis_store_checkpoint_size_bytes",
                "Size of the checkpoints stored, by kind.",
                size_family,
            ),
            checkpoint_seconds: registry.metric(
                "trellis_store_checkpoint_write_seconds",
                "Time to verify and store a checkpoint, by kind.",
                latency_family,
            ),
            events_ingested: registry.metric(
                "trellis_store_events_ingested",
                "Events of the log taken into the read model.",
                Counter::default,
            ),
            write_seconds: registry.metric(
                "trellis_store_read_model_write_seconds",
                "Time of each read-model transaction.",
                latency_buckets,
            ),
            log_batches_copied: registry.metric(
                "trellis_store_log_batches_copied",
                "Task log batches of TRELLIS_LOGS copied into the store.",
                Counter::default,
            ),
        }
    }
}
