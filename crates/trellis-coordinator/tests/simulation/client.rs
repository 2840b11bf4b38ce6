//! The simulated client: it starts the plans and answers open questions, through the coordinator
//! the lease bucket names or one that believes it owns the shard, and checks every answer it gets
//! against the log (a write is answered only once it is stored).

use trellis_coordinator::turn::{self, Action, Answer, Error, Input, ReplyTo, Request};
use trellis_core::ids::{ExecutionId, QuestionId};
use trellis_grpc::access::{Principal, Scope};
use trellis_proto::{subjects, v1};
use trellis_wire::log;

use crate::nats::Nats;
use crate::world::*;

impl World {
    /// Hands answers to the client.
    pub(crate) fn answer(
        &mut self,
        idx: usize,
        replies: Vec<(ReplyTo, Result<Answer, Error>)>,
    ) -> Result<(), String> {
        for (reply, answer) in replies {
            let Some(call) = self.nodes[idx].calls.remove(&reply) else {
                continue;
            };
            if verbose() {
                eprintln!(
                    "{}: coordinator {idx} answers {call:?}: {answer:?}",
                    self.now
                );
            }
            match (call, answer) {
                (Call::Start { plan }, Ok(Answer::Started { id, created })) => {
                    if self.nats.events.last_seq(id).is_none() {
                        return Err(format!(
                            "the start of {id} (created: {created}) was answered by coordinator \
                             {idx} before it was logged"
                        ));
                    }
                    self.plans[plan].2 = true;
                }
                (
                    Call::Start { plan },
                    Ok(Answer::Following {
                        id,
                        created,
                        observation,
                    }),
                ) => {
                    if self.nats.events.last_seq(id).is_none() {
                        return Err(format!(
                            "the followed start of {id} (created: {created}) was answered by \
                             coordinator {idx} before it was logged"
                        ));
                    }
                    check_followed(&self.nats, idx, observation)?;
                    self.plans[plan].2 = true;
                }
                (
                    Call::Start { plan },
                    Ok(Answer::Build {
                        id,
                        at_ms,
                        plan: prepared,
                    }),
                ) => {
                    // As the gRPC handler does: build the starting state for the id and time the
                    // turn gave, and start again; the node may lose the shard or crash meanwhile.
                    let mut prepared = prepared;
                    prepared.build(id, at_ms);
                    self.call(idx, Call::Start { plan }, start(plan, prepared));
                }
                (Call::Answer { id, question }, Ok(Answer::Answered { sequence, .. })) => {
                    if !logged_up_to(&self.nats, id, sequence) {
                        return Err(format!(
                            "the answer to {question} was acknowledged before it was logged"
                        ));
                    }
                }
                (Call::Workers { alive }, Ok(Answer::Workers(workers, _))) => {
                    for worker in alive {
                        let name = crate::worker::name(worker);
                        let listed = workers.iter().find(|w| w.worker_id == name);
                        let terminated = v1::WorkerState::Terminated as i32;
                        if listed.is_none_or(|w| w.state == terminated) {
                            return Err(format!(
                                "coordinator {idx} lists worker {name}, which heartbeats, as \
                                 {listed:?}"
                            ));
                        }
                    }
                }
                (call, _) => self.forget_call(call),
            }
        }
        Ok(())
    }

