//! A simulated NATS: the parts of JetStream the coordinator relies on, with their guarantees and
//! nothing more.
//!
//! - The event log: one stream, a subject per execution, `Nats-Msg-Id` de-duplication, and
//!   `Nats-Expected-Last-Subject-Sequence` (an append that does not follow the subject's last
//!   message is refused: the fencing that keeps one writer per log).
//! - The task work queue: `Nats-Msg-Id` de-duplication within a window, one delivery at a time
//!   with an ack deadline a running worker extends, redelivery after it.
//! - The results streams, one per shard, each consumed by at most one coordinator; a consumer
//!   created afresh gets every unacknowledged message again at once.
//! - Result hand-offs (core NATS requests on `trellis.handoff.<shard>`): each taken by at most
//!   one coordinator hearing the shard, answered or not; a worker whose hand-off is not answered
//!   `done` publishes the same results to the stream.
//! - The KV buckets: shard leases with a TTL and compare-and-set, and the execution index.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use trellis_core::ids::ExecutionId;

/// One message of the event stream.
#[derive(Clone, Debug)]
pub struct Record {
    pub stream_seq: u64,
    pub id: ExecutionId,
    pub payload: Bytes,
    /// The coordinator that appended it.
    pub writer: usize,
}

/// Why an append was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum AppendError {
    WrongLastSequence { expected: u64, last: u64 },
}

/// The event stream `TRELLIS_EVENTS`.
#[derive(Debug, Default)]
pub struct Events {
    pub records: Vec<Record>,
    by_subject: BTreeMap<ExecutionId, Vec<usize>>,
    msg_ids: BTreeMap<String, u64>,
    /// A deliberately broken stream that fences nothing: it ignores the expected sequence and
    /// de-duplicates nothing (to show the checks catch two writers).
    pub no_fencing: bool,
}

impl Events {
    /// Appends a message; returns its stream sequence and whether it was a duplicate.
    pub fn append(
        &mut self,
        writer: usize,
        id: ExecutionId,
        msg_id: String,
        expected_last: u64,
        payload: Bytes,
    ) -> Result<(u64, bool), AppendError> {
        if let Some(seq) = self.msg_ids.get(&msg_id)
            && !self.no_fencing
        {
            return Ok((*seq, true));
        }
        let last = self.last_seq(id).unwrap_or(0);
        if last != expected_last && !self.no_fencing {
            return Err(AppendError::WrongLastSequence {
                expected: expected_last,
                last,
            });
        }
        let stream_seq = self.records.len() as u64 + 1;
        self.records.push(Record {
            stream_seq,
            id,
            payload,
            writer,
        });
        self.by_subject
            .entry(id)
            .or_default()
            .push(stream_seq as usize - 1);
        self.msg_ids.insert(msg_id, stream_seq);
        Ok((stream_seq, false))
    }

    /// Returns the stream sequence of the last message of an execution's log.
    pub fn last_seq(&self, id: ExecutionId) -> Option<u64> {
        self.by_subject
            .get(&id)
            .and_then(|all| all.last())
            .map(|idx| self.records[*idx].stream_seq)
    }

    /// Returns the stored message at a stream sequence.
    pub fn get(&self, stream_seq: u64) -> Option<&Record> {
        self.records.get(stream_seq.checked_sub(1)? as usize)
    }

    /// Returns an execution's log.
    pub fn log(&self, id: ExecutionId) -> Vec<&Record> {
        self.by_subject
            .get(&id)
            .map(|all| all.iter().map(|idx| &self.records[*idx]).collect())
            .unwrap_or_default()
    }

    /// Returns every execution with a log.
    pub fn executions(&self) -> impl Iterator<Item = ExecutionId> + '_ {
        self.by_subject.keys().copied()
    }
}

/// Where a queued message is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Waiting, from this time on.
    Ready { at: u64 },
    /// Delivered to `holder`, redelivered after `deadline`.
    Out { holder: usize, deadline: u64 },
}

/// A queued message.
#[derive(Clone, Debug)]
pub struct Queued {
    pub payload: Bytes,
    /// A `TaskResultBatch` or a `TaskAssignmentBatch` (the real message's batch header).
    pub batch: bool,
    pub delivery: Delivery,
    pub deliveries: u32,
}

