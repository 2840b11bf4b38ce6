//! The coordinator's decisions, as a pure turn: no I/O, no clock, no randomness of its own.
//!
//! A [`Coordinator`] owns the live executions of the shards this coordinator holds and makes every
//! decision the coordinator makes: admission (tenancy, quota, idempotency, compiling the plan
//! once), applying worker results, when a checkpoint is due and whether it is full or a delta, the
//! progress throttle, writes to the execution index, and what a refused append (fencing) means.
//! It takes [`Input`]s and returns effects for the executor (`crate::executor`) to carry out, in
//! two steps per turn, so the invariants are kept by construction:
//!
//! 1. [`Coordinator::turn`] applies a batch of inputs, lets every touched execution decide, and
//!    returns [`Writes`]: answers that need nothing durable (reads, refusals), shards and
//!    executions to recover, and the log [`Append`]s (each naming the stream sequence it must
//!    follow, with the index entry to write first when the execution is new).
//! 2. The executor performs the appends and hands back each one's [`Appended`] outcome;
//!    [`Coordinator::appended`] returns the [`Effects`] that may happen now that the log holds
//!    what caused them: task assignments, cancels, progress, observers, index deletes, then the
//!    acknowledgements of the results consumed and the answers to writes, and the checkpoints due.
//!    An execution whose append was refused (another coordinator wrote its log) has no side
//!    effects; its results are not acknowledged and it is loaded again.
//!
//! Time is the `now` each step is given, and ids come from a generator seeded at construction,
//! so the same inputs in the same order give the same effects: the deterministic simulation in
//! `tests/simulation` drives several coordinators this way.

mod admission;
mod batching;
mod breakers;
mod checkpoint;
mod consumed;
mod contract;
mod error;
mod flush;
mod live;
pub mod pauses;
mod requests;
mod reserve;
mod results;
mod retire;
mod shards;
mod takeover;
mod workers;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use trellis_core::ids::{ExecutionId, mix};
use trellis_grpc::access::{self, AccessPolicy};
use trellis_proto::subjects;

pub use admission::{BUILT_OFF_THE_LOOP, PlanCache, Prepared, is_large, prepare};
pub use breakers::BreakerConfig;
pub use checkpoint::{CheckpointJob, FULL_EVERY, KEEP_FULL};
pub use consumed::Consumed;
pub use contract::{
    Ack, Action, Answer, Append, Appended, Assign, Broken, Delivery, Effects, FAST_LANE_SHARE,
    Follow, History, Input, Observation, Observed, Publish, Recoveries, Recovery, Request, Writes,
};
pub use error::{Error, ErrorKind};
pub use reserve::{ORPHAN_AFTER_MS, RECHECK_UNBORN_MS, RESERVED_PER_SHARD, USE_WITHIN_MS};
pub use retire::Retired;
pub use shards::{LogMessage, Recovered, index_key};

use crate::metrics::Metrics;
use live::Live;

/// A hash map whose iteration order depends only on what was inserted, so a turn's effects come
/// out in the same order for the same inputs (std's default hasher is seeded per process). Its
/// hasher is rustc's Fx: a turn looks executions up by id for every result, request and sweep,
/// and SipHash over a 16-byte id cost more than the rest of the lookup. The ids are the
/// coordinator's own (made by it, or read from its log), so no caller chooses what collides.
type Map<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

/// Returns the shard a start must land on: the idempotency key's, so that every coordinator
/// sends a key to the one owner that remembers it; `None` without a key (any owned shard).
pub fn start_shard(namespace: &str, idempotency_key: &str, shards: u32) -> Option<u32> {
    (!idempotency_key.is_empty())
        .then(|| subjects::shard_of(&format!("{namespace}/{idempotency_key}"), shards.max(1)))
}

/// Names the caller waiting for an answer; the executor maps it back to its reply channel.
pub type ReplyTo = u64;
/// Names a consumed result message; the executor maps it back to the message to acknowledge.
pub type Token = u64;

