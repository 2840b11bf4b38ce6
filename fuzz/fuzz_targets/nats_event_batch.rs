//! `EventBatch` (`trellis.events.<execution_id>`), as its three readers take it:
//! - the coordinator recovering an execution decodes the batch and replays it onto a state
//!   started from its `execution_started` (or onto the live execution);
//! - the checkpoint-store's read model ingests it (the message twice, as a redelivery would
//!   bring it, and then the two halves of the input as two messages);
//! - the monitor and `Observe` read only the envelope, which the decoder checks.
//!
//! No input panics, hangs or blows up memory; a decoded batch re-encodes to a batch that decodes
//! to the same entries.
//!
//! Run: `cd fuzz && cargo fuzz run nats_event_batch corpus/nats_event_batch seeds/nats_event_batch`

#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use trellis_core::machine::Execution;
use trellis_fuzz::Live;
use trellis_wire::log::{self, LogEntry};

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = log::decode_event_batch(data) {
        let events: Vec<_> = batch
            .entries
            .iter()
            .filter_map(|entry| match entry {
                LogEntry::Event(event) => Some(event.clone()),
                LogEntry::Started(_) => None,
            })
            .collect();
        if events.len() == batch.entries.len() {
            let again =
                log::event_batch_to_proto(batch.execution_id, batch.first_sequence, &events);
            let again = log::decode_event_batch(&prost::Message::encode_to_vec(&again))
                .expect("a decoded batch re-encodes to one that decodes");
            assert_eq!(again, batch, "a batch changed through a round trip");
        }
        replay(&batch.entries);
    }
    trellis_checkpoint_store::fuzzing::ingest_event_log(&[data, data]);
    let (head, tail) = data.split_at(data.len() / 2);
    trellis_checkpoint_store::fuzzing::ingest_event_log(&[head, tail]);
});

/// Replays the entries the way recovery does: a batch that starts the execution compiles its
/// plan and applies the rest to a fresh state; any other batch goes to the live execution.
fn replay(entries: &[LogEntry]) {
    let mut entries = entries.iter();
    let mut exec = match entries.clone().next() {
        Some(LogEntry::Started(started)) => {
            entries.next();
            let Ok(plan) = started.compile() else {
                return;
            };
            Execution::start(
                trellis_fuzz::execution_id(),
                Arc::new(plan),
                started.run_number,
                started.started_at_ms,
            )
        }
        _ => Live::new().exec,
    };
    for entry in entries {
        match entry {
            LogEntry::Event(event) => {
                let _ = exec.apply(event);
            }
            // Recovery refuses a second start; nothing to apply.
            LogEntry::Started(_) => return,
        }
    }
    let _ = exec.decide(u64::MAX / 2);
    let _ = exec.progress(u64::MAX / 2);
    let _ = exec.records();
}
