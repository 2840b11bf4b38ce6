//! What goes into a turn and what comes out of it: inputs, requests and answers, the log writes
//! and the effects, in the order the executor carries them out.

use bytes::Bytes;
use trellis_core::ids::{ExecutionId, QuestionId, TaskInstanceId};
use trellis_grpc::access::{Principal, Scope};
use trellis_proto::v1;
use trellis_telemetry::propagation::Context;

use std::sync::Arc;

use trellis_core::machine::{PauseMode, PauseScope};

use super::pauses::FleetPauses;
use super::{CheckpointJob, Error, Recovered, ReplyTo, Retired, Token};

/// What a turn takes.
#[derive(Debug)]
pub enum Input {
    /// A caller's request; its answer names `reply`.
    Request { reply: ReplyTo, request: Request },
    /// Worker result messages consumed from `trellis.results.<shard>`.
    Results(Vec<Delivery>),
    /// A worker heartbeat (an encoded `WorkerHeartbeat`).
    Heartbeat(Bytes),
    /// The clock moved: timers (retries, deadlines, expiring questions) are looked at again.
    Tick,
    /// This coordinator now holds the lease of a shard.
    LeaseAcquired(u32),
    /// The lease of a shard is gone (taken over, or not renewed in time).
    LeaseLost(u32),
    /// This coordinator hands a shard over to another (it holds more than its share): the
    /// shard's executions are checkpointed and dropped, and its results no longer consumed;
    /// the lease is released once the effects are carried out. Given in a turn of its own, after
    /// a turn whose appends are all stored, so every checkpoint holds stored events only.
    LeaseReleased(u32),
    /// A shard's unfinished executions, rebuilt after its lease was acquired.
    ShardRecovered {
        shard: u32,
        recovered: Vec<Recovered>,
        /// Indexed executions whose log is empty.
        missing: Vec<ExecutionId>,
        /// Indexed executions whose log does not replay.
        broken: Vec<Broken>,
    },
    /// The pauses of queues, namespaces and the fleet, as the bucket `trellis_pauses` holds them
    /// now (all of them, each time one changes).
    Pauses(Arc<FleetPauses>),
    /// The indexed executions of a shard ([`Writes::scan`]).
    Indexed { shard: u32, ids: Vec<ExecutionId> },
    /// Executions loaded on demand (not in memory, or reloaded after a refused append).
    Loaded {
        recovered: Vec<Recovered>,
        missing: Vec<ExecutionId>,
        broken: Vec<Broken>,
    },
    /// The fences bucket holds `epoch` for the execution ([`Effects::fences`]).
    Fenced { id: ExecutionId, epoch: u64 },
    /// An assignment offered ([`Assign::offer`]) that no worker took went to the tasks stream,
    /// whose redelivery now brings it back if its worker dies: the turn stops watching it.
    OfferRefused {
        id: ExecutionId,
        instance: TaskInstanceId,
        attempt: u32,
    },
    /// The index holds the entries of these reserved ids ([`Effects::reserve`]): starts may
    /// take them.
    Reserved(Vec<ExecutionId>),
    /// The checkpoint-store answered a checkpoint.
    CheckpointDone {
        id: ExecutionId,
        full: bool,
        sequence: u64,
        result: Result<v1::CheckpointMetadata, String>,
    },
}

/// An execution whose log does not replay: it needs attention. It is held (nothing dispatched,
/// its results kept unacknowledged) and every request about it is answered with where its log
/// broke, until a request finds the log repaired or the shard moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broken {
    pub id: ExecutionId,
    /// The log sequence that could not be applied.
    pub sequence: u64,
    /// The namespace its `ExecutionStarted` names, when that much was read.
    pub namespace: Option<String>,
    /// What is wrong, naming the execution and the sequence.
    pub reason: String,
}

/// What reading one execution back from its checkpoint and log found.
#[derive(Debug)]
pub enum Recovery {
    /// Its log is empty: it never started.
    Empty,
    /// Boxed: far larger than the other cases.
    Recovered(Box<Recovered>),
    /// Its log does not replay: the execution needs attention.
    Broken(Broken),
}

/// Executions read back, sorted by what was found: the parts of an [`Input::ShardRecovered`] or
/// an [`Input::Loaded`].
#[derive(Debug, Default)]
pub struct Recoveries {
    recovered: Vec<Recovered>,
    missing: Vec<ExecutionId>,
    broken: Vec<Broken>,
}

impl Recoveries {
    /// Adds what reading `id` back found.
    pub fn add(&mut self, id: ExecutionId, found: Recovery) {
        match found {
            Recovery::Empty => self.missing.push(id),
            Recovery::Recovered(execution) => self.recovered.push(*execution),
            Recovery::Broken(broken) => self.broken.push(broken),
        }
    }

