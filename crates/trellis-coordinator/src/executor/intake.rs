//! What reaches the executor's loop becomes the turn's inputs: requests are numbered for their
//! answer, result messages taken in (from a results stream or handed off by a worker) are
//! unpacked into one delivery per result (a message marked a batch that does not decode is set
//! aside), and a turn holding requests beside many results is split so the requests go first
//! ([`requests_ahead`]).

use std::time::Duration;

use async_nats::{HeaderMap, jetstream};
use bytes::Bytes;
use trellis_proto::{results, subjects};
use trellis_telemetry::{hops, propagation};

use super::{Executor, Inbound, RESULTS_BEHIND_REQUESTS};
use crate::shards::LeaseEvent;
use crate::turn::{Delivery, Input};

impl Executor {
    /// Turns what reached the task into the turn's inputs, keeping what must be answered or
    /// acknowledged later.
    pub(super) fn take(&mut self, inbound: Inbound, inputs: &mut Vec<Input>) {
        match inbound {
            Inbound::Request { request, reply } => {
                hops::mark("coordinator.request");
                self.next_reply += 1;
                self.replies.insert(self.next_reply, reply);
                inputs.push(Input::Request {
                    reply: self.next_reply,
                    request,
                });
            }
            Inbound::Results(messages) => {
                let mut deliveries = Vec::with_capacity(messages.len());
                for message in messages {
                    self.deliver(message, &mut deliveries);
                }
                hops::mark_any(
                    "coordinator.taken",
                    deliveries
                        .iter()
                        .filter_map(|delivery| result_execution(&delivery.payload)),
                );
                inputs.push(Input::Results(deliveries));
            }
            Inbound::Heartbeat(payload) => inputs.push(Input::Heartbeat(payload)),
            Inbound::Lease(LeaseEvent::Acquired(shard)) => inputs.push(Input::LeaseAcquired(shard)),
            Inbound::Lease(LeaseEvent::Lost(shard)) => inputs.push(Input::LeaseLost(shard)),
            Inbound::Release { shard, done } => self.releases.push((shard, done)),
            Inbound::Input(input) => inputs.push(input),
        }
    }

    /// Takes one consumed result message: a result alone, or a batch of them, each a delivery of
    /// its own. A message marked a batch that does not decode can never be applied: it is logged
    /// and terminated.
    fn deliver(&mut self, message: Taken, deliveries: &mut Vec<Delivery>) {
        if batch_len(&message).is_none() {
            let span = result_span(|| propagation::extract_nats(message.headers()));
            let payload = message.payload().clone();
            let token = self.consumed.take(message, 1).start;
            deliveries.push(Delivery {
                token,
                payload,
                span,
            });
            return;
        }
        let entries = match results::unpack_batch(message.payload()) {
            Ok(entries) if !entries.is_empty() => entries,
            Ok(_) => return self.terminate(message, "a result batch with no results".to_owned()),
            Err(error) => {
                return self.terminate(message, format!("not a TaskResultBatch: {error}"));
            }
        };
        let tokens = self.consumed.take(message, entries.len());
        for (token, entry) in tokens.zip(entries) {
            let span = result_span(|| propagation::from_traceparent(&entry.traceparent));
            deliveries.push(Delivery {
                token,
                payload: Bytes::from(entry.result),
                span,
            });
        }
    }

    /// Sets aside a result message that can never be applied: JetStream will not deliver it
    /// again, and a worker that handed it off is told the coordinator is done with it.
    fn terminate(&self, message: Taken, why: String) {
        tracing::warn!(subject = %message.subject(), %why, "result message set aside");
        let nats = self.nats.clone();
        tokio::spawn(async move {
            match message {
                Taken::Stream(message) => {
                    let _ = message.ack_with(jetstream::AckKind::Term).await;
                }
                Taken::Handoff(message) => reply(&nats, &message, subjects::HANDOFF_DONE).await,
            }
        });
    }
}

/// A message of results taken in: from a shard's results stream (acknowledged to JetStream), or
/// handed off by a worker over core NATS (answered: [`subjects::HANDOFF_DONE`] once its results'
/// events are stored, [`subjects::HANDOFF_PUBLISH`] to have the worker publish it to the stream
/// instead).
// Each lives only until its results are settled; boxing the stream's message would allocate per
// message taken.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Taken {
    Stream(jetstream::Message),
    Handoff(async_nats::Message),
}

impl Taken {
    fn headers(&self) -> Option<&HeaderMap> {
        match self {
            Taken::Stream(message) => message.headers.as_ref(),
            Taken::Handoff(message) => message.headers.as_ref(),
        }
    }

    fn payload(&self) -> &Bytes {
        match self {
            Taken::Stream(message) => &message.payload,
            Taken::Handoff(message) => &message.payload,
        }
    }

    fn subject(&self) -> &str {
        match self {
            Taken::Stream(message) => &message.subject,
            Taken::Handoff(message) => &message.subject,
        }
    }

    /// Acknowledges the message as the turn settled its results: done with, or to be delivered
    /// again after `later` (a hand-off goes to the stream at once, whose consumer waits).
    pub(super) async fn settle(&self, nats: &async_nats::Client, later: Option<Duration>) {
        match (self, later) {
            (Taken::Stream(message), None) => {
                let _ = message.ack().await;
            }
            (Taken::Stream(message), Some(delay)) => {
                let _ = message.ack_with(jetstream::AckKind::Nak(Some(delay))).await;
            }
            (Taken::Handoff(message), None) => {
                reply(nats, message, subjects::HANDOFF_DONE).await;
            }
            (Taken::Handoff(message), Some(_)) => {
                reply(nats, message, subjects::HANDOFF_PUBLISH).await;
            }
        }
    }
}

