//! Offering a fast-lane assignment to an idle worker of its queue before the tasks stream: a
//! core NATS request on `trellis.offer.<queue>` (queue group `workers`). A worker with a free
//! slot starts the attempt and answers `taken`; one without answers `busy`. Whatever is not
//! taken goes to the stream and the turn is told ([`Input::OfferRefused`]), which ends its watch
//! of the attempt; an offer not answered is left to that watch (the turn finds the attempt
//! lost if no heartbeat names it), since a `taken` lost on the way must not put a second copy in
//! the queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::{HeaderMap, RequestErrorKind};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use trellis_proto::subjects;

use super::append::store_until;
use super::{Executor, Inbound};
use crate::metrics::Metrics;
use crate::turn::{Assign, Input};

/// How long an offer waits for a worker's answer: a worker answers at once, so a longer
/// silence means the offer or its answer was lost.
pub(super) const OFFER_WAIT: Duration = Duration::from_millis(500);
/// How long a queue gets no offers after one found no worker listening (workers that do not
/// take offers, or none at all): its assignments go straight to the stream meanwhile.
pub(super) const OFFER_PAUSE: Duration = Duration::from_secs(5);

/// The queues whose offers found no worker listening, until when they get none.
#[derive(Debug, Default)]
pub(super) struct Paused(Mutex<HashMap<String, Instant>>);

impl Paused {
    /// Whether assignments of `queue` may be offered now.
    pub(super) fn open(&self, queue: &str) -> bool {
        let mut paused = self.lock();
        match paused.get(queue) {
            Some(until) if Instant::now() < *until => false,
            Some(_) => {
                paused.remove(queue);
                true
            }
            None => true,
        }
    }

    fn pause(&self, queue: &str) {
        self.lock()
            .insert(queue.to_owned(), Instant::now() + OFFER_PAUSE);
    }

    /// The map, whatever a panic elsewhere left in it (a pause more or less is harmless).
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One offered assignment on its way, with what it takes to send it to the stream instead.
pub(super) struct Offer {
    pub(super) queue: String,
    /// The stream subject it goes to when not taken (its lane's).
    pub(super) subject: String,
    pub(super) headers: HeaderMap,
    pub(super) payload: Bytes,
    pub(super) refused: Input,
}

impl Offer {
    pub(super) fn of(assign: &Assign, subject: String, headers: HeaderMap, payload: Bytes) -> Self {
        Offer {
            queue: assign.queue.clone(),
            subject,
            headers,
            payload,
            refused: Input::OfferRefused {
                id: assign.execution,
                instance: assign.instance,
                attempt: assign.attempt,
            },
        }
    }
}

impl Executor {
    /// Offers an assignment from a task of its own, or sends it to the stream at once while its
    /// queue's offers pause.
    pub(super) fn send_offer(&self, offer: Offer) {
        let stream = ToStream {
            js: self.js.clone(),
            tx: self.tx.clone(),
            shutdown: self.shutdown.clone(),
        };
        if self.paused_offers.open(&offer.queue) {
            tokio::spawn(ask(
                self.nats.clone(),
                self.paused_offers.clone(),
                self.metrics.clone(),
                stream,
                offer,
            ));
        } else {
            self.metrics.offer(&offer.queue, "paused");
            tokio::spawn(stream.send(offer));
        }
    }
}

/// Offers `offer` and settles it: taken, to the stream and refused, or left to the turn's watch.
async fn ask(
    nats: async_nats::Client,
    paused: Arc<Paused>,
    metrics: Metrics,
    stream: ToStream,
    offer: Offer,
) {
    let request = async_nats::Request::new()
        .headers(offer.headers.clone())
        .payload(offer.payload.clone())
        .timeout(Some(OFFER_WAIT));
    match nats
        .send_request(subjects::offer(&offer.queue), request)
        .await
    {
        Ok(reply) if reply.payload.as_ref() == subjects::OFFER_TAKEN => {
            metrics.offer(&offer.queue, "taken");
        }
        Ok(_) => {
            metrics.offer(&offer.queue, "busy");
            stream.send(offer).await;
        }
        Err(error) if error.kind() == RequestErrorKind::NoResponders => {
            metrics.offer(&offer.queue, "no_worker");
            paused.pause(&offer.queue);
            stream.send(offer).await;
        }
        Err(error) => {
            metrics.offer(&offer.queue, "unanswered");
            tracing::debug!(queue = %offer.queue, %error, "an offer was not answered; the turn watches its attempt");
        }
    }
}

/// What an assignment not taken needs to reach the stream and tell the turn.
struct ToStream {
    js: jetstream::Context,
    tx: mpsc::Sender<Inbound>,
    shutdown: CancellationToken,
}

impl ToStream {
    /// Publishes an assignment not taken to the stream until it is stored (its message id
    /// makes a repeat harmless), then tells the turn, whose watch of the attempt the queue now
    /// replaces.
    async fn send(self, offer: Offer) {
        let Offer {
            subject,
            headers,
            payload,
            refused,
            ..
        } = offer;
        store_until(&self.js, &self.shutdown, subject, headers, payload).await;
        if !self.shutdown.is_cancelled() {
            let _ = self.tx.send(Inbound::Input(refused)).await;
        }
    }
}
