//! `WorkerHeartbeat` (`trellis.workers.heartbeat.<worker_id>`), as the coordinator and the
//! checkpoint-store take it. No input panics; a heartbeat is taken only when it names its worker
//! and its figures fit the worker table, and two copies of one heartbeat make one row.
//!
//! Run: `cd fuzz && cargo fuzz run nats_worker_heartbeat corpus/nats_worker_heartbeat seeds/nats_worker_heartbeat`

#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis_wire::worker;

fuzz_target!(|data: &[u8]| {
    let taken = match worker::decode_heartbeat(data) {
        Ok(heartbeat) => {
            assert!(!heartbeat.worker_id.is_empty());
            assert!(heartbeat.cpu_percent.is_finite() && heartbeat.cpu_percent >= 0.0);
            true
        }
        Err(_) => false,
    };
    let rows = trellis_checkpoint_store::fuzzing::receive_heartbeats(&[data, data]);
    assert_eq!(
        rows,
        usize::from(taken),
        "two copies of a heartbeat make {rows} rows"
    );
});
