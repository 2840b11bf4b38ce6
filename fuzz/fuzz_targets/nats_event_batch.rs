//! `EventBatch` (`trellis.events.<execution_id>`), as its three readers take it:
//! - the coordinator recovering an execution replays it through the one replayer, starting from
//!   its `execution_started` (its recorded plan decoded) or going on from the live execution;
//! - the checkpoint-store's read model ingests it (the message twice, as a redelivery would
//!   bring it, and then the two halves of the input as two messages);
//! - the monitor's hub follows it (the message alone, twice, then its two halves) and serves
//!   what its streams and pages read; `Observe` reads only the envelope, which the decoder
//!   checks.
//!
//! No input panics, hangs or blows up memory; a decoded batch re-encodes to a batch that decodes
//! to the same entries.
//!
//! Run: `cd fuzz && cargo fuzz run nats_event_batch corpus/nats_event_batch seeds/nats_event_batch`

#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis_fuzz::Live;
use trellis_wire::log::{self, LogEntry, Started};
use trellis_wire::replay::Replayer;

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
    }
    replay(data);
    trellis_checkpoint_store::fuzzing::ingest_event_log(&[data, data]);
    let (head, tail) = data.split_at(data.len() / 2);
    trellis_checkpoint_store::fuzzing::ingest_event_log(&[head, tail]);
    let id = trellis_fuzz::execution_id();
    trellis_monitor::fuzzing::follow_event_log(id, &[data, data]);
    trellis_monitor::fuzzing::follow_event_log(id, &[head, tail]);
});

/// Replays the message the way recovery does: a message that starts the execution decodes its
/// plan and applies the rest to a fresh state; any other goes on from the live execution.
fn replay(data: &[u8]) {
    let replayer = match Replayer::from_first_message(trellis_fuzz::execution_id(), data) {
        Ok((replayer, _)) => replayer,
        Err(_) => {
            let live = Live::new();
            let sequence = 1 + live.log.len() as u64;
            let mut replayer = Replayer::resume(Started::default(), live.exec, sequence);
            let _ = replayer.apply_message(data);
            replayer
        }
    };
    let (_, exec, _) = replayer.into_parts();
    let _ = exec.decide(u64::MAX / 2);
    let _ = exec.progress(u64::MAX / 2);
    let _ = exec.records();
}