    /// How many were rebuilt.
    pub fn n_recovered(&self) -> usize {
        self.recovered.len()
    }

    /// The input of a shard's recovery.
    pub fn shard_recovered(self, shard: u32) -> Input {
        Input::ShardRecovered {
            shard,
            recovered: self.recovered,
            missing: self.missing,
            broken: self.broken,
        }
    }

    /// The input of loads on demand.
    pub fn loaded(self) -> Input {
        Input::Loaded {
            recovered: self.recovered,
            missing: self.missing,
            broken: self.broken,
        }
    }
}

/// One consumed result message.
#[derive(Debug)]
pub struct Delivery {
    pub token: Token,
    /// The encoded `TaskResult`.
    pub payload: Bytes,
    /// The span the result is applied in (`Span::none()` when traces are not exported).
    pub span: tracing::Span,
}

/// A caller's request.
#[derive(Debug)]
pub enum Request {
    Start {
        /// The plan, compiled by [`super::prepare`] before it reached the turn; boxed: it is far
        /// larger than the other requests.
        plan: Box<super::Prepared>,
        options: v1::ExecutionOptions,
        /// Who starts it: decides the namespace and its quota.
        principal: Principal,
        /// The W3C `traceparent` of the call, recorded for the execution's later spans.
        traceparent: String,
        /// Follow the execution from its first event: the answer is [`Answer::Following`].
        follow: Option<Follow>,
    },
    /// A request about one execution, which the caller's scope must allow: an execution of
    /// another namespace is answered NOT_FOUND, as if it did not exist.
    On {
        id: ExecutionId,
        scope: Scope,
        action: Action,
    },
    List {
        scope: Scope,
    },
    Workers {
        /// Only workers of this queue (empty: all).
        queue: String,
        include_terminated: bool,
    },
}

/// How a start is followed (`RunExecution`).
#[derive(Clone, Copy, Debug)]
pub struct Follow {
    /// Progress alone, as [`Action::Observe`]'s.
    pub progress_only: bool,
}

/// What to do with one execution.
#[derive(Debug)]
pub enum Action {
    Pause {
        reason: String,
        scope: PauseScope,
        mode: PauseMode,
    },
    Resume(PauseScope),
    Cancel(String),
    Retry,
    Checkpoint,
    Answer {
        question: QuestionId,
        answer: String,
    },
    Get,
    Graph,
    /// The log from sequence `from` on, then what follows live; with `progress_only`, no
    /// events: the progress now, then the snapshots that follow.
    Observe {
        from: u64,
        progress_only: bool,
    },
}

impl Request {
    /// The execution the request is about, if one.
    pub(super) fn execution(&self) -> Option<ExecutionId> {
        match self {
            Self::On { id, .. } => Some(*id),
            Self::Start { .. } | Self::List { .. } | Self::Workers { .. } => None,
        }
    }
}

/// The answer to a request.
#[derive(Debug)]
pub enum Answer {
    /// The execution started (`created`), or the one started before under the same
    /// idempotency key.
    Started {
        id: ExecutionId,
        created: bool,
    },
    /// A start of a large plan is admitted and given its id and start time; the caller builds
    /// its starting state off the loop ([`super::Prepared::build`]) and sends the start again
    /// with it. Asked of the turn once per start: the second pass starts it (or refuses it).
    Build {
        id: ExecutionId,
        at_ms: u64,
        plan: Box<super::Prepared>,
    },
    /// A start asked to be followed: what [`Answer::Started`] says, and an observation of the
    /// execution from its first event, made once the start is stored, in the same step that
    /// hands the start's events to observers: the observer subscribed with this answer misses
    /// nothing and is sent nothing twice.
    Following {
        id: ExecutionId,
        created: bool,
        observation: Observation,
    },
    /// The execution's state after a pause, resume or cancel (a `v1::ExecutionState`).
    State(i32),
    /// The run a retry started.
    Run(u32),
    Checkpoint(v1::CheckpointMetadata),
    /// The log sequence the answer was recorded at and the instance continuing the task.
    Answered {
        sequence: u64,
        continuation: Option<TaskInstanceId>,
    },
    Execution(Box<v1::Execution>),
    Graph(v1::ExecutionGraph),
    Observation(Observation),
    Executions(Vec<v1::Execution>),
    /// The workers, and this coordinator's circuit breakers.
    Workers(Vec<v1::WorkerInfo>, Vec<v1::CircuitBreaker>),
}

