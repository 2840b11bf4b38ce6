//! Failure handling (docs/design.md §5): failure actions, escalation chains and retry backoff.
//!
//! Everything here is a pure function of its inputs; jitter takes its randomness as an argument so
//! the state machine stays deterministic (it derives the jitter from the instance id and attempt).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What happens when a task attempt fails.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureAction {
    /// Run a new attempt after the backoff delay, at most `max` retries.
    Retry { max: u32, backoff: Backoff },
    /// Run a new attempt on a different worker.
    Reassign,
    /// Mark the task skipped; dependents proceed only with `continue_on_partial_failure`.
    Skip,
    /// Pause the execution until a human resumes it; the task is attempted again on resume.
    Pause,
    /// Cancel all running tasks and fail the execution.
    Abort,
    /// Run the named plan task in the failed task's place (its index in the compiled plan).
    Fallback { task: usize },
}

impl FailureAction {
    /// Returns the action's name as written in plans and shown in events.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Retry { .. } => "retry",
            Self::Reassign => "reassign",
            Self::Skip => "skip",
            Self::Pause => "pause",
            Self::Abort => "abort",
            Self::Fallback { .. } => "fallback",
        }
    }
}

/// Ordered failure actions, tried in turn as a task's failures accumulate.
///
/// A `Retry { max }` step absorbs up to `max` failures before the chain moves on; every other step
/// absorbs one failure. Past the last step the last action repeats, except `Retry`, which then fails
/// the task (`Abort` semantics are left to the chain's author).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationChain {
    pub steps: Vec<FailureAction>,
}

/// Where a task is in its escalation chain: which step, and how many failures that step absorbed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChainPosition {
    pub step: u32,
    pub used: u32,
}

/// The decision taken for one failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Escalation {
    /// Take this action; `next` is the chain position to remember.
    Act {
        action: FailureAction,
        next: ChainPosition,
    },
    /// The chain is exhausted: the task fails for good.
    Exhausted,
}

impl EscalationChain {
    /// Returns the action for the next failure, given where the chain stands.
    ///
    /// A non-retryable error skips `Retry` and `Reassign` steps, since running the same work again
    /// cannot help.
    pub fn next(&self, position: ChainPosition, retryable: bool) -> Escalation {
        let mut step = position.step as usize;
        let mut used = position.used;
        while let Some(action) = self.steps.get(step) {
            let absorbs = match action {
                FailureAction::Retry { max, .. } => {
                    if retryable {
                        *max
                    } else {
                        0
                    }
                }
                FailureAction::Reassign => u32::from(retryable),
                _ => 1,
            };
            if used < absorbs {
                return Escalation::Act {
                    action: action.clone(),
                    next: ChainPosition {
                        step: step as u32,
                        used: used + 1,
                    },
                };
            }
            step += 1;
            used = 0;
        }
        Escalation::Exhausted
    }
}

/// How long to wait before a retry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    pub kind: BackoffKind,
    /// The first delay (constant: every delay).
    pub base: Duration,
    /// No delay exceeds this.
    pub cap: Duration,
    /// Full jitter in `[0, jitter_ratio_pct]` percent of the delay is subtracted, spreading retries.
    pub jitter_pct: u8,
}

/// The growth of successive backoff delays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BackoffKind {
    Constant,
    Linear,
    Exponential,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            kind: BackoffKind::Exponential,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(60),
            jitter_pct: 0,
        }
    }
}

impl Backoff {
    /// Returns the delay before retry number `retry` (1 for the first retry), with `entropy` (any
    /// 64-bit value) choosing the jitter.
    pub fn delay(&self, retry: u32, entropy: u64) -> Duration {
        let n = retry.max(1);
        let raw = match self.kind {
            BackoffKind::Constant => self.base,
            BackoffKind::Linear => self.base.saturating_mul(n),
            BackoffKind::Exponential => {
                let factor = 1u32.checked_shl(n - 1).unwrap_or(u32::MAX);
                self.base.saturating_mul(factor)
            }
        };
        let capped = raw.min(self.cap);
        if self.jitter_pct == 0 {
            return capped;
        }
        let pct = u128::from(self.jitter_pct.min(100));
        let max_jitter = capped.as_nanos() * pct / 100;
        let jitter = if max_jitter == 0 {
            0
        } else {
            u128::from(entropy) % (max_jitter + 1)
        };
        Duration::from_nanos((capped.as_nanos() - jitter).min(u128::from(u64::MAX)) as u64)
    }
}

