//! Circuit breakers, one per worker queue and task type (seed 003 §7): after `failures`
//! consecutive failed attempts of a type the breaker *opens* and new dispatches of that type wait
//! (they are held, not failed); after `cooldown` it *half-opens* and lets one attempt through as
//! a probe; the probe's success closes it, its failure opens it again for another cooldown.
//!
//! Pure: outcomes and dispatches come in with the turn's time. A breaker is this coordinator's
//! view: each coordinator counts the outcomes of the executions it holds. Every transition is
//! kept until the turn hands it on (a metric, a log line and a `BreakerTransition` message on
//! `trellis.breakers.<queue>`).

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_proto::{subjects, v1};

use super::Publish;

/// When breakers open; `failures == 0` turns them off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failed attempts of one queue and type that open its breaker.
    pub failures: u32,
    /// How long an open breaker holds dispatches before it lets a probe through.
    pub cooldown_ms: u64,
}

/// A queue and a task type.
pub(super) type Key = (String, String);

/// The attempt a half-open breaker let through.
type Probe = (ExecutionId, TaskInstanceId, u32);

/// The state of one breaker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Dispatches flow; `failures` consecutive failures so far.
    Closed { failures: u32 },
    /// Dispatches wait until `until_ms`.
    Open { since_ms: u64, until_ms: u64 },
    /// One probe may go (`None`: not sent yet; else the probe and when it was sent); the rest
    /// wait for its outcome. A probe that reports nothing within a cooldown (its worker was
    /// lost, its execution cancelled or moved to another coordinator) is given up and another
    /// may go.
    HalfOpen { probe: Option<(Probe, u64)> },
}

impl State {
    /// Returns the lowercase name.
    pub(super) fn name(&self) -> &'static str {
        match self {
            State::Closed { .. } => "closed",
            State::Open { .. } => "open",
            State::HalfOpen { .. } => "half_open",
        }
    }
}

/// One change of a breaker's state, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Transition {
    pub(super) key: Key,
    pub(super) from: &'static str,
    pub(super) to: &'static str,
    pub(super) at_ms: u64,
    pub(super) reason: String,
}

/// Every breaker of this coordinator (only those that saw a failure exist).
#[derive(Debug, Default)]
pub(super) struct Breakers {
    config: BreakerConfig,
    states: BTreeMap<Key, State>,
    /// Transitions not handed on yet.
    pub(super) transitions: Vec<Transition>,
}

impl Breakers {
    pub(super) fn new(config: BreakerConfig) -> Self {
        Breakers {
            config,
            ..Breakers::default()
        }
    }

    /// Returns every breaker that is not closed with no failures, by key.
    pub(super) fn states(&self) -> impl Iterator<Item = (&Key, &State)> {
        self.states
            .iter()
            .filter(|(_, state)| **state != State::Closed { failures: 0 })
    }