/// The history an observer starts from; what follows comes from the [`Effects::observed`] of
/// later turns, which the executor hands to the observer from this answer on.
#[derive(Debug)]
pub struct Observation {
    pub execution: ExecutionId,
    /// Events before the ones held in memory (an execution restored from a checkpoint keeps only
    /// the log after it): `(from, until)` sequences, inclusive, to read from the log first.
    pub backfill: Option<(u64, u64)>,
    pub history: History,
    /// The execution is over and every event is in `history`: nothing will follow.
    pub terminal: bool,
    /// With `terminal`: the execution's final progress, which the stream sends with the history's
    /// last event, as a live stream sends it with the last batch; the caller learns how the
    /// execution ended without asking again. With `progress_only`: the progress now, whatever
    /// the state, unless the turn changed the execution and has yet to store it.
    pub progress: Option<v1::Progress>,
    /// Progress alone: `history` and `backfill` are empty, and the stream sends `progress`,
    /// then the live snapshots without their events.
    pub progress_only: bool,
}

/// The events an observer starts from, as the execution's log holds them in memory: encoded
/// `EventBatch`es, shared, not copied. Whoever reads them decodes them (the observer's stream,
/// batch by batch as it sends), so observing an execution of many events costs the turn a
/// reference per batch, not their decoding: a large history does not hold every other
/// execution's turn up.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// The first sequence wanted: the first batch may begin before it.
    from: u64,
    batches: Vec<Bytes>,
}

impl History {
    /// The events from sequence `from` on of `batches`, encoded `EventBatch`es in log order.
    pub fn new(from: u64, batches: Vec<Bytes>) -> History {
        History { from, batches }
    }

    /// The batches left to decode, each decoded on its own with [`History::decode`].
    pub fn into_batches(self) -> (u64, std::vec::IntoIter<Bytes>) {
        (self.from, self.batches.into_iter())
    }

    /// The events of one batch at or after `from`, in order.
    pub fn decode(from: u64, batch: Bytes) -> Result<Vec<v1::Event>, prost::DecodeError> {
        use prost::Message as _;
        let batch = v1::EventBatch::decode(batch)?;
        Ok(batch
            .events
            .into_iter()
            .filter(|event| event.sequence >= from)
            .collect())
    }

    /// Every event, decoded at once (what a test looks at; the stream decodes batch by batch).
    #[cfg(test)]
    pub fn events(self) -> Result<Vec<v1::Event>, prost::DecodeError> {
        let (from, batches) = self.into_batches();
        let mut events = Vec::new();
        for batch in batches {
            events.extend(History::decode(from, batch)?);
        }
        Ok(events)
    }
}

/// What a turn asks for before any side effect: the log writes, and what needs nothing durable.
#[derive(Debug, Default)]
pub struct Writes {
    /// Answers that wait for nothing (reads and refusals); an observer's subscription starts here,
    /// so it sees this turn's events through [`Effects::observed`].
    pub replies: Vec<(ReplyTo, Result<Answer, Error>)>,
    /// Shards whose unfinished executions must be recovered ([`Input::ShardRecovered`]).
    pub recover: Vec<u32>,
    /// Shards whose index must be listed again ([`Input::Indexed`]): an execution a former
    /// owner started after the shard was recovered is found this way.
    pub scan: Vec<u32>,
    /// Shards whose results must no longer be consumed.
    pub stop_consuming: Vec<u32>,
    /// Executions dropped from memory (their shard was lost): their observers end.
    pub forget: Vec<ExecutionId>,
    /// The log appends, one per execution with new events.
    pub appends: Vec<Append>,
}

/// New events of one execution, for its log.
#[derive(Debug)]
pub struct Append {
    pub id: ExecutionId,
    /// The index key to write before the first message (a new execution or run), so a
    /// coordinator taking the shard over finds every execution that has a log. `None` for a
    /// start that took a reserved id: its entry is stored already.
    pub index_put: Option<String>,
    /// The stream sequence of the last message on the execution's subject: JetStream refuses
    /// the first message unless it follows it (`Nats-Expected-Last-Subject-Sequence`).
    pub expected_stream_seq: u64,
    /// Encoded `EventBatch`es with the sequence of each one's first event, in order.
    pub messages: Vec<(u64, Bytes)>,
    /// The execution's trace, parent of the append's span.
    pub trace: Context,
}

/// What became of an [`Append`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Appended {
    /// Every message is stored; the last one at this stream sequence.
    Stored { stream_seq: u64 },
    /// Another writer extended the log: this coordinator must not.
    Fenced { why: String },
    /// The coordinator is stopping: nothing more happens for the execution.
    Stopped,
}