/// Answers a hand-off. A reply that is lost leaves the worker waiting until it publishes the
/// results to the stream, where they are duplicates of what is stored.
async fn reply(nats: &async_nats::Client, message: &async_nats::Message, answer: &'static [u8]) {
    let Some(reply) = message.reply.clone() else {
        return;
    };
    if let Err(error) = nats.publish(reply, Bytes::from_static(answer)).await {
        tracing::debug!(%error, "cannot answer a result hand-off; the worker publishes it");
    }
}

/// Splits a turn's inputs in two when they hold requests and more than
/// [`RESULTS_BEHIND_REQUESTS`] results: `Err((ahead, results))`, everything but the results to
/// decide first, then the results; else `Ok(inputs)`, one turn as they are.
///
/// Under load a turn of a few thousand results takes milliseconds to decide and append; a
/// caller's start, cancel or query that came in meanwhile then waits for the turn in progress
/// only, not for the next one's results as well. Any order of inputs from different sources is
/// one the loop could have taken them in, and the results keep theirs.
pub(super) fn requests_ahead(inputs: Vec<Input>) -> Result<Vec<Input>, (Vec<Input>, Vec<Input>)> {
    let mut requests = false;
    let mut results = 0;
    for input in &inputs {
        match input {
            Input::Request { .. } => requests = true,
            Input::Results(deliveries) => results += deliveries.len(),
            _ => {}
        }
    }
    if !requests || results <= RESULTS_BEHIND_REQUESTS {
        return Ok(inputs);
    }
    Err(inputs
        .into_iter()
        .partition(|input| !matches!(input, Input::Results(_))))
}

/// The span a result is applied in: a child of the worker's run, so dispatch → run → result is
/// one line of the trace. `Span::none()` when traces are not exported.
fn result_span(parent: impl FnOnce() -> propagation::Context) -> tracing::Span {
    if !propagation::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "task.result",
        otel.kind = "consumer",
        execution_id = tracing::field::Empty,
        task_instance_id = tracing::field::Empty,
        attempt = tracing::field::Empty,
    );
    propagation::set_parent(&span, parent());
    span
}

/// How many results a message carries when it is a batch (its batch header; 1 when the value is
/// no number: decoding it tells); `None` for a result alone.
pub(super) fn batch_len(message: &Taken) -> Option<usize> {
    let value = message.headers()?.get(subjects::RESULT_BATCH_HEADER)?;
    Some(value.as_str().parse::<usize>().map_or(1, |n| n.max(1)))
}

/// The execution a result's payload names, as the bits a trace's marks take (read only while a
/// trace watches an execution).
fn result_execution(result: &[u8]) -> Option<u128> {
    hops::id_bits(results::execution_id(result)?)
}

/// The executions of a consumed result message's results, as [`result_execution`].
pub(super) fn message_executions(message: &Taken) -> Vec<u128> {
    if batch_len(message).is_none() {
        return result_execution(message.payload()).into_iter().collect();
    }
    results::unpack_batch(message.payload())
        .unwrap_or_default()
        .iter()
        .filter_map(|entry| result_execution(&entry.result))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::{ReplyTo, Request};

    fn results(first: u64, n: u64) -> Input {
        Input::Results(
            (first..first + n)
                .map(|token| Delivery {
                    token,
                    payload: Bytes::new(),
                    span: tracing::Span::none(),
                })
                .collect(),
        )
    }

    fn request(reply: ReplyTo) -> Input {
        Input::Request {
            reply,
            request: Request::Workers {
                queue: String::new(),
                include_terminated: false,
            },
        }
    }

    /// What each turn holds, in order: a request by its reply, results by their tokens.
    fn shape(inputs: &[Input]) -> Vec<String> {
        inputs
            .iter()
            .map(|input| match input {
                Input::Request { reply, .. } => format!("request {reply}"),
                Input::Results(deliveries) => format!(
                    "results {}..{}",
                    deliveries[0].token,
                    deliveries[deliveries.len() - 1].token + 1
                ),
                Input::Tick => "tick".to_owned(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn requests_go_ahead_of_many_results_which_keep_their_order() {
        let inputs = vec![
            results(0, 40),
            request(1),
            results(40, 40),
            Input::Tick,
            request(2),
        ];
        let Err((ahead, behind)) = requests_ahead(inputs) else {
            panic!("80 results behind two requests were not split off");
        };
        assert_eq!(shape(&ahead), ["request 1", "tick", "request 2"]);
        assert_eq!(shape(&behind), ["results 0..40", "results 40..80"]);
    }

    #[test]
    fn a_turn_stays_whole_without_requests_or_with_few_results() {
        let few = vec![results(0, RESULTS_BEHIND_REQUESTS as u64), request(1)];
        let Ok(few) = requests_ahead(few) else {
            panic!("a turn of few results was split");
        };
        assert_eq!(shape(&few), ["results 0..64", "request 1"]);
        let no_requests = vec![results(0, 500), Input::Tick];
        let Ok(no_requests) = requests_ahead(no_requests) else {
            panic!("a turn without requests was split");
        };
        assert_eq!(shape(&no_requests), ["results 0..500", "tick"]);
    }
}
