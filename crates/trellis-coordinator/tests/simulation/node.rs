//! A simulated coordinator process: the lease keeper and each turn of the real pure turn carried
//! out as the executor does, with a crash possible between any two steps. Its intake of results
//! is in `results.rs`.

use prost::Message as _;
use trellis_coordinator::turn::{
    Ack, Append, Appended, Assign, Broken, Effects, Input, LogMessage, Recoveries, Recovery, Token,
    Writes,
};
use trellis_coordinator::{checkpoints, recovery};
use trellis_core::ids::ExecutionId;
use trellis_proto::{subjects, v1};

use crate::Bug;
use crate::nats::AppendError;
use crate::world::*;

impl World {
    /// One step of a coordinator process.
    pub(crate) fn node_step(&mut self, idx: usize) -> Result<(), String> {
        let now = self.now;
        if self.nodes[idx].turn.is_none() || now < self.nodes[idx].stalled_until {
            return Ok(());
        }
        if let Some(appends) = self.nodes[idx].suspended.take() {
            return self.finish_turn(idx, appends);
        }
        // A stale process may run a turn before it learns that its leases are gone.
        if self.rng.percent(50) {
            self.keep_leases(idx);
            self.take_results(idx);
            self.turn(idx)?;
        } else {
            self.take_results(idx);
            self.turn(idx)?;
            self.keep_leases(idx);
        }
        self.hand_over(idx)
    }

    /// Hands over the shards the lease keeper gave up, in a turn of their own after a whole one,
    /// as the executor does; their leases are deleted once that turn's effects are carried out.
    fn hand_over(&mut self, idx: usize) -> Result<(), String> {
        let node = &mut self.nodes[idx];
        if node.turn.is_none() || node.suspended.is_some() || node.releasing.is_empty() {
            return Ok(());
        }
        node.released = std::mem::take(&mut node.releasing);
        let inputs = node
            .released
            .iter()
            .map(|(shard, _)| Input::LeaseReleased(*shard))
            .collect();
        if verbose() {
            eprintln!(
                "{}: coordinator {idx} hands over {:?}",
                self.now, node.released
            );
        }
        self.turn_with(idx, inputs)
    }

    /// The lease keeper: renews held leases, takes free ones.
    pub(crate) fn keep_leases(&mut self, idx: usize) {
        let now = self.now;
        let node = &mut self.nodes[idx];
        if now < node.last_renewal + LEASE_TTL / 3 {
            return;
        }
        node.last_renewal = now;
        // The fair share: the live processes as the membership bucket would list them.
        let live = self.nodes.iter().filter(|n| n.turn.is_some()).count();
        let share = (SHARDS as usize).div_ceil(live.max(1));
        let wanting = self
            .nodes
            .iter()
            .enumerate()
            .any(|(other, n)| other != idx && n.turn.is_some() && n.leases.len() < share);
        let node = &mut self.nodes[idx];
        for shard in 0..SHARDS {
            match node.leases.get(&shard) {
                Some(&revision) => match self.nats.leases.renew(shard, revision, now, LEASE_TTL) {
                    Some(revision) => {
                        node.leases.insert(shard, revision);
                    }
                    None => {
                        if verbose() {
                            eprintln!("{now}: coordinator {idx} loses shard {shard}");
                        }
                        node.leases.remove(&shard);
                        node.inbox.push(Input::LeaseLost(shard));
                    }
                },
                None if node.leases.len() >= share
                    || node.releasing.iter().any(|(s, _)| *s == shard)
                    || node.released.iter().any(|(s, _)| *s == shard) => {}
                None => {
                    if let Some(revision) = self.nats.leases.acquire(shard, idx, now, LEASE_TTL) {
                        if verbose() {
                            eprintln!("{now}: coordinator {idx} acquires shard {shard}");
                        }
                        node.leases.insert(shard, revision);
                        node.inbox.push(Input::LeaseAcquired(shard));
                    }
                }
            }
        }
        // The surplus is handed over when another process can take it; the highest first.
        if node.leases.len() > share && wanting {
            let surplus = node.leases.len() - share;
            let give: Vec<u32> = node.leases.keys().rev().take(surplus).copied().collect();
            for shard in give {
                if let Some(revision) = node.leases.remove(&shard) {
                    node.releasing.push((shard, revision));
                }
            }
        }
    }

