//! A simulated coordinator's intake of worker results: messages from the shards' results
//! streams and workers' hand-offs, taken into the turn as deliveries and acknowledged (or
//! answered) as the executor does once the turn settles them.

use bytes::Bytes;
use prost::Message as _;
use trellis_coordinator::turn::{Ack, Delivery, Input, Token};
use trellis_proto::{results, v1};

use crate::nats::Handed;
use crate::world::*;

impl World {
    /// Delivers the results of the shards this process consumes, in any order, some twice.
    pub(crate) fn take_results(&mut self, idx: usize) {
        let now = self.now;
        let mut deliveries = Vec::new();
        for shard in self.nodes[idx].consuming.clone() {
            let shard = shard as usize;
            if self.nats.results[shard].1 != Some(idx) {
                if self.rng.percent(20) {
                    let (queue, consumer) = &mut self.nats.results[shard];
                    *consumer = Some(idx);
                    queue.redeliver_all(now);
                    if verbose() {
                        eprintln!(
                            "{now}: coordinator {idx} re-creates the consumer of shard {shard}"
                        );
                    }
                }
                continue;
            }
            let queue = &mut self.nats.results[shard].0;
            for seq in queue.available(now) {
                if self.rng.percent(20) {
                    continue; // delayed
                }
                let batch = queue
                    .messages
                    .get(&seq)
                    .is_some_and(|message| message.batch);
                let Some((payload, _)) = queue.take(seq, idx, now + RESULT_ACK_WAIT) else {
                    continue;
                };
                let payloads = unpacked(batch, &payload, format_args!("result {shard}/{seq}"));
                let node = &mut self.nodes[idx];
                let tokens = node
                    .consumed
                    .take(Taken::Stream(shard, seq), payloads.len());
                if verbose() {
                    eprintln!(
                        "{now}: coordinator {idx} takes result {shard}/{seq} as tokens {tokens:?}"
                    );
                }
                for (token, payload) in tokens.zip(payloads) {
                    deliveries.push(Delivery {
                        token,
                        payload,
                        span: tracing::Span::none(),
                    });
                }
            }
        }
        self.take_handoffs(idx, &mut deliveries);
        if !deliveries.is_empty() {
            shuffle(&mut self.rng, &mut deliveries);
            self.nodes[idx].inbox.push(Input::Results(deliveries));
        }
    }

    /// Takes the hand-offs for the shards this process hears (those it consumes: the real one
    /// subscribes beside its consumer), each by one process only.
    fn take_handoffs(&mut self, idx: usize, deliveries: &mut Vec<Delivery>) {
        let now = self.now;
        let sent: Vec<u64> = self
            .nats
            .handoffs
            .iter()
            .filter(|(_, handoff)| {
                handoff.state == Handed::Sent
                    && self.nodes[idx].consuming.contains(&(handoff.shard as u32))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in sent {
            if self.rng.percent(20) {
                continue; // delayed
            }
            let Some(handoff) = self.nats.handoffs.get_mut(&id) else {
                continue;
            };
            handoff.state = Handed::Taken(idx);
            let payloads = unpacked(
                handoff.batch,
                &handoff.payload,
                format_args!("hand-off {id}"),
            );
            let tokens = self.nodes[idx]
                .consumed
                .take(Taken::Handoff(id), payloads.len());
            if verbose() {
                eprintln!("{now}: coordinator {idx} takes hand-off {id} as tokens {tokens:?}");
            }
            for (token, payload) in tokens.zip(payloads) {
                deliveries.push(Delivery {
                    token,
                    payload,
                    span: tracing::Span::none(),
                });
            }
        }
    }

    pub(crate) fn acknowledge(&mut self, idx: usize, acks: Vec<(Token, Ack)>) {
        let now = self.now;
        for (taken, ack) in self.nodes[idx].consumed.settle(acks) {
            if verbose() {
                eprintln!("{now}: coordinator {idx} {ack:?} result {taken:?}");
            }
            let ended = match taken {
                Taken::Stream(shard, seq) => {
                    let queue = &mut self.nats.results[shard].0;
                    match ack {
                        Ack::Ack => {
                            let ended = queue
                                .messages
                                .get(&seq)
                                .map(|message| ended_attempts(message.batch, &message.payload))
                                .unwrap_or_default();
                            if queue.ack(seq, idx) {
                                ended
                            } else {
                                Vec::new()
                            }
                        }
                        Ack::Later => {
                            queue.nak(seq, idx, now + 20);
                            Vec::new()
                        }
                        Ack::Hold => {
                            queue.nak(seq, idx, now + 30_000);
                            Vec::new()
                        }
                    }
                }
                Taken::Handoff(id) => {
                    // A process that crashed since it took the hand-off answers nothing.
                    let Some(handoff) = self
                        .nats
                        .handoffs
                        .get_mut(&id)
                        .filter(|handoff| handoff.state == Handed::Taken(idx))
                    else {
                        continue;
                    };
                    if ack == Ack::Ack {
                        handoff.state = Handed::Done;
                        ended_attempts(handoff.batch, &handoff.payload)
                    } else {
                        handoff.state = Handed::Publish;
                        Vec::new()
                    }
                }
            };
            for result in ended {
                self.nats
                    .acked_results
                    .entry((result.task_instance_id, result.attempt))
                    .or_insert(now);
            }
        }
    }
}

/// The results a message carries, taken apart as the executor does; one that does not decode is
/// a bug of the simulated worker.
fn unpacked(batch: bool, payload: &Bytes, what: std::fmt::Arguments<'_>) -> Vec<Bytes> {
    match results::unpack(batch, payload, "", "") {
        Ok(entries) => entries
            .into_iter()
            .map(|entry| Bytes::from(entry.result))
            .collect(),
        Err(error) => panic!("{what} does not decode: {error}"),
    }
}

/// The results of a message that end their attempts (not starts or step checkpoints).
fn ended_attempts(batch: bool, payload: &Bytes) -> Vec<v1::TaskResult> {
    results::unpack(batch, payload, "", "")
        .unwrap_or_default()
        .into_iter()
        .filter_map(|entry| v1::TaskResult::decode(entry.result.as_slice()).ok())
        .filter(|result| {
            !matches!(
                result.outcome,
                None | Some(v1::task_result::Outcome::Started(_))
                    | Some(v1::task_result::Outcome::StepCheckpoint(_))
            )
        })
        .collect()
}
