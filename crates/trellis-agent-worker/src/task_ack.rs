//! Acknowledging task messages, alone or shared: an assignment that came alone settles its
//! message; the entries of a `TaskAssignmentBatch` each hold a share of theirs, and the message is
//! settled once, when its last entry is, with the strongest wish any entry had: handed back if
//! one was, else acknowledged (terminated only when every entry was set aside).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::message::Acker;

use crate::sdk::lock;

/// How an assignment's part of a task message ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Its result is stored.
    Done,
    /// It was set aside for good (not an assignment, refused, never publishable).
    SetAside,
    /// It is handed back for another delivery, after this delay (`None`: at once).
    Again(Option<Duration>),
}

impl Settle {
    fn kind(self) -> AckKind {
        match self {
            Settle::Done => AckKind::Ack,
            Settle::SetAside => AckKind::Term,
            Settle::Again(delay) => AckKind::Nak(delay),
        }
    }
}

/// What the entries of one batch message settled so far.
#[derive(Debug)]
struct Shares {
    /// Entries not settled yet.
    left: usize,
    /// What the message gets so far: `SetAside` until an entry is done, `Again` from the first
    /// handed back on (the shortest delay wins).
    so_far: Settle,
}

impl Shares {
    fn new(n: usize) -> Self {
        Self {
            left: n,
            so_far: Settle::SetAside,
        }
    }

    /// Settles one entry; returns how the message is settled once it was the last.
    fn settle(&mut self, how: Settle) -> Option<Settle> {
        self.so_far = match (self.so_far, how) {
            (Settle::Again(a), Settle::Again(b)) => Settle::Again(a.min(b)),
            (Settle::Again(delay), _) | (_, Settle::Again(delay)) => Settle::Again(delay),
            (Settle::Done, _) | (_, Settle::Done) => Settle::Done,
            (Settle::SetAside, Settle::SetAside) => Settle::SetAside,
        };
        self.left = self.left.saturating_sub(1);
        (self.left == 0).then_some(self.so_far)
    }
}

/// One assignment's hold on its task message. Settling consumes it; one dropped unsettled (the
/// worker abandoned) leaves the message to be delivered again after the ack wait.
pub(crate) struct TaskAck {
    /// `None` for an assignment taken from an offer, which came in no task message.
    acker: Option<Arc<Acker>>,
    /// `None` for an assignment alone in its message.
    shares: Option<Arc<Mutex<Shares>>>,
}

impl TaskAck {
    /// The hold of an assignment alone in its message.
    pub(crate) fn alone(acker: Acker) -> Self {
        Self {
            acker: Some(Arc::new(acker)),
            shares: None,
        }
    }

    /// The hold of an assignment taken from an offer: there is no message to settle, and
    /// settling it does nothing (the coordinator watches the attempt through heartbeats).
    pub(crate) fn offered() -> Self {
        Self {
            acker: None,
            shares: None,
        }
    }

    /// The holds of the `n` entries of a batch message.
    pub(crate) fn shared(acker: Acker, n: usize) -> Vec<Self> {
        let acker = Arc::new(acker);
        let shares = Arc::new(Mutex::new(Shares::new(n)));
        (0..n)
            .map(|_| Self {
                acker: Some(acker.clone()),
                shares: Some(shares.clone()),
            })
            .collect()
    }

    /// Whether the assignment came alone (only such a message may be handed back for it alone).
    pub(crate) fn is_alone(&self) -> bool {
        self.shares.is_none()
    }

    /// Settles this assignment's part; the message is acknowledged, terminated or handed back
    /// when this was its last. Fails only when a message settled here could not be.
    pub(crate) async fn settle(self, how: Settle) -> Result<(), async_nats::Error> {
        let whole = match &self.shares {
            None => Some(how),
            Some(shares) => lock(shares).settle(how),
        };
        match (whole, &self.acker) {
            (Some(how), Some(acker)) => acker.ack_with(how.kind()).await,
            _ => Ok(()),
        }
    }

    /// Keeps the message ours for another ack wait (`AckProgress`).
    pub(crate) async fn progress(&self) {
        if let Some(acker) = &self.acker {
            let _ = acker.ack_with(AckKind::Progress).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settled(hows: &[Settle]) -> Vec<Option<Settle>> {
        let mut shares = Shares::new(hows.len());
        hows.iter().map(|how| shares.settle(*how)).collect()
    }

    #[test]
    fn a_batch_is_settled_once_by_its_last_entry() {
        assert_eq!(
            settled(&[Settle::Done, Settle::Done, Settle::Done]),
            [None, None, Some(Settle::Done)]
        );
    }

    #[test]
    fn one_entry_handed_back_hands_the_message_back_with_the_shortest_delay() {
        let later = Settle::Again(Some(Duration::from_secs(1)));
        assert_eq!(
            settled(&[Settle::Done, later, Settle::SetAside]),
            [None, None, Some(later)]
        );
        assert_eq!(
            settled(&[later, Settle::Again(None), Settle::Done]),
            [None, None, Some(Settle::Again(None))]
        );
    }

    #[test]
    fn a_batch_is_terminated_only_when_every_entry_was_set_aside() {
        assert_eq!(
            settled(&[Settle::SetAside, Settle::Done]),
            [None, Some(Settle::Done)]
        );
        assert_eq!(
            settled(&[Settle::SetAside, Settle::SetAside]),
            [None, Some(Settle::SetAside)]
        );
    }
}