    /// Counts an attempt's outcome for its queue and type.
    pub(super) fn outcome(&mut self, key: Key, succeeded: bool, attempt: Probe, now: u64) {
        if self.config.failures == 0 {
            return;
        }
        let threshold = self.config.failures;
        let cooldown = self.config.cooldown_ms;
        let state = self
            .states
            .entry(key.clone())
            .or_insert(State::Closed { failures: 0 });
        let next = match (&*state, succeeded) {
            (State::Closed { .. }, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 >= threshold => State::Open {
                since_ms: now,
                until_ms: now.saturating_add(cooldown),
            },
            (State::Closed { failures }, false) => State::Closed {
                failures: failures + 1,
            },
            (
                State::HalfOpen {
                    probe: Some((probe, _)),
                },
                ok,
            ) if *probe == attempt => {
                if ok {
                    State::Closed { failures: 0 }
                } else {
                    State::Open {
                        since_ms: now,
                        until_ms: now.saturating_add(cooldown),
                    }
                }
            }
            // An attempt sent before the breaker opened reports while it is open or waits for
            // its probe: only the probe decides.
            (State::Open { .. } | State::HalfOpen { .. }, _) => return,
        };
        let reason = match (&*state, &next) {
            (State::Closed { .. }, State::Open { .. }) => {
                format!("{threshold} consecutive attempts failed")
            }
            (State::HalfOpen { .. }, State::Open { .. }) => "the probe failed".to_owned(),
            (State::HalfOpen { .. }, State::Closed { .. }) => "the probe succeeded".to_owned(),
            _ => String::new(),
        };
        let from = state.name();
        *state = next;
        if from != state.name() {
            let to = state.name();
            self.transitions.push(Transition {
                key,
                from,
                to,
                at_ms: now,
                reason,
            });
        }
    }

    /// Half-opens the breakers whose cooldown has passed, and gives up probes that reported
    /// nothing for a cooldown.
    pub(super) fn tick(&mut self, now: u64) {
        let cooldown = self.config.cooldown_ms;
        for (key, state) in &mut self.states {
            if let State::HalfOpen {
                probe: Some((_, sent_ms)),
            } = *state
                && now >= sent_ms.saturating_add(cooldown)
            {
                *state = State::HalfOpen { probe: None };
            }
            if let State::Open { until_ms, .. } = *state
                && now >= until_ms
            {
                *state = State::HalfOpen { probe: None };
                self.transitions.push(Transition {
                    key: key.clone(),
                    from: "open",
                    to: "half_open",
                    at_ms: now,
                    reason: "the cooldown passed: one probe may go".to_owned(),
                });
            }
        }
    }

    /// Returns a hold for one `decide`: true for a queue and type whose breaker is open, or
    /// half-open with its probe sent. A half-open breaker without a probe lets the first
    /// candidate asked about through and holds the rest of the call (`probing` remembers it).
    pub(super) fn holds(&self, queue: &str, task_type: &str, probing: &mut BTreeSet<Key>) -> bool {
        // Nothing failed yet (or breakers are off): nothing to look up, nothing to allocate.
        if self.states.is_empty() {
            return false;
        }
        let key = (queue.to_owned(), task_type.to_owned());
        match self.states.get(&key) {
            None | Some(State::Closed { .. }) => false,
            Some(State::Open { .. }) | Some(State::HalfOpen { probe: Some(_) }) => true,
            Some(State::HalfOpen { probe: None }) => !probing.insert(key),
        }
    }

    /// Records a dispatch: the first one of a half-open breaker is its probe.
    pub(super) fn dispatched(&mut self, queue: &str, task_type: &str, attempt: Probe, now: u64) {
        if self.states.is_empty() {
            return;
        }
        let key = (queue.to_owned(), task_type.to_owned());
        if let Some(state @ State::HalfOpen { probe: None }) = self.states.get_mut(&key) {
            *state = State::HalfOpen {
                probe: Some((attempt, now)),
            };
        }
    }
}

impl super::Coordinator {
    /// Hands on the breakers' transitions: the state gauge, the transition counter, a log line
    /// and a `BreakerTransition` on `trellis.breakers.<queue>` (published with the turn's
    /// effects).
    pub(super) fn breaker_transitions(&mut self) {
        for transition in std::mem::take(&mut self.breakers.transitions) {
            let (queue, task_type) = transition.key;
            let labels = crate::metrics::task_labels(&queue, &task_type);
            self.metrics
                .breaker_state
                .get_or_create(&labels)
                .set(match transition.to {
                    "open" => 2,
                    "half_open" => 1,
                    _ => 0,
                });
            let [queue_label, type_label] = labels;
            self.metrics
                .breaker_transitions
                .get_or_create(&[queue_label, type_label, ("to", transition.to.to_owned())])
                .inc();
            tracing::warn!(
                %queue,
                %task_type,
                from = transition.from,
                to = transition.to,
                reason = %transition.reason,
                "circuit breaker changed state"
            );
            let message = v1::BreakerTransition {
                queue: queue.clone(),
                task_type,
                from: state_to_proto(transition.from).into(),
                to: state_to_proto(transition.to).into(),
                at_unix_ms: i64::try_from(transition.at_ms).unwrap_or(i64::MAX),
                reason: transition.reason,
                coordinator_id: self.config.id.clone(),
            };
            self.pending.breakers.push(Publish {
                subject: subjects::breakers(&queue),
                payload: message.encode_to_vec().into(),
            });
        }
    }