/// A work queue or a results stream: messages by sequence, each held by one taker at a time.
#[derive(Debug, Default)]
pub struct Queue {
    pub messages: BTreeMap<u64, Queued>,
    next: u64,
    /// Message ids seen, with when: a publish of a known id within the window is dropped.
    msg_ids: BTreeMap<String, u64>,
}

impl Queue {
    /// Publishes a message, unless its id was seen within `window` ms; returns its sequence.
    pub fn publish(
        &mut self,
        msg_id: Option<String>,
        payload: Bytes,
        now: u64,
        window: u64,
    ) -> Option<u64> {
        if let Some(msg_id) = msg_id {
            if let Some(at) = self.msg_ids.get(&msg_id)
                && now < at + window
            {
                return None;
            }
            self.msg_ids.insert(msg_id, now);
        }
        Some(self.push(payload, false, now))
    }

    /// Publishes a batch of results or of assignments (no message id: each batch is new);
    /// returns its sequence.
    pub fn publish_batch(&mut self, payload: Bytes, now: u64) -> u64 {
        self.push(payload, true, now)
    }

    /// Publishes a worker's message of results: a batch, or a result alone (no message id).
    pub fn publish_results(&mut self, payload: Bytes, batch: bool, now: u64) -> u64 {
        self.push(payload, batch, now)
    }

    fn push(&mut self, payload: Bytes, batch: bool, now: u64) -> u64 {
        self.next += 1;
        self.messages.insert(
            self.next,
            Queued {
                payload,
                batch,
                delivery: Delivery::Ready { at: now },
                deliveries: 0,
            },
        );
        self.next
    }

    /// Returns the sequences of messages a taker may get now (waiting, or past their deadline).
    pub fn available(&self, now: u64) -> Vec<u64> {
        self.messages
            .iter()
            .filter(|(_, m)| match m.delivery {
                Delivery::Ready { at } => at <= now,
                Delivery::Out { deadline, .. } => deadline <= now,
            })
            .map(|(seq, _)| *seq)
            .collect()
    }

    /// Hands a message to `holder` until `deadline`.
    pub fn take(&mut self, seq: u64, holder: usize, deadline: u64) -> Option<(Bytes, u32)> {
        let message = self.messages.get_mut(&seq)?;
        message.delivery = Delivery::Out { holder, deadline };
        message.deliveries += 1;
        Some((message.payload.clone(), message.deliveries))
    }

    /// True when `holder` holds the message now.
    pub fn holds(&self, seq: u64, holder: usize) -> bool {
        self.messages
            .get(&seq)
            .is_some_and(|m| matches!(m.delivery, Delivery::Out { holder: h, .. } if h == holder))
    }

    /// Removes a message its holder is done with; a stale holder's ack is ignored.
    pub fn ack(&mut self, seq: u64, holder: usize) -> bool {
        if self.holds(seq, holder) {
            self.messages.remove(&seq);
            true
        } else {
            false
        }
    }

    /// Extends the holder's deadline (`AckProgress`).
    pub fn extend(&mut self, seq: u64, holder: usize, deadline: u64) {
        if self.holds(seq, holder)
            && let Some(message) = self.messages.get_mut(&seq)
        {
            message.delivery = Delivery::Out { holder, deadline };
        }
    }

    /// Hands a message back for redelivery at `at` (a negative acknowledgement).
    pub fn nak(&mut self, seq: u64, holder: usize, at: u64) {
        if self.holds(seq, holder)
            && let Some(message) = self.messages.get_mut(&seq)
        {
            message.delivery = Delivery::Ready { at };
        }
    }

    /// Makes every delivered message available again at once (a consumer created afresh).
    pub fn redeliver_all(&mut self, now: u64) {
        for message in self.messages.values_mut() {
            if matches!(message.delivery, Delivery::Out { .. }) {
                message.delivery = Delivery::Ready { at: now };
            }
        }
    }
}