    /// One turn, carried out as the executor does, with a crash possible between any two steps.
    pub(crate) fn turn(&mut self, idx: usize) -> Result<(), String> {
        let now = self.now;
        let node = &mut self.nodes[idx];
        let mut inputs = std::mem::take(&mut node.inbox);
        if now >= node.last_tick + TICK {
            node.last_tick = now;
            inputs.push(Input::Tick);
        }
        self.turn_with(idx, inputs)
    }

    /// A turn of these inputs.
    fn turn_with(&mut self, idx: usize, inputs: Vec<Input>) -> Result<(), String> {
        let now = self.now;
        let node = &mut self.nodes[idx];
        let consumed: Vec<Token> = inputs
            .iter()
            .filter_map(|input| match input {
                Input::Results(deliveries) => Some(deliveries.iter().map(|d| d.token)),
                _ => None,
            })
            .flatten()
            .collect();
        let Some(turn) = node.turn.as_mut() else {
            return Ok(());
        };
        let writes = turn.turn(inputs, now);
        let Writes {
            replies,
            recover,
            scan,
            stop_consuming,
            forget: _,
            appends,
        } = writes;
        self.answer(idx, replies)?;
        for shard in stop_consuming {
            if verbose() {
                eprintln!("{now}: coordinator {idx} stops consuming shard {shard}");
            }
            self.nodes[idx].consuming.remove(&shard);
            if self.nats.results[shard as usize].1 == Some(idx) {
                self.nats.results[shard as usize].1 = None;
            }
        }
        for shard in recover {
            let input = self.recover_shard(shard);
            let delay = self.rng.between(1, 40);
            self.schedule(idx, delay, input);
        }
        for shard in scan {
            let prefix = format!("{shard}.");
            let ids = self
                .nats
                .index
                .iter()
                .filter_map(|key| key.strip_prefix(&prefix)?.parse().ok())
                .collect();
            let delay = self.rng.between(1, 20);
            self.schedule(idx, delay, Input::Indexed { shard, ids });
        }
        if self.bug == Some(Bug::AckBeforeAppend) {
            let acks = consumed
                .into_iter()
                .map(|token| (token, Ack::Ack))
                .collect();
            self.acknowledge(idx, acks);
        }
        if self.faults && self.rng.one_in(300) {
            // The process freezes between deciding and writing (a long GC pause): its leases
            // lapse, another coordinator takes the shards over and writes the logs, and then
            // this one wakes up and appends what it decided.
            let node = &mut self.nodes[idx];
            node.stalled_until = now + self.rng.between(LEASE_TTL, 3 * LEASE_TTL);
            node.suspended = Some(appends);
            if verbose() {
                eprintln!(
                    "{now}: coordinator {idx} freezes before its appends until {}",
                    node.stalled_until
                );
            }
            return Ok(());
        }
        self.finish_turn(idx, appends)
    }