/// How a coordinator decides.
#[derive(Clone, Debug)]
pub struct Config {
    /// This coordinator's id, recorded when it claims an execution.
    pub id: String,
    /// Shards executions are spread over (`trellis.results.<shard>`).
    pub shards: u32,
    /// A running execution whose state changed is checkpointed this often.
    pub checkpoint_every_ms: u64,
    /// A checkpoint-store is configured: checkpoints are taken.
    pub checkpoint_store: bool,
    /// Namespaces, quotas and limits; `None`: one namespace, no quota, default limits.
    pub access: Option<Arc<AccessPolicy>>,
    /// The largest message the NATS server takes (0: unknown); a plan whose first log message
    /// would be larger is refused at admission instead of failing to append forever.
    pub max_message_bytes: usize,
    /// The owned shards' index is listed again this often.
    pub index_scan_every_ms: u64,
    /// Entropy for the ids this coordinator makes (executions, checkpoints).
    pub seed: u64,
    /// A finished execution leaves memory this long after it was last touched (changed or
    /// asked about); reads of it then load it from its checkpoint and log again.
    pub keep_finished_ms: u64,
    /// When the circuit breakers of queues and task types open (off by default).
    pub breakers: BreakerConfig,
    /// Most tasks of one execution dispatched and not yet started (0: no limit). Tasks wait
    /// in the workers' queue in the order they were dispatched: without a window, an execution
    /// of 20,000 ready tasks puts all of them ahead of the next execution's first one. A task
    /// leaves the window when its start is recorded (from a heartbeat, within an interval of
    /// it, or with its result), so tasks that run for long still fill every slot of a fleet.
    pub dispatch_window: u32,
    /// A start of a plan of at least this many tasks has its starting state built off the loop
    /// (0: never), [`BUILT_OFF_THE_LOOP`] unless a test wants otherwise.
    pub build_off_the_loop: usize,
    /// Fast-lane assignments are offered to idle workers before the stream ([`Assign::offer`]).
    pub offers: bool,
}

/// The default [`Config::dispatch_window`]: about a 2-core machine's rate times one short task's
/// round trip (50,000 tasks/s × 2.5 ms), so short tasks keep the pipeline as busy as a larger
/// window would, and another execution's task waits behind milliseconds of work, not seconds.
/// Tasks that run for long leave it once started, so it does not bound a fleet's slots.
pub const DEFAULT_DISPATCH_WINDOW: u32 = 128;

/// The dispatch window for a NATS that flushes every write before acknowledging it: a turn's
/// append waits for a flush, and twice the window shares each flush among twice the tasks
/// (`--sync always`: 27,000 tasks/s against 17,000–23,000 at the default, same sitting).
pub const SYNCED_DISPATCH_WINDOW: u32 = 256;

/// How often finished executions are looked at for leaving memory.
const FORGET_EVERY_MS: u64 = 1_000;

/// A request that waits for an execution (or its shard) to be loaded.
#[derive(Debug)]
struct Waiting {
    reply: ReplyTo,
    request: Request,
}

/// Makes the ids of one coordinator: UUIDv7 from the turn's time and a counter mixed with the
/// coordinator's seed, so they are unique across coordinators and reproducible in a simulation.
#[derive(Debug)]
struct Ids {
    seed: u64,
    counter: u64,
    /// The last execution id made: each one rises above it, so ids made later sort later
    /// (reserved ids and fresh ones alike; see `reserve`).
    last_execution: Option<ExecutionId>,
}

impl Ids {
    fn next_entropy(&mut self, now: u64) -> u128 {
        self.counter += 1;
        mix(u128::from(self.seed), &[self.counter, now])
    }

    fn execution(&mut self, now: u64) -> ExecutionId {
        let id = ExecutionId::derived(now, self.next_entropy(now));
        let id = match self.last_execution {
            Some(last) if id <= last => last.successor(),
            _ => id,
        };
        self.last_execution = Some(id);
        id
    }

    fn checkpoint(&mut self, now: u64) -> String {
        ExecutionId::derived(now, self.next_entropy(now)).to_string()
    }
}

