//! Result messages taken from the shards' consumers and not yet acknowledged (kept by the
//! executor and the simulation alike; pure bookkeeping). A message carries one result, or a batch
//! of them (`TaskResultBatch`); the turn settles each result by its own
//! token, and the message is acknowledged once every result in it is settled, with the longest
//! wait any of them asked for (a result handed back brings its batch back, whose other results
//! are then duplicates the turn acknowledges at once).

use std::collections::HashMap;

use super::{Ack, Token};

/// The messages in flight, by the tokens of their results.
#[derive(Debug)]
pub struct Consumed<M> {
    tokens: HashMap<Token, u64>,
    messages: HashMap<u64, Pending<M>>,
    next_token: Token,
}

#[derive(Debug)]
struct Pending<M> {
    message: M,
    /// Its results the turn has not settled yet.
    unsettled: usize,
    /// The longest wait a settled result asked for.
    ack: Ack,
}

impl<M> Default for Consumed<M> {
    fn default() -> Self {
        Consumed {
            tokens: HashMap::new(),
            messages: HashMap::new(),
            next_token: 0,
        }
    }
}

impl<M> Consumed<M> {
    /// Keeps `message`, which carries `n` results (at least one), and returns their tokens (one
    /// run of consecutive numbers, none ever given before).
    pub fn take(&mut self, message: M, n: usize) -> std::ops::Range<Token> {
        let n = n.max(1);
        let first = self.next_token + 1;
        let tokens = first..first + n as Token;
        self.next_token += n as Token;
        for token in tokens.clone() {
            self.tokens.insert(token, first);
        }
        self.messages.insert(
            first,
            Pending {
                message,
                unsettled: n,
                ack: Ack::Ack,
            },
        );
        tokens
    }

    /// Settles results by token (tokens not kept here are passed by) and returns the messages
    /// now settled in full, each with the longest wait any of its results asked for.
    pub fn settle(&mut self, acks: Vec<(Token, Ack)>) -> Vec<(M, Ack)> {
        let mut done = Vec::new();
        for (token, ack) in acks {
            let Some(key) = self.tokens.remove(&token) else {
                continue;
            };
            let Some(pending) = self.messages.get_mut(&key) else {
                continue;
            };
            pending.ack = pending.ack.max(ack);
            pending.unsettled = pending.unsettled.saturating_sub(1);
            if pending.unsettled == 0
                && let Some(pending) = self.messages.remove(&key)
            {
                done.push((pending.message, pending.ack));
            }
        }
        done
    }

    /// How many messages wait for their results to be settled.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// True when no message waits.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_result_s_message_is_acknowledged_as_the_turn_says() {
        let mut consumed = Consumed::default();
        let a = consumed.take("a", 1);
        let b = consumed.take("b", 1);
        let done = consumed.settle(vec![(b.start, Ack::Later), (a.start, Ack::Ack)]);
        assert_eq!(done, [("b", Ack::Later), ("a", Ack::Ack)]);
        assert_eq!(consumed.len(), 0);
    }

    #[test]
    fn a_batch_waits_for_every_result_and_takes_the_longest_wait() {
        let mut consumed = Consumed::default();
        let batch: Vec<Token> = consumed.take("batch", 3).collect();
        assert_eq!(batch.len(), 3);
        assert!(
            consumed
                .settle(vec![(batch[0], Ack::Ack), (batch[2], Ack::Hold)])
                .is_empty()
        );
        assert_eq!(consumed.len(), 1);
        let done = consumed.settle(vec![(batch[1], Ack::Later)]);
        assert_eq!(done, [("batch", Ack::Hold)]);
        assert_eq!(consumed.len(), 0);
    }

    #[test]
    fn unknown_and_repeated_tokens_change_nothing() {
        let mut consumed = Consumed::default();
        let batch: Vec<Token> = consumed.take("batch", 2).collect();
        assert!(consumed.settle(vec![(batch[0], Ack::Ack)]).is_empty());
        assert!(
            consumed
                .settle(vec![(batch[0], Ack::Ack), (999, Ack::Ack)])
                .is_empty()
        );
        assert_eq!(
            consumed.settle(vec![(batch[1], Ack::Ack)]),
            [("batch", Ack::Ack)]
        );
    }

    #[test]
    fn tokens_are_never_reused() {
        let mut consumed = Consumed::default();
        let first = consumed.take("a", 2);
        let second = consumed.take("b", 2);
        assert!(first.clone().all(|token| !second.contains(&token)));
    }
}
