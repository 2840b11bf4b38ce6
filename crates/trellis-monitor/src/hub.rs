//! Live projections of executions, fed from their event logs on NATS.
//!
//! For each execution a browser looks at, one [`Hub`] reads `trellis.events.<id>` from its first
//! message with an ordered JetStream consumer and applies every logged event to a read-only copy
//! of the domain state machine (`trellis_core::machine::Execution`), exactly as recovery does. So
//! the monitor shows the same task instances, states and progress as the coordinator, without
//! asking it per event.
//!
//! Every `flush` interval (50 ms by default) the hub turns what changed into one `update` frame:
//! serialised once, shared by every stream as the same bytes, so a thousand browsers cost a
//! thousand socket writes, not a thousand serialisations. A hub no one has used for a while stops.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::jetstream::stream::Stream;
use bytes::Bytes;
use futures::StreamExt;
use prometheus_client::metrics::gauge::Gauge;
use prost::Message as _;
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_core::record::TaskState;
use trellis_proto::{subjects, v1};
use trellis_wire::replay::{ReplayError, ReplayErrorKind, Replayer, Step};

use crate::metrics::Open;
mod questions;
use questions::Questions;

use crate::views::{EventView, ExecutionView, InstanceDetail, InstanceView, PlanView};

/// Most events one update carries; older ones of the same batch are counted, not sent.
pub const MAX_EVENTS_PER_UPDATE: usize = 25;
/// Most changed instances one update carries; beyond it the client refetches the list.
pub const MAX_INSTANCES_PER_UPDATE: usize = 1_000;
/// Frames a slow stream may fall behind before it is sent a fresh snapshot instead.
const UPDATE_BUFFER: usize = 256;
/// Most instances followed back through `continues` for a drawer's questions.
const MAX_QUESTION_CHAIN: usize = 1_000;
/// A hub with no stream and no request for this long stops.
const IDLE_AFTER: Duration = Duration::from_secs(60);
/// How long a request waits for a new hub to catch up with its log.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a hub cannot answer.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum HubError {
    #[error("no execution {0}: its event log is empty or gone")]
    Unknown(String),
    #[error("cannot read the event log of {id}: {message}")]
    Log { id: String, message: String },
    /// The log does not replay: the message names the execution and the sequence.
    #[error("{0}")]
    Replay(String),
}

/// Every hub of this monitor, by execution.
#[derive(Debug)]
pub struct Hubs {
    events: Stream,
    flush: Duration,
    hubs: Mutex<HashMap<ExecutionId, Arc<Hub>>>,
    shutdown: CancellationToken,
    /// How many hubs are following their log.
    watched: Gauge,
}

impl Hubs {
    /// Hubs reading the event stream `events`, flushing every `flush`, counting themselves in
    /// `watched`.
    pub fn new(
        events: Stream,
        flush: Duration,
        shutdown: CancellationToken,
        watched: Gauge,
    ) -> Arc<Self> {
        Arc::new(Self {
            events,
            flush,
            hubs: Mutex::new(HashMap::new()),
            shutdown,
            watched,
        })
    }

    fn map(&self) -> MutexGuard<'_, HashMap<ExecutionId, Arc<Hub>>> {
        // A panic while holding this lock leaves only a map of handles behind; keep using it.
        self.hubs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hub of `id`, started if needed, once it has read the log as far as it went when the
    /// hub started.
    ///
    /// # Errors
    ///
    /// The execution has no log, or the log cannot be read.
    pub async fn get(self: &Arc<Self>, id: ExecutionId) -> Result<Arc<Hub>, HubError> {
        // Touched under the map's lock, so an idle hub cannot stop between this and the touch.
        let existing = self.map().get(&id).inspect(|hub| hub.touch()).cloned();
        let hub = match existing {
            Some(hub) => hub,
            None => {
                let last = self.last_stream_seq(id).await?;
                let mut map = self.map();
                match map.get(&id) {
                    Some(hub) => Arc::clone(hub),
                    None => {
                        let hub = Arc::new(Hub::new(id, last));
                        map.insert(id, Arc::clone(&hub));
                        tokio::spawn(follow(Arc::clone(self), Arc::clone(&hub)));
                        hub
                    }
                }
            }
        };
        hub.touch();
        hub.ready().await?;
        Ok(hub)
    }