/// The live executions of this coordinator's shards, and every decision about them.
#[derive(Debug)]
pub struct Coordinator {
    config: Config,
    limits: access::Limits,
    metrics: Metrics,
    ids: Ids,
    /// Shards whose executions this coordinator holds and whose results it consumes.
    owned: BTreeSet<u32>,
    /// Shards being recovered after their lease was acquired.
    acquiring: BTreeSet<u32>,
    executions: Map<ExecutionId, Live>,
    /// Idempotency keys, per namespace: a key only finds executions of the caller's namespace.
    by_key: Map<(Arc<str>, String), ExecutionId>,
    /// Executions touched this turn, in the order they were first touched.
    dirty: Vec<ExecutionId>,
    /// When the clock alone is next to touch an execution (`Live::wake_ms`), by time: a tick
    /// touches the due ones only, not every execution in memory.
    timers: BTreeSet<(u64, ExecutionId)>,
    /// Executions being loaded from the log, with the requests waiting for them.
    loading: Map<ExecutionId, Vec<Waiting>>,
    /// Requests that arrived while the shard they need was being recovered.
    parked: Vec<Waiting>,
    workers: workers::Registry,
    /// Executions found to have no log, so results naming them are set aside without a look.
    missing: BTreeSet<ExecutionId>,
    /// Executions of owned shards whose log does not replay (`shards::hold_broken`).
    attention: Map<ExecutionId, Broken>,
    /// Executions being loaded because a result named them.
    loads_for_results: BTreeSet<ExecutionId>,
    /// Attempts a result named that the state did not know, looked up again in the log once:
    /// a second refusal sets the result aside.
    rechecked: BTreeSet<results::AttemptKey>,
    last_scan_ms: u64,
    last_forget_ms: u64,
    /// The time of the current turn.
    now: u64,
    /// What this turn has answered or consumed so far.
    pending: Pending,
    /// Executions whose append this turn was refused.
    refused: BTreeSet<ExecutionId>,
    /// The pauses of queues, namespaces and the fleet in force.
    pauses: Arc<pauses::FleetPauses>,
    /// Executions with attempts inherited from a former owner (`takeover`).
    inheriting: BTreeSet<ExecutionId>,
    /// The circuit breakers of queues and task types.
    breakers: breakers::Breakers,
    /// Ids whose index entry is written ahead of the starts that take them.
    reservations: reserve::Reservations,
    /// Indexed executions an index scan is loading: one without a log may be a reservation
    /// nobody will use (`reserve`).
    scanned: BTreeSet<ExecutionId>,
    /// Indexed executions found without a log, with when: index scans look at each again at
    /// most every `reserve::RECHECK_UNBORN_MS`, until it has a log or is deleted as orphaned.
    unborn: Map<ExecutionId, u64>,
}

/// What a turn collects before it returns.
#[derive(Debug, Default)]
struct Pending {
    writes: Writes,
    /// Answers that wait for the appends, with the execution the write changed.
    replies: Vec<(ReplyTo, Option<ExecutionId>, Result<Answer, Error>)>,
    /// Followed starts, answered once their appends are stored: the execution, whether it is
    /// new, and how it is followed.
    follows: Vec<(ReplyTo, ExecutionId, bool, Follow)>,
    /// Consumed results, with the execution each fed (none: set aside).
    acks: Vec<(Token, Option<ExecutionId>)>,
    /// Results handed back at once: their execution is not in memory yet.
    later: Vec<Token>,
    /// Results handed back for long: their execution's log does not replay.
    held: Vec<Token>,
    /// Results naming an attempt the state does not know.
    doubtful: Vec<(Token, results::AttemptKey)>,
    load: Vec<ExecutionId>,
    consume: Vec<u32>,
    /// Checkpoints of the executions of shards handed over this turn.
    handover: Vec<CheckpointJob>,
    /// Circuit breaker transitions to publish.
    breakers: Vec<Publish>,
    /// Index keys to delete that belong to no finished execution: reservations given up, and
    /// orphaned ones.
    index_deletes: Vec<String>,
    /// Large executions that left memory, for the executor to drop (`retire`).
    retired: Retired,
}

impl Coordinator {
    /// The limits a start's plan is compiled within ([`prepare`]): the access file's, or the
    /// defaults.
    pub fn plan_limits(&self) -> trellis_core::plan::Limits {
        self.limits.plan()
    }

    /// Returns a coordinator that owns no shard yet; its metrics go to `registry`.
    pub fn new(config: Config, registry: &trellis_telemetry::Registry) -> Self {
        let limits = config
            .access
            .as_ref()
            .map_or_else(access::Limits::default, |access| access.limits());
        Self {
            ids: Ids {
                seed: config.seed,
                counter: 0,
                last_execution: None,
            },
            config: Config {
                shards: config.shards.max(1),
                ..config
            },
            limits,
            metrics: Metrics::new(registry),
            owned: BTreeSet::new(),
            acquiring: BTreeSet::new(),
            executions: Map::default(),
            by_key: Map::default(),
            dirty: Vec::new(),
            timers: BTreeSet::new(),
            loading: Map::default(),
            parked: Vec::new(),
            workers: workers::Registry::default(),
            missing: BTreeSet::new(),
            attention: Map::default(),
            loads_for_results: BTreeSet::new(),
            rechecked: BTreeSet::new(),
            last_scan_ms: 0,
            last_forget_ms: 0,
            now: 0,
            pending: Pending::default(),
            refused: BTreeSet::new(),
            pauses: Arc::default(),
            inheriting: BTreeSet::new(),
            breakers: breakers::Breakers::new(config.breakers),
            reservations: reserve::Reservations::default(),
            scanned: BTreeSet::new(),
            unborn: Map::default(),
        }
    }