/// What may happen once the turn's appends are stored, in the order the executor performs it:
/// the side effects, then `acks` and `replies`, then the background work.
#[derive(Debug, Default)]
pub struct Effects {
    /// Task assignments for the work queues, one message per inner list: an assignment alone,
    /// or a batch of one queue's lane (each de-duplicated by its `msg_id` within the batch's
    /// message, which has an id of its own; see `batching`).
    pub assignments: Vec<Vec<Assign>>,
    /// Stop messages for cancelled task attempts (core NATS).
    pub cancels: Vec<Publish>,
    /// Progress snapshots (core NATS).
    pub progress: Vec<Publish>,
    /// Circuit breaker transitions (core NATS, `trellis.breakers.<queue>`).
    pub breakers: Vec<Publish>,
    /// New events per execution, for its observers.
    pub observed: Vec<Observed>,
    /// Index keys of executions that finished (their last event is stored), of reservations
    /// given up, and of reservations a crashed coordinator left behind.
    pub index_deletes: Vec<String>,
    /// Executions dropped from memory (their append was refused): their observers end.
    pub forget: Vec<ExecutionId>,
    /// Result messages to acknowledge (applied, or set aside for good), or to hand back for
    /// later (their execution is being loaded, or its append was refused).
    pub acks: Vec<(Token, Ack)>,
    /// Answers to writes: the caller learns of a change once it is stored.
    pub replies: Vec<(ReplyTo, Result<Answer, Error>)>,
    /// Checkpoints to hand to the checkpoint-store ([`Input::CheckpointDone`] answers each).
    pub checkpoints: Vec<CheckpointJob>,
    /// Checkpoints of executions of shards handed over this turn: stored before the lease is
    /// released, and not answered (the executions are no longer here).
    pub handover: Vec<CheckpointJob>,
    /// Executions to load from their log ([`Input::Loaded`]).
    pub load: Vec<ExecutionId>,
    /// Shards whose results may now be consumed (their executions are adopted).
    pub consume: Vec<u32>,
    /// Fencing epochs to write to the bucket `trellis_fences` (key: the execution id), each
    /// answered by [`Input::Fenced`] once stored: executions just taken over with attempts
    /// running.
    pub fences: Vec<(ExecutionId, u64)>,
    /// Index entries of ids reserved for later starts (`turn::reserve`), with the ids: written
    /// in the background, answered by [`Input::Reserved`] once all are stored. None belongs to
    /// an execution yet, so they wait for nothing and nothing waits for them.
    pub reserve: Vec<(String, ExecutionId)>,
    /// The state of large executions that left memory since the last turn, to drop off the
    /// loop (it is nothing but memory; dropping it anywhere is all there is to do).
    pub retired: Retired,
}

/// A turn's tasks of an execution go to their queue's fast lane (`trellis.tasks.~.<queue>`,
/// which workers serve before the queue) while the execution has at most this many tasks in
/// flight, those tasks among them: a small execution's tasks skip the queue a large one's
/// dispatch window fills. A wide turn of a large execution sends none there, so its tasks share
/// one message per queue (a narrow turn of it, a few tasks refilling a nearly empty window, may).
pub const FAST_LANE_SHARE: u32 = 4;

/// One task assignment to publish.
#[derive(Debug)]
pub struct Assign {
    /// Its queue: published on `trellis.tasks.<queue>`, or on the fast lane.
    pub queue: String,
    /// Whether its execution has at most [`FAST_LANE_SHARE`] tasks in flight with it, so it goes
    /// to the fast lane where the queue's workers have one.
    pub fast: bool,
    /// It avoids a worker (the one its last attempt ran on): sent in a message of its own, so
    /// that worker hands back only it.
    pub alone: bool,
    /// Offered to an idle worker of its queue before the stream (`trellis.offer.<queue>`),
    /// alone in its message. The turn watches the attempt as it watches an inherited one: kept
    /// while a heartbeat names it, lost after [`LAPSE_MS`](super::takeover) of silence; an
    /// offer not taken goes to the stream, and [`Input::OfferRefused`] ends the watch.
    pub offer: bool,
    /// `Nats-Msg-Id`: `<instance>:<attempt>`.
    pub msg_id: String,
    /// The encoded `TaskAssignment`.
    pub payload: Bytes,
    /// The execution's trace, parent of the dispatch span.
    pub trace: Context,
    pub execution: ExecutionId,
    pub instance: TaskInstanceId,
    pub attempt: u32,
}

/// A core NATS message.
#[derive(Debug)]
pub struct Publish {
    pub subject: String,
    pub payload: Bytes,
}

/// The events one turn appended to an execution's log, for its observers.
#[derive(Debug)]
pub struct Observed {
    pub id: ExecutionId,
    pub events: Vec<v1::Event>,
    /// The progress snapshot published with them, if one was.
    pub progress: Option<v1::Progress>,
    /// The execution is over: nothing follows.
    pub terminal: bool,
}

/// What to do with a consumed result message. Ordered by how long the message waits: a message
/// carrying several results is treated as the latest of them asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ack {
    /// Done with: its effects are stored (or it was set aside).
    Ack,
    /// Not now: deliver it again after a short delay.
    Later,
    /// Not until its execution's log is repaired: deliver it again after a long delay.
    Hold,
}