    /// The stream sequence of the last message of `id`'s log; [`HubError::Unknown`] when it has
    /// none.
    async fn last_stream_seq(&self, id: ExecutionId) -> Result<u64, HubError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        match self
            .events
            .get_last_raw_message_by_subject(&subjects::events(id))
            .await
        {
            Ok(message) => Ok(message.sequence),
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
                Err(HubError::Unknown(id.to_string()))
            }
            Err(err) => Err(HubError::Log {
                id: id.to_string(),
                message: err.to_string(),
            }),
        }
    }

    /// Events of `id`'s log from sequence `from`, at most `limit`, read from the stream itself
    /// starting at the message that holds `from` (the hub keeps where each stored message
    /// starts, not the events). Also returns the
    /// sequence to ask for next, if the log goes on.
    ///
    /// # Errors
    ///
    /// The log cannot be read.
    pub async fn events(
        &self,
        hub: &Hub,
        from: u64,
        limit: usize,
    ) -> Result<(Vec<EventView>, Option<u64>), HubError> {
        let from = from.max(1);
        let (start, last) = {
            let state = hub.state();
            let index = state.batches.partition_point(|&(first, _)| first <= from);
            let start = index.checked_sub(1).map_or(0, |i| state.batches[i].1);
            (start, state.seq)
        };
        let failed = |message: String| HubError::Log {
            id: hub.id.to_string(),
            message,
        };
        // One consumer streams the page's messages, rather than a request per message.
        let mut messages = trellis_bus::read_execution_log(&self.events, hub.id, start)
            .await
            .map_err(failed)?;
        let mut out = Vec::new();
        let mut next_seq = from;
        while out.len() < limit && next_seq <= last {
            let message = tokio::time::timeout(READY_TIMEOUT, messages.next())
                .await
                .map_err(|_| failed(format!("the log stopped at sequence {}", next_seq - 1)))?
                .ok_or_else(|| failed("the log reader stopped".to_owned()))?
                .map_err(|err| failed(err.to_string()))?;
            let Ok(batch) = v1::EventBatch::decode(message.payload.as_ref()) else {
                continue;
            };
            let appended_ms = message
                .info()
                .map_or_else(|_| now_ms() as i64, |info| unix_ms(info.published));
            for event in &batch.events {
                if event.sequence >= next_seq && out.len() < limit && event.sequence <= last {
                    out.push(EventView::new(event, appended_ms));
                    next_seq = event.sequence + 1;
                }
            }
        }
        let next = (next_seq <= last).then_some(next_seq);
        Ok((out, next))
    }
}

/// Where a hub stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Readiness {
    /// The log has not been read as far as it went when the hub started.
    Loading,
    Ready,
    Failed(HubError),
}

/// The live projection of one execution.
#[derive(Debug)]
pub struct Hub {
    id: ExecutionId,
    /// The stream sequence of the log's last message when the hub started: it is ready (its
    /// snapshots are current, not half replayed) once it has applied that far.
    catch_up_to: u64,
    state: Mutex<Projection>,
    updates: broadcast::Sender<Bytes>,
    readiness: watch::Sender<Readiness>,
    /// Milliseconds since the Unix epoch of the last request or stream.
    last_used_ms: AtomicU64,
}

/// What a hub knows of its execution.
#[derive(Debug, Default)]
struct Projection {
    /// The execution rebuilt by the one replayer, from `ExecutionStarted` on.
    replay: Option<Replayer>,
    /// The log could not be replayed past a point: the projection stays as it was there.
    broken: bool,
    /// The last event sequence read.
    seq: u64,
    /// `(first event sequence, stream sequence)` of every log message read, in order.
    batches: Vec<(u64, u64)>,
    /// Events since the last flush, newest last, at most [`MAX_EVENTS_PER_UPDATE`].
    events: VecDeque<EventView>,
    events_omitted: u64,
    /// Something changed since the last flush.
    dirty: bool,
    /// An `ExecutionFinished` arrived since the last flush.
    finished: bool,
    /// The plan as the API shows it, built on first request.
    plan: Option<Arc<PlanView>>,
    /// Every question asked, with its outcome.
    questions: Questions,
}

/// The first frame of a stream.
#[derive(Serialize)]
struct Snapshot<'a> {
    seq: u64,
    execution: &'a ExecutionView,
    instances: Vec<InstanceView>,
}