/// A shard lease in the KV bucket `trellis_leases`.
#[derive(Clone, Debug)]
pub struct Lease {
    pub owner: usize,
    pub revision: u64,
    pub expires_at: u64,
}

/// The lease bucket: a key per shard, gone `ttl` after its last write.
#[derive(Debug, Default)]
pub struct Leases {
    pub entries: BTreeMap<u32, Lease>,
    revision: u64,
}

impl Leases {
    fn live(&self, shard: u32, now: u64) -> Option<&Lease> {
        self.entries
            .get(&shard)
            .filter(|lease| lease.expires_at > now)
    }

    /// Returns the owner of a shard's live lease.
    pub fn owner(&self, shard: u32, now: u64) -> Option<usize> {
        self.live(shard, now).map(|lease| lease.owner)
    }

    /// Takes a free shard, or the caller's own lease back (a restart under the same id).
    pub fn acquire(&mut self, shard: u32, me: usize, now: u64, ttl: u64) -> Option<u64> {
        match self.live(shard, now) {
            Some(lease) if lease.owner != me => None,
            _ => {
                self.revision += 1;
                self.entries.insert(
                    shard,
                    Lease {
                        owner: me,
                        revision: self.revision,
                        expires_at: now + ttl,
                    },
                );
                Some(self.revision)
            }
        }
    }

    /// Renews a lease by compare-and-set on its revision.
    pub fn renew(&mut self, shard: u32, revision: u64, now: u64, ttl: u64) -> Option<u64> {
        let current = self.live(shard, now)?;
        if current.revision != revision {
            return None;
        }
        let owner = current.owner;
        self.revision += 1;
        self.entries.insert(
            shard,
            Lease {
                owner,
                revision: self.revision,
                expires_at: now + ttl,
            },
        );
        Some(self.revision)
    }

    /// Deletes a lease if it still has this revision (a graceful stop).
    pub fn release(&mut self, shard: u32, revision: u64) {
        if self
            .entries
            .get(&shard)
            .is_some_and(|l| l.revision == revision)
        {
            self.entries.remove(&shard);
        }
    }
}

/// A message of results a worker handed to the coordinator of its shard.
#[derive(Debug)]
pub struct Handoff {
    pub shard: usize,
    pub payload: Bytes,
    /// A `TaskResultBatch` (the batch header).
    pub batch: bool,
    pub state: Handed,
}

/// Where a hand-off stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handed {
    /// On its way: no coordinator took it yet.
    Sent,
    /// Taken by this coordinator, not answered.
    Taken(usize),
    /// Answered `done`: its results' events are stored.
    Done,
    /// Answered `publish`: the worker publishes it to the stream.
    Publish,
}

/// Everything NATS holds.
#[derive(Debug, Default)]
pub struct Nats {
    /// Result hand-offs by id, as long as the run lasts.
    pub handoffs: BTreeMap<u64, Handoff>,
    pub events: Events,
    pub tasks: Queue,
    /// `trellis.results.<shard>`, each with the coordinator consuming it.
    pub results: Vec<(Queue, Option<usize>)>,
    pub leases: Leases,
    /// The index bucket `trellis_executions`: `<shard>.<id>` while unfinished.
    pub index: BTreeSet<String>,
    /// The fences bucket `trellis_fences`: execution id to epoch (workers read it at once).
    pub fences: BTreeMap<String, u64>,
    /// When a coordinator acknowledged a result ending each attempt (instance id, attempt): from
    /// then on its event must be in the log, so the attempt is never found lost later.
    pub acked_results: BTreeMap<(String, u32), u64>,
}

impl Nats {
    pub fn new(shards: u32) -> Self {
        Self {
            results: (0..shards).map(|_| (Queue::default(), None)).collect(),
            ..Self::default()
        }
    }

    /// The index keys of executions with a log; the others are ids reserved for starts that have
    /// not come (`turn::reserve`).
    pub fn indexed_with_log(&self) -> impl Iterator<Item = &String> + '_ {
        self.index.iter().filter(|key| {
            key.split_once('.')
                .and_then(|(_, id)| id.parse::<ExecutionId>().ok())
                .is_none_or(|id| !self.events.log(id).is_empty())
        })
    }
}
