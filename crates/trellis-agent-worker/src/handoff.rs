//! Handing final results to the coordinator that holds their shard, directly.
//!
//! The results stream costs a result three steps on its way: JetStream stores it (a disk write,
//! synced when the server syncs every write), delivers it to the shard's consumer, and takes
//! the coordinator's ack. A hand-off is one core NATS request on `trellis.handoff.<shard>`,
//! heard by the coordinator holding the shard; it replies `done` once the results' events are
//! in the execution's log. Only then does the worker acknowledge the task messages, as it does
//! once the stream stored them.
//!
//! Nothing depends on the hand-off arriving: any other reply, no reply within
//! [`HANDOFF_WAIT`], or no coordinator listening sends the same message to the stream, under the
//! same `Nats-Msg-Id`s, and a result both handed off and published is a duplicate the
//! coordinator ignores. A shard whose hand-offs went unanswered or found nobody listening is
//! skipped for [`HANDOFF_PAUSE`], so a coordinator that is gone costs one wait, not one per
//! result.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::{HeaderMap, RequestErrorKind, Subject};
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use trellis_proto::subjects;
use trellis_telemetry::metrics::Labels1;

use crate::sdk::lock;

/// How long a hand-off waits for the coordinator's reply before its results go to the stream:
/// well over a turn of a busy coordinator (tens of milliseconds), short enough that a stopped
/// one delays its results by little.
pub(crate) const HANDOFF_WAIT: Duration = Duration::from_secs(2);
/// How long a shard whose hand-off went unanswered, or found no coordinator, gets none.
pub(crate) const HANDOFF_PAUSE: Duration = Duration::from_secs(5);

/// What became of a hand-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handed {
    /// The coordinator stored the results' events (or set them aside): done.
    Done,
    /// Not taken: publish them to the results stream.
    Publish,
}

/// The hand-off subjects of the shards, and which of them are skipped for now.
#[derive(Debug)]
pub(crate) struct Handoffs {
    nats: async_nats::Client,
    /// `trellis.handoff.<shard>` for every configured shard, built once (an assignment may name
    /// a shard beyond them: its subject is built when needed).
    subjects: Vec<Subject>,
    /// The shards skipped until a time: their last hand-off went unanswered or found nobody.
    paused: Mutex<HashMap<u32, Instant>>,
    /// Hand-offs by answer (`trellis_worker_result_handoffs`).
    answers: Family<Labels1, Counter>,
}

impl Handoffs {
    pub(crate) fn new(
        nats: async_nats::Client,
        n_shards: u32,
        answers: Family<Labels1, Counter>,
    ) -> Handoffs {
        Handoffs {
            answers,
            nats,
            subjects: (0..n_shards.max(1))
                .map(|shard| Subject::from(subjects::handoff(shard)))
                .collect(),
            paused: Mutex::new(HashMap::new()),
        }
    }

    /// True when results for `shard` may be handed off now: it is not skipped.
    pub(crate) fn open(&self, shard: u32) -> bool {
        let mut paused = lock(&self.paused);
        match paused.get(&shard) {
            Some(until) if Instant::now() < *until => false,
            Some(_) => {
                paused.remove(&shard);
                true
            }
            None => true,
        }
    }

    /// Hands one message of results for `shard` to its coordinator and waits for the reply.
    pub(crate) async fn hand_off(&self, shard: u32, headers: HeaderMap, payload: Bytes) -> Handed {
        let subject = match self.subjects.get(shard as usize) {
            Some(subject) => subject.clone(),
            None => Subject::from(subjects::handoff(shard)),
        };
        let request = async_nats::Request::new()
            .headers(headers)
            .payload(payload)
            .timeout(Some(HANDOFF_WAIT));
        let (handed, answer) = match self.nats.send_request(subject, request).await {
            Ok(reply) if reply.payload.as_ref() == subjects::HANDOFF_DONE => (Handed::Done, "done"),
            Ok(_) => (Handed::Publish, "publish"),
            Err(error) => {
                let (answer, skip_shard) = match error.kind() {
                    RequestErrorKind::TimedOut => ("unanswered", true),
                    RequestErrorKind::NoResponders => ("no_coordinator", true),
                    _ => ("failed", false),
                };
                if skip_shard {
                    lock(&self.paused).insert(shard, Instant::now() + HANDOFF_PAUSE);
                }
                tracing::debug!(shard, %error, "result hand-off not taken; publishing to the stream");
                (Handed::Publish, answer)
            }
        };
        self.answers
            .get_or_create(&[("answer", answer.to_owned())])
            .inc();
        handed
    }
}