/// What changed in one flush interval.
#[derive(Serialize)]
struct Update {
    seq: u64,
    execution: ExecutionView,
    events: Vec<EventView>,
    events_omitted: u64,
    instances: Vec<InstanceView>,
    instances_omitted: usize,
}

/// Frames one Server-Sent Event.
pub fn sse_frame(event: &str, data: &impl Serialize) -> Bytes {
    // Serialising plain data structures to JSON cannot fail; an empty object stands in should it.
    let json = serde_json::to_string(data).unwrap_or_else(|_| "{}".to_owned());
    Bytes::from(format!("event: {event}\ndata: {json}\n\n"))
}

/// Milliseconds since the Unix epoch of a NATS timestamp.
fn unix_ms(time: async_nats::datetime::DateTime) -> i64 {
    (time.unix_timestamp_nanos() / 1_000_000) as i64
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Hub {
    fn new(id: ExecutionId, catch_up_to: u64) -> Self {
        let (updates, _) = broadcast::channel(UPDATE_BUFFER);
        let (readiness, _) = watch::channel(Readiness::Loading);
        Self {
            id,
            catch_up_to,
            state: Mutex::new(Projection::default()),
            updates,
            readiness,
            last_used_ms: AtomicU64::new(now_ms()),
        }
    }

    fn state(&self) -> MutexGuard<'_, Projection> {
        // The projection is rebuilt from the log; after a panic elsewhere it is still the best
        // there is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self) {
        self.last_used_ms.store(now_ms(), Ordering::Relaxed);
    }

    async fn ready(&self) -> Result<(), HubError> {
        let mut readiness = self.readiness.subscribe();
        let waited = tokio::time::timeout(READY_TIMEOUT, async {
            loop {
                match &*readiness.borrow_and_update() {
                    Readiness::Ready => return Ok(()),
                    Readiness::Failed(err) => return Err(err.clone()),
                    Readiness::Loading => {}
                }
                if readiness.changed().await.is_err() {
                    return Err(HubError::Log {
                        id: self.id.to_string(),
                        message: "its reader stopped".to_owned(),
                    });
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            Err(HubError::Log {
                id: self.id.to_string(),
                message: format!("its log was not read within {READY_TIMEOUT:?}"),
            })
        })
    }

    /// Every task instance, and the sequence they reflect.
    pub fn instances(&self) -> (u64, Vec<InstanceView>) {
        let state = self.state();
        let instances = state.replay.as_ref().map_or_else(Vec::new, |replay| {
            replay
                .machine()
                .records()
                .iter()
                .map(InstanceView::from)
                .collect()
        });
        (state.seq, instances)
    }

    /// One instance in full (record, input, output), for the task drawer; `None` when the
    /// execution has no such instance.
    pub fn instance(&self, instance: TaskInstanceId) -> Option<InstanceDetail> {
        let state = self.state();
        let machine = state.replay.as_ref()?.machine();
        let record = machine.record(instance)?;
        let input = machine
            .assignment(instance)
            .map(|assignment| assignment.input.clone());
        let mut detail = InstanceDetail::new(&record, input);
        // The questions of the task's turn: this instance's, and those of the instances it
        // continues (an answer starts a new instance that continues the asking one).
        let mut at = Some(record);
        let mut chain = Vec::new();
        while let Some(record) = at {
            let mut asked = state.questions.asked_by(record.task_instance_id).to_vec();
            if record.state == TaskState::Cancelled {
                // Cancelling an instance withdraws the question it waited on (no event says so).
                for question in asked.iter_mut().filter(|q| q.outcome == "open") {
                    question.outcome = "withdrawn";
                }
            }
            chain.push(asked);
            at = record
                .continues_task_instance_id
                .and_then(|earlier| machine.record(earlier))
                .filter(|_| chain.len() < MAX_QUESTION_CHAIN);
        }
        detail.questions = chain.into_iter().rev().flatten().collect();
        Some(detail)
    }

    /// The plan, laid out by waves and drawn (see [`crate::layout`]); made once, on first use.
    /// The drawing of a large plan takes a while: callers on the async runtime call this from a
    /// blocking task, and it is made outside the lock so updates keep flowing meanwhile.
    pub fn plan(&self) -> Option<Arc<PlanView>> {
        let plan = {
            let state = self.state();
            if let Some(view) = &state.plan {
                return Some(Arc::clone(view));
            }
            Arc::clone(state.replay.as_ref()?.machine().plan())
        };
        let view = Arc::new(PlanView::from(&*plan));
        let mut state = self.state();
        Some(Arc::clone(state.plan.get_or_insert(view)))
    }

    /// A snapshot frame and the updates that follow it, taken under one lock so that no update
    /// falls between them. Without `records` the snapshot carries no instances.
    pub fn subscribe(&self, records: bool) -> (Bytes, broadcast::Receiver<Bytes>) {
        self.touch();
        let state = self.state();
        let execution = state
            .replay
            .as_ref()
            .map_or_else(ExecutionView::default, |replay| {
                ExecutionView::from_machine(replay.machine(), replay.started(), now_ms())
            });
        let instances = match (&state.replay, records) {
            (Some(replay), true) => replay
                .machine()
                .records()
                .iter()
                .map(InstanceView::from)
                .collect(),
            _ => Vec::new(),
        };
        let frame = sse_frame(
            "snapshot",
            &Snapshot {
                seq: state.seq,
                execution: &execution,
                instances,
            },
        );
        let receiver = self.updates.subscribe();
        drop(state);
        (frame, receiver)
    }

    /// Applies one log message (an `EventBatch`) stored at `stream_seq` at `appended_ms`.
    fn ingest(&self, payload: &[u8], stream_seq: u64, appended_ms: i64) {
        let mut state = self.state();
        let batch = match v1::EventBatch::decode(payload) {
            Ok(batch) => batch,
            Err(err) => {
                let err = ReplayError {
                    execution_id: self.id,
                    sequence: state.seq + 1,
                    kind: ReplayErrorKind::Corrupt(format!(
                        "stream message {stream_seq} is not an event batch: {err}"
                    )),
                };
                self.fail(&mut state, &err);
                return;
            }
        };
        if let Some(first) = batch.events.first() {
            state.batches.push((first.sequence, stream_seq));
        }
        for event in &batch.events {
            if event.sequence <= state.seq {
                continue;
            }
            state.seq = event.sequence;
            self.replay(&mut state, event);
            state.questions.note(event);
            if matches!(event.kind, Some(v1::event::Kind::ExecutionFinished(_))) {
                state.finished = true;
            }
            if state.events.len() == MAX_EVENTS_PER_UPDATE {
                state.events.pop_front();
                state.events_omitted += 1;
            }
            state.events.push_back(EventView::new(event, appended_ms));
            state.dirty = true;
        }
        if stream_seq >= self.catch_up_to && state.replay.is_some() {
            drop(state);
            self.readiness.send_if_modified(|readiness| {
                let loading = *readiness == Readiness::Loading;
                if loading {
                    *readiness = Readiness::Ready;
                }
                loading
            });
        }
    }

    /// Applies one event through the replayer, `ExecutionStarted` starting it. A log that does
    /// not replay (a gap, a corrupt event) fails the hub with the execution and the sequence,
    /// and the projection stays as it was before that event.
    fn replay(&self, state: &mut Projection, event: &v1::Event) {
        if state.broken {
            return;
        }
        let result = match state.replay.as_mut() {
            Some(replay) => replay.apply_event(event).map(|step| match step {
                Step::Applied | Step::Duplicate => {}
                Step::Refused(err) => {
                    tracing::debug!(id = %self.id, sequence = event.sequence, %err, "logged event refused");
                }
                Step::Unknown => {
                    tracing::warn!(id = %self.id, sequence = event.sequence, "event of an unknown kind skipped");
                }
            }),
            None => Replayer::from_first_event(self.id, event).map(|replay| {
                state.replay = Some(replay);
            }),
        };
        if let Err(err) = result {
            self.fail(state, &err);
        }
    }

    /// Stops replaying at a broken log, and says so to every request from now on.
    fn fail(&self, state: &mut Projection, err: &ReplayError) {
        if state.broken {
            return;
        }
        tracing::warn!(%err, "the monitor cannot follow the log of an execution");
        state.broken = true;
        self.readiness
            .send_replace(Readiness::Failed(HubError::Replay(err.to_string())));
    }

    /// Sends what changed since the last flush to every stream.
    fn flush(&self) {
        let mut state = self.state();
        if !state.dirty {
            return;
        }
        state.dirty = false;
        let events: Vec<EventView> = state.events.drain(..).collect();
        let events_omitted = std::mem::take(&mut state.events_omitted);
        let finished = std::mem::take(&mut state.finished);
        let seq = state.seq;
        let Some(replay) = state.replay.as_mut() else {
            return;
        };
        let changed = replay.take_changed_records();
        if self.updates.receiver_count() == 0 {
            return;
        }
        let (instances, instances_omitted) = if changed.len() > MAX_INSTANCES_PER_UPDATE {
            (Vec::new(), changed.len())
        } else {
            (changed.iter().map(InstanceView::from).collect(), 0)
        };
        let update = Update {
            seq,
            execution: ExecutionView::from_machine(replay.machine(), replay.started(), now_ms()),
            events,
            events_omitted,
            instances,
            instances_omitted,
        };
        let _ = self.updates.send(sse_frame("update", &update));
        if finished {
            let _ = self
                .updates
                .send(sse_frame("end", &serde_json::json!({ "seq": seq })));
        }
    }

    fn idle(&self) -> bool {
        self.updates.receiver_count() == 0
            && now_ms().saturating_sub(self.last_used_ms.load(Ordering::Relaxed))
                > IDLE_AFTER.as_millis() as u64
    }
}

/// Reads the hub's log from the start and keeps it current until the hub goes idle or the
/// monitor stops.
async fn follow(hubs: Arc<Hubs>, hub: Arc<Hub>) {
    let _watched = Open::new(&hubs.watched);
    let fail = |message: String| {
        hub.readiness.send_replace(Readiness::Failed(HubError::Log {
            id: hub.id.to_string(),
            message,
        }));
    };
    let mut messages = match trellis_bus::read_execution_log(&hubs.events, hub.id, 0).await {
        Ok(messages) => messages,
        Err(message) => {
            fail(message);
            hubs.map().remove(&hub.id);
            return;
        }
    };
    let mut tick = tokio::time::interval(hubs.flush);
    let mut last_flush = tokio::time::Instant::now();
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = hubs.shutdown.cancelled() => break,
            next = messages.next() => match next {
                Some(Ok(message)) => {
                    let (stream_seq, appended_ms) = message.info().map_or((0, now_ms() as i64), |info| {
                        (info.stream_sequence, unix_ms(info.published))
                    });
                    hub.ingest(&message.payload, stream_seq, appended_ms);
                    // Under a steady flow the tick may lose the race against new messages: flush
                    // here as soon as an interval has passed.
                    if last_flush.elapsed() >= hubs.flush {
                        hub.flush();
                        last_flush = tokio::time::Instant::now();
                    }
                }
                Some(Err(err)) => {
                    tracing::warn!(id = %hub.id, %err, "event log read failed; the reader retries");
                }
                None => break,
            },
            _ = tick.tick() => {
                hub.flush();
                last_flush = tokio::time::Instant::now();
                if hub.idle() {
                    let mut map = hubs.map();
                    if hub.idle() {
                        map.remove(&hub.id);
                        break;
                    }
                }
            }
        }
    }
    let mut map = hubs.map();
    if map
        .get(&hub.id)
        .is_some_and(|current| Arc::ptr_eq(current, &hub))
    {
        map.remove(&hub.id);
    }
    drop(map);
    tracing::debug!(id = %hub.id, "hub stopped");
}

/// The hub as its reader drives it, for the fuzz targets (feature `fuzzing`).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzzing {
    use super::*;

    /// Feeds `payloads` to a fresh hub of `id` as its reader does (stream sequences 1, 2, ...;
    /// a flush after each, a live stream listening), then reads what a new stream and the
    /// instances page would get. Returns whether the hub still follows the log.
    pub(crate) fn follow(id: ExecutionId, payloads: &[&[u8]]) -> bool {
        let hub = Hub::new(id, payloads.len() as u64);
        let (_, mut live) = hub.subscribe(true);
        for (idx, payload) in payloads.iter().enumerate() {
            hub.ingest(payload, idx as u64 + 1, 0);
            hub.flush();
            while live.try_recv().is_ok() {}
        }
        let _ = hub.subscribe(true);
        let _ = hub.instances();
        let _ = hub.plan();
        !matches!(*hub.readiness.borrow(), Readiness::Failed(_))
    }
}

#[cfg(test)]
mod tests;