    /// Returns the breakers `ListWorkers` shows: those not closed or with failures counted,
    /// of `queue` when it is not empty.
    pub(super) fn breakers_list(&self, queue: &str) -> Vec<v1::CircuitBreaker> {
        self.breakers
            .states()
            .filter(|((q, _), _)| queue.is_empty() || q == queue)
            .map(|((queue, task_type), state)| v1::CircuitBreaker {
                queue: queue.clone(),
                task_type: task_type.clone(),
                state: state_to_proto(state.name()).into(),
                consecutive_failures: match state {
                    State::Closed { failures } => *failures,
                    _ => 0,
                },
                retry_at_unix_ms: match state {
                    State::Open { until_ms, .. } => i64::try_from(*until_ms).ok(),
                    _ => None,
                },
                coordinator_id: self.config.id.clone(),
            })
            .collect()
    }
}

/// Returns the wire state of a state name of [`State::name`].
fn state_to_proto(name: &str) -> v1::BreakerState {
    match name {
        "closed" => v1::BreakerState::Closed,
        "open" => v1::BreakerState::Open,
        "half_open" => v1::BreakerState::HalfOpen,
        _ => v1::BreakerState::Unspecified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        ("shell".to_owned(), "shell".to_owned())
    }

    fn attempt(n: u128) -> Probe {
        (ExecutionId(uuid_of(1)), TaskInstanceId(uuid_of(n)), 1)
    }

    fn uuid_of(n: u128) -> uuid::Uuid {
        uuid::Uuid::from_u128(n)
    }

    fn breakers() -> Breakers {
        Breakers::new(BreakerConfig {
            failures: 3,
            cooldown_ms: 1_000,
        })
    }

    fn held(b: &Breakers) -> bool {
        b.holds("shell", "shell", &mut BTreeSet::new())
    }

    #[test]
    fn opens_after_consecutive_failures_and_a_success_resets_the_count() {
        let mut b = breakers();
        b.outcome(key(), false, attempt(2), 10);
        b.outcome(key(), false, attempt(3), 11);
        b.outcome(key(), true, attempt(4), 12);
        b.outcome(key(), false, attempt(5), 13);
        b.outcome(key(), false, attempt(6), 14);
        assert!(!held(&b), "2 consecutive failures: still closed");
        b.outcome(key(), false, attempt(7), 15);
        assert!(held(&b), "3 consecutive failures open it");
        assert!(
            !b.holds("shell", "other", &mut BTreeSet::new()),
            "another type flows"
        );
        assert_eq!(
            b.transitions,
            [Transition {
                key: key(),
                from: "closed",
                to: "open",
                at_ms: 15,
                reason: "3 consecutive attempts failed".to_owned(),
            }]
        );
    }

    #[test]
    fn half_opens_after_the_cooldown_with_one_probe_that_decides() {
        let mut b = breakers();
        for n in 0..3 {
            b.outcome(key(), false, attempt(n), 100);
        }
        b.tick(1_099);
        assert!(held(&b), "still cooling down");
        b.tick(1_100);
        let mut probing = BTreeSet::new();
        assert!(!b.holds("shell", "shell", &mut probing), "one probe goes");
        assert!(b.holds("shell", "shell", &mut probing), "only one");
        b.dispatched("shell", "shell", attempt(10), 1_100);
        assert!(held(&b), "the rest wait for the probe");
        // A late failure of an attempt from before does not decide.
        b.outcome(key(), false, attempt(1), 1_200);
        assert!(matches!(
            b.states[&key()],
            State::HalfOpen { probe: Some(_) }
        ));
        // The probe fails: open again for another cooldown.
        b.outcome(key(), false, attempt(10), 1_300);
        assert!(matches!(
            b.states[&key()],
            State::Open {
                until_ms: 2_300,
                ..
            }
        ));
        b.tick(2_300);
        b.dispatched("shell", "shell", attempt(11), 2_300);
        // A probe that never reports is given up after a cooldown; the next one decides.
        b.tick(3_299);
        assert!(held(&b));
        b.tick(3_300);
        assert!(!held(&b), "another probe may go");
        b.dispatched("shell", "shell", attempt(12), 3_300);
        b.outcome(key(), true, attempt(12), 3_400);
        assert!(!held(&b), "a good probe closes it");
        let path: Vec<(&str, &str)> = b.transitions.iter().map(|t| (t.from, t.to)).collect();
        assert_eq!(
            path,
            [
                ("closed", "open"),
                ("open", "half_open"),
                ("half_open", "open"),
                ("open", "half_open"),
                ("half_open", "closed"),
            ]
        );
        assert_eq!(
            b.states().count(),
            0,
            "closed without failures is not listed"
        );
    }

    #[test]
    fn off_when_failures_is_zero() {
        let mut b = Breakers::default();
        for n in 0..100 {
            b.outcome(key(), false, attempt(n), 1);
        }
        assert!(!held(&b) && b.transitions.is_empty());
    }
}