    /// The client: starts its plans and answers open questions, through the coordinator that
    /// owns the shard (or any that owns one, for a start).
    pub(crate) fn client_step(&mut self) {
        let now = self.now;
        for plan in 0..self.plans.len() {
            let (at, _, started) = &self.plans[plan];
            let in_flight = self.nodes.iter().any(|n| {
                n.calls
                    .values()
                    .any(|c| matches!(c, Call::Start { plan: p } if *p == plan))
            });
            if *started || *at > now || in_flight || !self.rng.percent(10) {
                continue;
            }
            let owners: Vec<usize> = (0..self.nodes.len())
                .filter(|idx| {
                    self.nodes[*idx].turn.is_some() && !self.nodes[*idx].leases.is_empty()
                })
                .collect();
            if owners.is_empty() {
                continue;
            }
            let node = owners[self.rng.index(owners.len())];
            let source = v1::start_execution_request::PlanSource::Spec(v1::PlanSpec {
                text: self.plans[plan].1.clone(),
                format: v1::PlanFormat::Json.into(),
                ..Default::default()
            });
            let prepared = turn::prepare(source, &trellis_core::plan::Limits::default())
                .expect("the simulation's plans compile");
            self.call(node, Call::Start { plan }, start(plan, Box::new(prepared)));
        }
        let open: Vec<(ExecutionId, QuestionId)> = self
            .checker
            .replicas
            .iter()
            .flat_map(|(id, replica)| {
                replica
                    .machine
                    .open_questions()
                    .into_iter()
                    .map(|q| (*id, q.question.id))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (id, question) in open {
            if self.answering.contains_key(&question) || !self.rng.percent(5) {
                continue;
            }
            let shard = subjects::shard_of(&id.to_string(), SHARDS);
            // The owner as the lease bucket says, or as a (maybe stale, maybe stalled) process
            // believes: a client may talk to either.
            let believers: Vec<usize> = (0..self.nodes.len())
                .filter(|idx| self.nodes[*idx].leases.contains_key(&shard))
                .collect();
            let owner = if !believers.is_empty() && self.rng.percent(50) {
                Some(believers[self.rng.index(believers.len())])
            } else {
                self.nats.leases.owner(shard, now)
            };
            let Some(owner) = owner else {
                continue;
            };
            if self.nodes[owner].turn.is_none() {
                continue;
            }
            self.answering.insert(question, true);
            let request = Request::On {
                id,
                scope: Scope::All,
                action: Action::Answer {
                    question,
                    answer: "yes".to_owned(),
                },
            };
            self.call(owner, Call::Answer { id, question }, request);
        }
    }

    pub(crate) fn call(&mut self, node: usize, call: Call, request: Request) {
        if verbose() {
            eprintln!("{}: the client asks coordinator {node}: {call:?}", self.now);
        }
        let node = &mut self.nodes[node];
        node.next_reply += 1;
        node.calls.insert(node.next_reply, call);
        node.inbox.push(Input::Request {
            reply: node.next_reply,
            request,
        });
    }
}

/// Checks what a followed start's observer begins with: every stored event of the execution
/// from its first, once (the older ones as the range to read from the log), or with
/// `progress_only` the progress now.
fn check_followed(nats: &Nats, idx: usize, observation: turn::Observation) -> Result<(), String> {
    let id = observation.execution;
    if observation.progress_only {
        return match observation.progress {
            Some(_) => Ok(()),
            None => Err(format!(
                "coordinator {idx} followed {id} for its progress without the progress"
            )),
        };
    }
    let last = nats
        .events
        .log(id)
        .last()
        .and_then(|record| log::decode_event_batch(&record.payload).ok())
        .map_or(0, |batch| {
            batch.first_sequence + batch.entries.len() as u64 - 1
        });
    let first = observation.backfill.map_or(1, |(_, until)| until + 1);
    let (from, batches) = observation.history.into_batches();
    let mut seen = Vec::new();
    for batch in batches {
        let batch = log::decode_event_batch(&batch)
            .map_err(|err| format!("coordinator {idx} followed {id} with a bad batch: {err}"))?;
        let sequences = batch.first_sequence..batch.first_sequence + batch.entries.len() as u64;
        seen.extend(sequences.filter(|sequence| *sequence >= from));
    }
    let expected: Vec<u64> = (first..=last).collect();
    if seen != expected {
        return Err(format!(
            "coordinator {idx} followed {id} from {seen:?}, not from the stored {expected:?}"
        ));
    }
    Ok(())
}

/// The start of plan `plan`, under the idempotency key of the plan; every other plan's start
/// is followed (`RunExecution`), every fourth for its progress alone.
fn start(plan: usize, prepared: Box<turn::Prepared>) -> Request {
    Request::Start {
        plan: prepared,
        options: v1::ExecutionOptions {
            idempotency_key: format!("plan-{plan}"),
            ..Default::default()
        },
        principal: Principal::anonymous(),
        traceparent: String::new(),
        follow: (plan % 2 == 1).then_some(turn::Follow {
            progress_only: plan % 4 == 3,
        }),
    }
}

/// True when the log of `id` holds sequence `sequence`.
fn logged_up_to(nats: &Nats, id: ExecutionId, sequence: u64) -> bool {
    nats.events.log(id).last().is_some_and(|record| {
        log::decode_event_batch(&record.payload)
            .is_ok_and(|batch| batch.first_sequence + batch.entries.len() as u64 > sequence)
    })
}