    /// Applies `inputs`, lets every touched execution decide, and returns the log writes and
    /// what needs nothing durable. Call [`Coordinator::appended`] with the appends' outcomes
    /// before the next turn.
    pub fn turn(&mut self, inputs: impl IntoIterator<Item = Input>, now: u64) -> Writes {
        self.now = now;
        for input in inputs {
            self.input(input, now);
        }
        // The attempts that ended feed the breakers before anything is decided.
        for id in &self.dirty {
            if let Some(live) = self.executions.get_mut(id) {
                for (key, ok, attempt) in live.ended.drain(..) {
                    self.breakers.outcome(key, ok, attempt, now);
                }
            }
        }
        self.breakers.tick(now);
        self.breaker_transitions();
        for id in &self.dirty {
            if let Some(live) = self.executions.get_mut(id) {
                live.decide(
                    *id,
                    now,
                    self.config.dispatch_window,
                    &self.metrics,
                    &self.pauses,
                    &mut self.breakers,
                );
            }
        }
        self.writes()
    }

    /// Takes the outcome of each append of the last turn and returns what may happen now.
    pub fn appended(&mut self, outcomes: Vec<(ExecutionId, Appended)>, now: u64) -> Effects {
        self.now = now;
        let (mut effects, touched) = self.side_effects(outcomes, now);
        effects.handover = std::mem::take(&mut self.pending.handover);
        effects.retired = std::mem::take(&mut self.pending.retired);
        effects.breakers = std::mem::take(&mut self.pending.breakers);
        effects.reserve = self.reserve(now);
        effects
            .index_deletes
            .append(&mut self.pending.index_deletes);
        effects.checkpoints = self.checkpoints(&touched, now);
        effects.replies = self.write_replies();
        self.metrics
            .executions_live
            .set(self.executions.len() as i64);
        self.metrics
            .executions_needing_attention
            .set(self.attention.len() as i64);
        effects
    }

    /// Returns true while this coordinator owns a shard.
    pub fn owns_any(&self) -> bool {
        !self.owned.is_empty()
    }

    /// Returns how many executions are held in memory.
    pub fn in_memory(&self) -> usize {
        self.executions.len()
    }

