//! What the checkpoint-store does with the messages it consumes from NATS, up to the first I/O,
//! for the fuzz targets in `fuzz/` (feature `fuzzing`; not a stable API).

/// Feeds event log messages (`trellis.events.<execution_id>`) to a fresh read model; returns the
/// number of event rows it would write.
pub fn ingest_event_log(payloads: &[&[u8]]) -> usize {
    crate::ingest::fuzzing::ingest(payloads)
}

/// Feeds heartbeats (`trellis.workers.heartbeat.<worker_id>`) to the worker table's buffer;
/// returns the rows it would write.
pub fn receive_heartbeats(payloads: &[&[u8]]) -> usize {
    let mut workers = crate::heartbeats::Workers::default();
    for (at, payload) in payloads.iter().enumerate() {
        workers.receive("trellis.workers.heartbeat.fuzz", payload, at as u64);
    }
    workers.dirty().len()
}