/// The execution-wide failure policy of a plan (`options.failure`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailurePolicy {
    pub default_action: FailureAction,
    pub continue_on_partial_failure: bool,
    /// Per task type: the action for that type instead of the default.
    pub task_type_overrides: Vec<(String, FailureAction)>,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            default_action: FailureAction::Retry {
                max: 3,
                backoff: Backoff::default(),
            },
            continue_on_partial_failure: false,
            task_type_overrides: Vec::new(),
        }
    }
}

impl FailurePolicy {
    /// Returns the escalation chain that applies to a task of `task_type` with no chain of its own:
    /// the override for its type, or the default action.
    pub fn chain_for(&self, task_type: &str) -> EscalationChain {
        let action = self
            .task_type_overrides
            .iter()
            .find(|(ty, _)| ty == task_type)
            .map_or(&self.default_action, |(_, action)| action);
        EscalationChain {
            steps: vec![action.clone()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(kind: BackoffKind) -> Backoff {
        Backoff {
            kind,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            jitter_pct: 0,
        }
    }

    #[test]
    fn backoff_grows_as_declared_and_is_capped() {
        let ms = |b: &Backoff, n| b.delay(n, 0).as_millis();
        let constant = backoff(BackoffKind::Constant);
        assert_eq!([ms(&constant, 1), ms(&constant, 5)], [100, 100]);
        let linear = backoff(BackoffKind::Linear);
        assert_eq!(
            [ms(&linear, 1), ms(&linear, 3), ms(&linear, 20)],
            [100, 300, 1000]
        );
        let exponential = backoff(BackoffKind::Exponential);
        assert_eq!(
            [
                ms(&exponential, 1),
                ms(&exponential, 2),
                ms(&exponential, 4)
            ],
            [100, 200, 800]
        );
        assert_eq!(
            ms(&exponential, 200),
            1000,
            "huge retry counts saturate at the cap"
        );
    }

    #[test]
    fn jitter_stays_within_its_share() {
        let b = Backoff {
            jitter_pct: 50,
            ..backoff(BackoffKind::Constant)
        };
        for entropy in [0, 1, 7, u64::MAX, 123_456_789] {
            let d = b.delay(1, entropy).as_millis();
            assert!((50..=100).contains(&d), "{d}");
        }
    }

    #[test]
    fn escalation_chain_walks_in_order() {
        let chain = EscalationChain {
            steps: vec![
                FailureAction::Retry {
                    max: 2,
                    backoff: Backoff::default(),
                },
                FailureAction::Reassign,
                FailureAction::Fallback { task: 7 },
                FailureAction::Pause,
                FailureAction::Abort,
            ],
        };
        let mut position = ChainPosition::default();
        let mut names = Vec::new();
        while let Escalation::Act { action, next } = chain.next(position, true) {
            names.push(action.name());
            position = next;
        }
        assert_eq!(
            names,
            ["retry", "retry", "reassign", "fallback", "pause", "abort"]
        );
    }

    #[test]
    fn non_retryable_errors_skip_retries() {
        let chain = EscalationChain {
            steps: vec![
                FailureAction::Retry {
                    max: 3,
                    backoff: Backoff::default(),
                },
                FailureAction::Skip,
            ],
        };
        match chain.next(ChainPosition::default(), false) {
            Escalation::Act { action, .. } => assert_eq!(action, FailureAction::Skip),
            Escalation::Exhausted => panic!("skip must apply"),
        }
    }
}