    /// Returns the shards this coordinator owns.
    pub fn owned(&self) -> impl Iterator<Item = u32> + '_ {
        self.owned.iter().copied()
    }

    /// Returns the live state of an execution held in memory.
    pub fn execution(&self, id: ExecutionId) -> Option<&trellis_core::machine::Execution> {
        self.executions.get(&id).map(|live| &live.machine)
    }

    /// Returns the last event sequence of an execution held in memory (appended, or about to be).
    pub fn last_sequence(&self, id: ExecutionId) -> Option<u64> {
        self.executions.get(&id).map(|live| live.seq)
    }

    /// Returns the executions of owned shards whose log does not replay.
    pub fn needing_attention(&self) -> impl Iterator<Item = &Broken> + '_ {
        self.attention.values()
    }

    /// Returns the ids of the executions held in memory.
    pub fn execution_ids(&self) -> impl Iterator<Item = ExecutionId> + '_ {
        self.executions.keys().copied()
    }

    /// Returns the shard of an execution.
    pub fn shard_of(&self, id: ExecutionId) -> u32 {
        subjects::shard_of(&id.to_string(), self.config.shards)
    }

    fn input(&mut self, input: Input, now: u64) {
        match input {
            Input::Request { reply, request } => self.request(reply, request, now),
            Input::Results(deliveries) => {
                tracing::debug!(n_results = deliveries.len(), "results received");
                for delivery in deliveries {
                    self.result(delivery, now);
                }
            }
            Input::Heartbeat(payload) => {
                if let Some(heartbeat) = workers::Registry::decode(&payload) {
                    self.heard(&heartbeat, now);
                    self.workers.heartbeat(heartbeat, now);
                }
            }
            Input::Fenced { id, epoch } => self.fenced(id, epoch, now),
            Input::OfferRefused {
                id,
                instance,
                attempt,
            } => self.offer_refused(id, instance, attempt),
            Input::Reserved(ids) => self.reserved(ids),
            Input::Tick => {
                self.lapse_inherited(now);
                self.tick_timers(now);
                self.workers.sweep(now, &self.metrics);
                if now >= self.last_forget_ms + FORGET_EVERY_MS {
                    self.last_forget_ms = now;
                    self.forget_finished(now);
                }
                if now >= self.last_scan_ms + self.config.index_scan_every_ms {
                    self.last_scan_ms = now;
                    let owned: Vec<u32> = self.owned.iter().copied().collect();
                    self.pending.writes.scan.extend(owned);
                }
            }
            Input::Indexed { shard, ids } => self.indexed(shard, ids),
            Input::Pauses(pauses) => self.set_pauses(pauses),
            Input::LeaseAcquired(shard) => self.acquire(shard),
            Input::LeaseLost(shard) => self.lose(shard, now),
            Input::LeaseReleased(shard) => self.release(shard, now),
            Input::ShardRecovered {
                shard,
                recovered,
                missing,
                broken,
            } => self.shard_recovered(shard, recovered, missing, broken, now),
            Input::Loaded {
                recovered,
                missing,
                broken,
            } => self.loaded(recovered, missing, broken, now),
            Input::CheckpointDone {
                id,
                full,
                sequence,
                result,
            } => self.checkpoint_done(id, full, sequence, result),
        }
    }

    /// The tick's touches: the executions whose clock is due (a timeout, a retry's backoff, a
    /// progress snapshot held back, a checkpoint's interval, something outside them holding
    /// them back); no other.
    fn tick_timers(&mut self, now: u64) {
        while let Some(&(at, id)) = self.timers.first()
            && at <= now
        {
            self.timers.pop_first();
            // An execution that left memory leaves its entry behind (`retire` does not look for
            // it): skipped here, as is one whose execution was loaded again since.
            if let Some(live) = self.executions.get_mut(&id)
                && live.wake_ms == Some(at)
            {
                live.wake_ms = None;
                self.wake(id);
            }
        }
    }

    /// Touches an execution this turn without counting it as changed or asked about (which
    /// would keep a finished one in memory longer): the clock's touch, or its checkpoint's.
    fn wake(&mut self, id: ExecutionId) {
        if let Some(live) = self.executions.get_mut(&id)
            && !live.dirty
        {
            live.dirty = true;
            self.dirty.push(id);
        }
    }

    /// Marks an execution touched this turn.
    fn mark(&mut self, id: ExecutionId) {
        if let Some(live) = self.executions.get_mut(&id) {
            live.touched_ms = self.now;
        }
        self.wake(id);
    }

    /// Drops the finished executions nobody touched for `keep_finished_ms` from memory, once
    /// everything about them is stored: their log is whole, their index entry deleted, no
    /// checkpoint in flight. A later read loads them from their checkpoint and log.
    fn forget_finished(&mut self, now: u64) {
        let keep = self.config.keep_finished_ms;
        let gone: Vec<ExecutionId> = self
            .executions
            .iter()
            .filter(|(_, live)| live.idle_and_finished() && now >= live.touched_ms + keep)
            .map(|(id, _)| *id)
            .collect();
        if gone.is_empty() {
            return;
        }
        for id in &gone {
            if let Some(live) = self.executions.remove(id) {
                self.retire(live);
            }
        }
        // A burst of executions leaves a table sized for it: give the room back.
        if self.executions.capacity() > 4 * self.executions.len() + 1024 {
            self.executions.shrink_to(2 * self.executions.len());
        }
        // Idempotency keys stay: a start repeated with the key still finds its execution,
        // which is loaded from its log when asked about.
        tracing::debug!(executions = gone.len(), "finished executions left memory");
        self.metrics.executions_forgotten.inc_by(gone.len() as u64);
        self.pending.writes.forget.extend(gone);
    }

    /// Answers now, before the appends.
    fn reply_now(&mut self, reply: ReplyTo, answer: Result<Answer, Error>) {
        self.pending.writes.replies.push((reply, answer));
    }

    /// Answers once the turn's appends are stored; `changed` names the execution the answer
    /// is about, whose append must have been stored for the answer to hold.
    fn reply_after(
        &mut self,
        reply: ReplyTo,
        changed: Option<ExecutionId>,
        answer: Result<Answer, Error>,
    ) {
        self.pending.replies.push((reply, changed, answer));
    }
}

#[cfg(test)]
mod tests;
