//! What reaches the executor's loop becomes the turn's inputs: requests are numbered for their
//! answer, result messages taken in (from a results stream or handed off by a worker) are
//! unpacked into one delivery per result (a message marked a batch that does not decode is set
//! aside), and a turn holding requests or small executions' results beside many results is split
//! so those go first ([`ahead_of_results`]).

use std::time::Duration;

use async_nats::{HeaderMap, jetstream};
use bytes::Bytes;
use trellis_proto::{results, subjects};
use trellis_telemetry::{hops, propagation};

use super::{Executor, Inbound, RESULTS_BEHIND_REQUESTS};
use crate::shards::LeaseEvent;
use crate::turn::{Delivery, FAST_LANE_SHARE, Input};
use trellis_core::ids::ExecutionId;

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

    /// Whether a result's execution is small: held here with at most [`FAST_LANE_SHARE`] tasks in
    /// flight, the executions whose tasks ride the fast lane. An execution not held here is not.
    pub(super) fn small_execution(&self, result: &[u8]) -> bool {
        results::execution_id(result)
            .and_then(|id| id.parse::<ExecutionId>().ok())
            .and_then(|id| self.coordinator.execution(id))
            .is_some_and(|execution| execution.running() <= FAST_LANE_SHARE)
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

/// Splits a turn's inputs in two when more than [`RESULTS_BEHIND_REQUESTS`] results would
/// otherwise hold up something that should not wait for them: `Err((ahead, behind))`, the
/// requests, the other inputs and the results of small executions (those `small` says of a
/// result's payload) to decide first, then the rest of the results; else `Ok(inputs)`, one turn.
///
/// Under load a turn of a few thousand results takes milliseconds to decide and append, and its
/// effects (the next tasks of a large execution, encoded and sent) go out before its observers
/// hear: a caller's start, cancel or query that came in meanwhile, or the result of a
/// one-task execution, then waits for the turn in progress only, not for the next one's large
/// execution as well. Any order of inputs from different sources is one the loop could have
/// taken them in; `small` answers alike for every result of an execution, so an execution's
/// results keep their order.
pub(super) fn ahead_of_results(
    inputs: Vec<Input>,
    mut small: impl FnMut(&[u8]) -> bool,
) -> Result<Vec<Input>, (Vec<Input>, Vec<Input>)> {
    let deliveries = || {
        inputs.iter().flat_map(|input| match input {
            Input::Results(deliveries) => deliveries.as_slice(),
            _ => &[],
        })
    };
    if deliveries().count() <= RESULTS_BEHIND_REQUESTS {
        return Ok(inputs);
    }
    let requests = inputs
        .iter()
        .any(|input| matches!(input, Input::Request { .. }));
    // Asked once per result, in the order the split below walks them (so it never runs out).
    let smalls: Vec<bool> = deliveries()
        .map(|delivery| small(&delivery.payload))
        .collect();
    let behind = smalls.iter().filter(|small| !**small).count();
    if !(requests || behind < smalls.len()) || behind <= RESULTS_BEHIND_REQUESTS {
        return Ok(inputs);
    }
    let mut smalls = smalls.into_iter();
    let (mut ahead, mut behind) = (Vec::new(), Vec::new());
    for input in inputs {
        let Input::Results(deliveries) = input else {
            ahead.push(input);
            continue;
        };
        let (first, rest): (Vec<Delivery>, Vec<Delivery>) = deliveries
            .into_iter()
            .partition(|_| smalls.next().unwrap_or(false));
        if !first.is_empty() {
            ahead.push(Input::Results(first));
        }
        if !rest.is_empty() {
            behind.push(Input::Results(rest));
        }
    }
    Err((ahead, behind))
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
    use crate::turn::{ReplyTo, Request, Token};

    fn results(first: u64, n: u64) -> Input {
        Input::Results(
            (first..first + n)
                .map(|token| delivery(token, false))
                .collect(),
        )
    }

    /// A result whose payload [`is_small`] says is a small execution's, or not.
    fn delivery(token: Token, small: bool) -> Delivery {
        Delivery {
            token,
            payload: Bytes::from_static(if small { b"small" } else { b"large" }),
            span: tracing::Span::none(),
        }
    }

    fn is_small(payload: &[u8]) -> bool {
        payload == b"small"
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
                Input::Results(deliveries) => {
                    let (first, last) =
                        (deliveries[0].token, deliveries[deliveries.len() - 1].token);
                    if last - first + 1 == deliveries.len() as u64 {
                        format!("results {first}..{}", last + 1)
                    } else {
                        let tokens: Vec<String> =
                            deliveries.iter().map(|d| d.token.to_string()).collect();
                        format!("results {}", tokens.join(" "))
                    }
                }
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
        let Err((ahead, behind)) = ahead_of_results(inputs, |_| false) else {
            panic!("80 results behind two requests were not split off");
        };
        assert_eq!(shape(&ahead), ["request 1", "tick", "request 2"]);
        assert_eq!(shape(&behind), ["results 0..40", "results 40..80"]);
    }

    #[test]
    fn a_turn_stays_whole_without_requests_or_with_few_results() {
        let few = vec![results(0, RESULTS_BEHIND_REQUESTS as u64), request(1)];
        let Ok(few) = ahead_of_results(few, |_| false) else {
            panic!("a turn of few results was split");
        };
        assert_eq!(shape(&few), ["results 0..64", "request 1"]);
        let no_requests = vec![results(0, 500), Input::Tick];
        let Ok(no_requests) = ahead_of_results(no_requests, |_| false) else {
            panic!("a turn without requests was split");
        };
        assert_eq!(shape(&no_requests), ["results 0..500", "tick"]);
    }

    /// A one-task execution's result waits for neither the large execution's results that
    /// came before it nor their effects; each execution's results keep their order.
    #[test]
    fn small_executions_results_go_ahead_of_many_others() {
        let inputs = vec![
            results(0, 40),
            Input::Results(vec![delivery(40, true)]),
            // One message may carry both kinds (a worker's batch).
            Input::Results(
                (41..100)
                    .map(|token| delivery(token, token == 50 || token == 70))
                    .collect(),
            ),
            Input::Tick,
        ];
        let Err((ahead, behind)) = ahead_of_results(inputs, is_small) else {
            panic!("a small execution's results behind 96 others were not split off");
        };
        assert_eq!(shape(&ahead), ["results 40..41", "results 50 70", "tick"]);
        let rest: Vec<String> = (41..100)
            .filter(|token| *token != 50 && *token != 70)
            .map(|token| token.to_string())
            .collect();
        assert_eq!(
            shape(&behind),
            [
                "results 0..40".to_owned(),
                format!("results {}", rest.join(" "))
            ]
        );
    }

    /// A turn of its own costs an append round trip: taken only to pass more results than
    /// RESULTS_BEHIND_REQUESTS, and the turn left as it came otherwise.
    #[test]
    fn small_results_beside_few_others_share_their_turn() {
        let mut inputs = vec![results(0, RESULTS_BEHIND_REQUESTS as u64)];
        inputs.push(Input::Results(
            (64..70).map(|token| delivery(token, true)).collect(),
        ));
        inputs.push(Input::Tick);
        let Ok(inputs) = ahead_of_results(inputs, is_small) else {
            panic!("small results beside 64 others were split off");
        };
        assert_eq!(shape(&inputs), ["results 0..64", "results 64..70", "tick"]);
    }
}
