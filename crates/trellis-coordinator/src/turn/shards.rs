//! Shard ownership as the turn sees it: a lease acquired starts a recovery of the shard's
//! unfinished executions, which are adopted before the shard's results are consumed; a lease lost
//! drops them; an execution not in memory is loaded from its log on demand.

use std::sync::Arc;

use bytes::Bytes;
use trellis_core::ids::ExecutionId;
use trellis_core::machine::{Event, EventBody, Execution};
use trellis_proto::subjects;
use trellis_wire::log::Started;

use super::live::{Live, Tenancy};
use super::{Broken, Coordinator, Error, Request, Waiting};
use trellis_grpc::access::Scope;

/// Most ids remembered as having no log (their results are set aside without a look).
const MAX_MISSING: usize = 10_000;

/// One message of an execution's log: an encoded `EventBatch` and where it sits in the stream.
#[derive(Clone, Debug)]
pub struct LogMessage {
    pub stream_seq: u64,
    pub first_seq: u64,
    pub payload: Bytes,
}

/// An execution rebuilt from its checkpoint and log, ready to be adopted.
#[derive(Debug)]
pub struct Recovered {
    pub machine: Execution,
    pub started: Started,
    /// The last event sequence applied.
    pub seq: u64,
    /// The stream sequence of the log's last message (the next append expects it).
    pub stream_seq: u64,
    /// The messages read after the checkpoint (all of them without one), for observers.
    pub log: Vec<LogMessage>,
    /// The checkpoint the state came from: its id, event sequence and the number of deltas on
    /// its full snapshot.
    pub checkpoint: Option<(String, u64, u32)>,
}

/// The index key of an execution: `<shard>.<id>`.
pub fn index_key(shard: u32, id: ExecutionId) -> String {
    format!("{shard}.{id}")
}

impl Coordinator {
    /// A lease was acquired: the shard's unfinished executions are recovered (in the
    /// background), then adopted.
    pub(super) fn acquire(&mut self, shard: u32) {
        if self.owned.contains(&shard) || !self.acquiring.insert(shard) {
            return;
        }
        self.pending.writes.recover.push(shard);
    }

    /// A lease was lost: the shard's executions are forgotten and its results no longer consumed.
    pub(super) fn lose(&mut self, shard: u32, now: u64) {
        let gone = self.drop_shard(shard, now);
        tracing::warn!(shard, executions = gone, "shard given up");
    }

    /// This coordinator hands the shard over: the executions whose last checkpoint is behind are
    /// checkpointed (the new owner recovers them from there), then the shard is dropped as a lost
    /// one is. Everything of the shard's executions is stored by now (the executor gives this
    /// input a turn of its own), so dropping them loses nothing and answers nothing wrongly.
    pub(super) fn release(&mut self, shard: u32, now: u64) {
        let ids: Vec<ExecutionId> = self
            .executions
            .iter()
            .filter(|(_, live)| live.shard == shard)
            .map(|(id, _)| *id)
            .collect();
        let mut checkpoints = 0;
        for id in ids {
            if let Some(job) = self.handover_checkpoint(id, now) {
                self.pending.handover.push(job);
                checkpoints += 1;
            }
        }
        let gone = self.drop_shard(shard, now);
        tracing::info!(shard, executions = gone, checkpoints, "shard handed over");
    }