    /// The second half of a turn: the appends, then what they allow.
    pub(crate) fn finish_turn(&mut self, idx: usize, appends: Vec<Append>) -> Result<(), String> {
        let now = self.now;
        let mut outcomes = Vec::new();
        for append in appends {
            if self.crash_here() {
                self.crash(idx);
                return Ok(());
            }
            if let Some(key) = &append.index_put {
                self.nats.index.insert(key.clone());
            } else if append.expected_stream_seq == 0 {
                RESERVED_STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let mut expected = append.expected_stream_seq;
            let mut outcome = None;
            for (first, payload) in append.messages {
                let msg_id = subjects::event_msg_id(append.id, first);
                match self
                    .nats
                    .events
                    .append(idx, append.id, msg_id, expected, payload.clone())
                {
                    Ok((stream_seq, duplicate)) => {
                        let ours = !duplicate
                            || self
                                .nats
                                .events
                                .get(stream_seq)
                                .is_some_and(|r| r.payload == payload);
                        if !ours {
                            FENCED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            outcome = Some(Appended::Fenced {
                                why: "message id used by another writer".to_owned(),
                            });
                            break;
                        }
                        expected = stream_seq;
                    }
                    Err(AppendError::WrongLastSequence { expected, last }) => {
                        FENCED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        outcome = Some(Appended::Fenced {
                            why: format!("expected {expected}, last {last}"),
                        });
                        break;
                    }
                }
            }
            outcomes.push((
                append.id,
                outcome.unwrap_or(Appended::Stored {
                    stream_seq: expected,
                }),
            ));
        }
        if self.crash_here() {
            self.crash(idx);
            return Ok(());
        }
        let Some(turn) = self.nodes[idx].turn.as_mut() else {
            return Ok(());
        };
        let effects = turn.appended(outcomes, now);
        self.carry_out(idx, effects)
    }

    /// Offers an assignment to the workers: taken by one with a free slot (its answer lost or
    /// not, the coordinator hears nothing it acts on), refused (to the queue, and the turn is
    /// told), or lost on the way (the turn's watch finds the attempt lost).
    fn offer(&mut self, idx: usize, assign: Assign) {
        let now = self.now;
        let roll = self.rng.between(0, 99);
        if roll < 10 {
            OFFERS_LOST.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        if roll >= 25
            && let Ok(assignment) = v1::TaskAssignment::decode(assign.payload.clone())
        {
            let first = self.rng.between(0, self.workers.len() as u64 - 1) as usize;
            let n = self.workers.len();
            for k in 0..n {
                let worker = &mut self.workers[(first + k) % n];
                if worker.take_offered(&mut self.nats, &mut self.rng, assignment.clone(), now) {
                    OFFERS_TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
            }
        }
        OFFERS_REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.nats
            .tasks
            .publish(Some(assign.msg_id), assign.payload, now, DUPLICATE_WINDOW);
        let delay = self.rng.between(1, 30);
        self.schedule(
            idx,
            delay,
            Input::OfferRefused {
                id: assign.execution,
                instance: assign.instance,
                attempt: assign.attempt,
            },
        );
    }

    pub(crate) fn carry_out(&mut self, idx: usize, effects: Effects) -> Result<(), String> {
        let now = self.now;
        let Effects {
            assignments,
            cancels,
            progress: _,
            breakers: _,
            observed: _,
            index_deletes,
            forget: _,
            acks,
            replies,
            checkpoints,
            handover,
            load,
            consume,
            fences,
            reserve,
            retired: _,
        } = effects;
        for message in assignments {
            if self.crash_here() {
                self.crash(idx);
                return Ok(());
            }
            match <[_; 1]>::try_from(message) {
                Ok([assign]) if assign.offer => self.offer(idx, assign),
                Ok([assign]) => {
                    self.nats.tasks.publish(
                        Some(assign.msg_id),
                        assign.payload,
                        now,
                        DUPLICATE_WINDOW,
                    );
                }
                // A batch has a message id of its own, new for each batch.
                Err(batch) => {
                    ASSIGNMENTS_BATCHED
                        .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    let entries = batch
                        .into_iter()
                        .map(|assign| v1::task_assignment_batch::Entry {
                            assignment: assign.payload.to_vec(),
                            msg_id: assign.msg_id,
                            traceparent: String::new(),
                        })
                        .collect();
                    let payload = trellis_proto::assignments::pack(entries);
                    self.nats.tasks.publish_batch(payload.into(), now);
                }
            }
        }
        for cancel in cancels {
            if let Ok(cancel) = v1::CancelTask::decode(cancel.payload) {
                for worker in &mut self.workers {
                    worker.cancel(&mut self.nats, &cancel);
                }
            }
        }
        for key in index_deletes {
            self.nats.index.remove(&key);
        }
        for (id, epoch) in fences {
            self.nats.fences.insert(id.to_string(), epoch);
            let delay = self.rng.between(1, 30);
            self.schedule(idx, delay, Input::Fenced { id, epoch });
        }
        if !reserve.is_empty() {
            let mut ids = Vec::with_capacity(reserve.len());
            for (key, id) in reserve {
                self.nats.index.insert(key);
                ids.push(id);
            }
            let delay = self.rng.between(1, 30);
            self.schedule(idx, delay, Input::Reserved(ids));
        }
        if self.crash_here() {
            self.crash(idx);
            return Ok(());
        }
        self.acknowledge(idx, acks);
        self.answer(idx, replies)?;
        for job in checkpoints {
            let (id, full, sequence) = (job.id, job.full, job.sequence);
            // The store is down now and then: the checkpoint is not taken.
            let result = if self.faults && self.rng.one_in(10) {
                Err("the checkpoint-store is down".to_owned())
            } else {
                self.store.create(job)
            };
            let delay = self.rng.between(1, 30);
            let input = Input::CheckpointDone {
                id,
                full,
                sequence,
                result,
            };
            self.schedule(idx, delay, input);
        }
        for id in load {
            let mut found = Recoveries::default();
            found.add(id, self.recover(id));
            let input = found.loaded();
            let delay = self.rng.between(1, 30);
            self.schedule(idx, delay, input);
        }
        for job in handover {
            // Stored before the lease is deleted; a store that is down only makes the next
            // owner's recovery longer.
            if !(self.faults && self.rng.one_in(10)) {
                let _ = self.store.create(job);
            }
        }
        for (shard, revision) in std::mem::take(&mut self.nodes[idx].released) {
            if verbose() {
                eprintln!("{now}: coordinator {idx} releases the lease of shard {shard}");
            }
            self.nats.leases.release(shard, revision);
            HANDOVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        for shard in consume {
            if verbose() {
                eprintln!("{now}: coordinator {idx} consumes shard {shard}");
            }
            self.nodes[idx].consuming.insert(shard);
            let (queue, consumer) = &mut self.nats.results[shard as usize];
            *consumer = Some(idx);
            queue.redeliver_all(now);
        }
        Ok(())
    }

    /// Draws whether the process crashes at this point of its turn.
    pub(crate) fn crash_here(&mut self) -> bool {
        self.faults && self.rng.one_in(400)
    }

    /// Reads a shard's unfinished executions from the index and rebuilds each from its log.
    pub(crate) fn recover_shard(&mut self, shard: u32) -> Input {
        let prefix = format!("{shard}.");
        let ids: Vec<ExecutionId> = self
            .nats
            .index
            .iter()
            .filter_map(|key| key.strip_prefix(&prefix)?.parse().ok())
            .collect();
        let mut found = Recoveries::default();
        for id in ids {
            found.add(id, self.recover(id));
        }
        found.shard_recovered(shard)
    }

    /// Rebuilds one execution from its log, as `recovery::recover` does.
    pub(crate) fn recover(&self, id: ExecutionId) -> Recovery {
        let log: Vec<LogMessage> = self
            .nats
            .events
            .log(id)
            .into_iter()
            .map(|record| LogMessage {
                stream_seq: record.stream_seq,
                first_seq: convert::first_sequence(&record.payload),
                payload: record.payload.clone(),
            })
            .collect();
        let (Some(first), Some(last)) = (log.first(), log.last()) else {
            return Recovery::Empty;
        };
        let last = last.stream_seq;
        let (started, plan) = match recovery::started_of(id, first) {
            Ok(started) => started,
            Err(err) => return Recovery::Broken(broken(err, None)),
        };
        let namespace = started.namespace().to_owned();
        // The newest checkpoint chain, as recovery restores it, then the log after it.
        let restored = self
            .store
            .chain(id)
            .and_then(|chain| checkpoints::restore_chain(id, &started, plan.clone(), &chain).ok());
        if restored.is_some() {
            RESTORED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let after = match &restored {
            Some(restored) if restored.stream_sequence > 0 => restored.stream_sequence,
            _ => 0,
        };
        let log = log.into_iter().filter(|m| m.stream_seq > after).collect();
        match recovery::replay(id, started, plan, restored, log, last) {
            Ok(recovered) => Recovery::Recovered(Box::new(recovered)),
            Err(err) => Recovery::Broken(broken(err, Some(&namespace))),
        }
    }
}

/// A log that does not replay, as a coordinator holds it (the simulation reads memory: no read
/// fails).
fn broken(err: recovery::RecoveryError, namespace: Option<&str>) -> Broken {
    match err.into_broken(namespace) {
        Ok(broken) => broken,
        Err(err) => panic!("the simulation's reads do not fail: {err}"),
    }
}