    /// Stops owning a shard: forgets its executions, stops consuming its results, and answers
    /// the requests waiting on it as not owned here. Returns how many executions it dropped.
    fn drop_shard(&mut self, shard: u32, now: u64) -> usize {
        self.owned.remove(&shard);
        self.acquiring.remove(&shard);
        self.pending.writes.stop_consuming.push(shard);
        // Adopted earlier in this turn: its results must not be consumed after all.
        self.pending.consume.retain(|consumed| *consumed != shard);
        let gone: Vec<ExecutionId> = self
            .executions
            .iter()
            .filter(|(_, live)| live.shard == shard)
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            if let Some(mut live) = self.executions.remove(id) {
                for reply in live.checkpoint.take_waiting() {
                    self.reply_now(
                        reply,
                        Err(Error::not_owned(
                            Some(shard),
                            format!("execution {id} moved to another coordinator; ask it"),
                        )),
                    );
                }
                self.retire(live);
            }
            // What this turn did to them is not stored: no answer or acknowledgement may say so.
            self.refused.insert(*id);
        }
        self.dirty.retain(|id| !gone.contains(id));
        for id in self.reservations.drop_shard(shard) {
            self.pending.index_deletes.push(index_key(shard, id));
        }
        let shards = self.config.shards;
        self.unborn
            .retain(|id, _| subjects::shard_of(&id.to_string(), shards) != shard);
        self.attention
            .retain(|id, _| subjects::shard_of(&id.to_string(), shards) != shard);
        self.by_key
            .retain(|_, id| subjects::shard_of(&id.to_string(), shards) != shard);
        let dropped = gone.len();
        self.pending.writes.forget.extend(gone);
        // Requests waiting for an execution of the shard, or for the shard's recovery, are
        // answered as any request about a shard this coordinator does not own.
        let loading: Vec<ExecutionId> = self
            .loading
            .keys()
            .copied()
            .filter(|id| self.shard_of(*id) == shard)
            .collect();
        let mut retry: Vec<Waiting> = std::mem::take(&mut self.parked);
        for id in loading {
            retry.extend(self.loading.remove(&id).unwrap_or_default());
        }
        for waiting in retry {
            self.request(waiting.reply, waiting.request, now);
        }
        dropped
    }

    pub(super) fn shard_recovered(
        &mut self,
        shard: u32,
        recovered: Vec<Recovered>,
        missing: Vec<ExecutionId>,
        broken: Vec<Broken>,
        now: u64,
    ) {
        if !self.acquiring.remove(&shard) {
            // The lease was lost again while recovering.
            return;
        }
        self.owned.insert(shard);
        self.reservations.acquired(shard);
        self.adopt(recovered, now);
        self.pending.consume.push(shard);
        tracing::info!(shard, "shard owned");
        for id in missing {
            self.fail_waiting(id);
            self.indexed_without_log(shard, id, now);
        }
        self.hold_broken(broken);
        // Requests that arrived while the shard was recovered. Those for another shard still
        // being recovered park again.
        for waiting in std::mem::take(&mut self.parked) {
            self.request(waiting.reply, waiting.request, now);
        }
    }

    pub(super) fn loaded(
        &mut self,
        recovered: Vec<Recovered>,
        missing: Vec<ExecutionId>,
        broken: Vec<Broken>,
        now: u64,
    ) {
        let recovered: Vec<Recovered> = recovered
            .into_iter()
            .filter(|execution| self.owned.contains(&self.shard_of(execution.machine.id())))
            .collect();
        let ids: Vec<ExecutionId> = recovered.iter().map(|r| r.machine.id()).collect();
        self.adopt(recovered, now);
        for broken in &broken {
            self.scanned.remove(&broken.id);
        }
        for id in missing {
            self.fail_waiting(id);
            let shard = self.shard_of(id);
            if self.scanned.remove(&id) && self.owned.contains(&shard) {
                self.indexed_without_log(shard, id, now);
            }
        }
        self.hold_broken(broken);
        for id in ids {
            self.scanned.remove(&id);
            self.unborn.remove(&id);
            if self.attention.remove(&id).is_some() {
                tracing::info!(%id, "the log of an execution that needed attention replays again");
            }
            self.loads_for_results.remove(&id);
            for waiting in self.loading.remove(&id).unwrap_or_default() {
                self.request(waiting.reply, waiting.request, now);
            }
        }
    }

    /// Loads the indexed executions of an owned shard that are not in memory: a former owner
    /// may have started them after this coordinator read the index.
    pub(super) fn indexed(&mut self, shard: u32, ids: Vec<ExecutionId>) {
        if !self.owned.contains(&shard) {
            return;
        }
        for id in ids {
            if self.shard_of(id) != shard
                || self.loading.contains_key(&id)
                || self.reservations.holds(shard, id)
            {
                continue;
            }
            // Indexed means unfinished: an execution held here as finished was started again
            // (a new run) by a former owner, so what is held is out of date.
            let outdated = self
                .executions
                .get(&id)
                .is_some_and(|live| live.machine.state().is_terminal() && !live.indexed);
            if outdated && !self.dirty.contains(&id) {
                tracing::info!(%id, shard, "indexed again while held as finished; reloading it");
                self.unload(id);
                self.pending.writes.forget.push(id);
            }
            if !self.executions.contains_key(&id)
                && !self.missing.contains(&id)
                && !self.attention.contains_key(&id)
                && self.recheck(id, self.now)
            {
                if self.unborn.contains_key(&id) {
                    tracing::debug!(%id, shard, "indexed without a log when last read; reading it again");
                } else {
                    tracing::info!(%id, shard, "indexed execution not in memory; loading it");
                }
                self.scanned.insert(id);
                self.loading.insert(id, Vec::new());
                self.pending.load.push(id);
            }
        }
    }

    /// Holds executions whose log does not replay, and answers the requests waiting for them
    /// with where it broke. They stay out of memory: nothing is dispatched for them, their
    /// results are handed back (`Ack::Hold`), index scans pass them by, and each request about
    /// one reads its log again (so a repaired log is taken up).
    fn hold_broken(&mut self, broken: Vec<Broken>) {
        for broken in broken {
            let id = broken.id;
            self.loads_for_results.remove(&id);
            let waiting = self.loading.remove(&id).unwrap_or_default();
            if !self.owned.contains(&self.shard_of(id)) {
                // The shard moved while the log was read: asked again, they go where it is.
                for waiting in waiting {
                    self.request(waiting.reply, waiting.request, self.now);
                }
                continue;
            }
            if self.attention.get(&id) != Some(&broken) {
                tracing::error!(%id, sequence = broken.sequence, reason = %broken.reason, "execution needs attention: its log does not replay");
            }
            for waiting in waiting {
                let visible = match &waiting.request {
                    Request::On { scope, .. } => match &broken.namespace {
                        Some(namespace) => scope.allows(namespace),
                        None => matches!(scope, Scope::All),
                    },
                    _ => true,
                };
                let answer = if visible {
                    Error::needs_attention(&broken)
                } else {
                    Error::not_found(id)
                };
                self.reply_now(waiting.reply, Err(answer));
            }
            self.attention.insert(id, broken);
        }
    }

    /// Answers the requests waiting for an execution that could not be loaded.
    fn fail_waiting(&mut self, id: ExecutionId) {
        // A result names an execution without a log: a worker's mistake, since a result follows
        // an assignment and the assignment its stored events. Its results are set aside from now
        // on. (An execution an index scan found may not have its first event stored yet: it is
        // looked at again by the next scan.)
        if self.loads_for_results.remove(&id) {
            if self.missing.len() >= MAX_MISSING {
                self.missing.clear();
            }
            self.missing.insert(id);
        }
        for waiting in self.loading.remove(&id).unwrap_or_default() {
            self.reply_now(waiting.reply, Err(Error::not_found(id)));
        }
    }

    fn adopt(&mut self, recovered: Vec<Recovered>, now: u64) {
        for execution in recovered {
            let id = execution.machine.id();
            let shard = self.shard_of(id);
            let namespace: Arc<str> = Arc::from(execution.started.namespace());
            let tenancy = Tenancy {
                checkpoints_allowed: self.quota(&namespace).checkpoints,
                namespace: namespace.clone(),
                traceparent: execution.started.traceparent.clone(),
            };
            let mut live = Live::new(
                execution.machine,
                execution.started.labels.clone(),
                execution.started.started_at_ms,
                shard,
                tenancy,
            );
            live.seq = execution.seq;
            live.stream_seq = execution.stream_seq;
            live.log_base = execution
                .log
                .first()
                .map_or(execution.seq + 1, |m| m.first_seq);
            live.log = execution
                .log
                .into_iter()
                .map(|m| (m.first_seq, m.payload))
                .collect();
            live.indexed = true;
            if let Some((checkpoint_id, seq, deltas)) = execution.checkpoint {
                live.checkpoint.id = Some(checkpoint_id);
                live.checkpoint.seq = seq;
                live.checkpoint.since_full = deltas;
                live.checkpoint.at_ms = now;
            }
            if !live.machine.state().is_terminal() {
                // The claim's append fences out a former owner that has not noticed yet: its
                // own next append no longer follows the log. Refused itself (the former owner
                // wrote after this coordinator read the log), the execution is loaded again.
                let claim = Event {
                    at_ms: now,
                    body: EventBody::ExecutionClaimed {
                        coordinator: self.config.id.clone(),
                    },
                };
                if let Err(err) = live.record(id, claim, &self.metrics) {
                    tracing::error!(%id, %err, "claim refused by the state machine");
                }
                // What the former owner left running is left to its workers while they run
                // it, and sent again under this owner's epoch once none does (`takeover`).
                if live.inherit_running(now) {
                    self.inheriting.insert(id);
                }
            }
            if !execution.started.idempotency_key.is_empty() {
                self.by_key
                    .insert((namespace, execution.started.idempotency_key.clone()), id);
            }
            self.executions.insert(id, live);
            self.mark(id);
        }
    }

    /// Loads an execution that is not in memory (finished before a restart, or fenced) from its
    /// log, then answers the request.
    pub(super) fn load(&mut self, id: ExecutionId, waiting: Waiting) {
        let shard = self.shard_of(id);
        if self.acquiring.contains(&shard) {
            // Its shard is being recovered: answer once it is.
            self.parked.push(waiting);
            return;
        }
        if !self.owned.contains(&shard) {
            self.reply_now(
                waiting.reply,
                Err(Error::not_owned(
                    Some(shard),
                    format!(
                        "execution {id} belongs to shard {shard}, which this coordinator does \
                         not own; ask the coordinator that does (`trellis cluster` lists them)"
                    ),
                )),
            );
            return;
        }
        if let Some(waiting_list) = self.loading.get_mut(&id) {
            waiting_list.push(waiting);
            return;
        }
        self.loading.insert(id, vec![waiting]);
        self.pending.load.push(id);
    }
}
