//! Progress of an execution (docs/design.md §4): counts by state, percent, ETA and "wave k of n", and the
//! one line that shows it.
//!
//! The coordinator computes progress; the CLI only shows it. Snapshots come with
//! `ObserveExecution` items ([`observed`]: on live events at most every 100 ms, and always on the
//! last event of an execution) and with `Execution` summaries ([`of_execution`]). A [`Tracker`]
//! follows a stream: it keeps the latest snapshot and tells when the execution is over.

use trellis_proto::v1::{
    Event, Execution, ExecutionState, ObserveExecutionResponse, Progress, TaskStateCounts,
};

use super::events;
use super::{format_duration_ms, is_terminal, total};

/// Returns the coordinator's progress snapshot carried by a stream item, if it carries one.
pub fn observed(response: &ObserveExecutionResponse) -> Option<Progress> {
    response.progress.clone()
}

/// Returns the progress of an execution summary: the coordinator's snapshot, or, when the
/// coordinator has not loaded the execution, one built from its counts (without waves or ETA).
pub fn of_execution(execution: &Execution) -> Progress {
    if let Some(progress) = &execution.progress {
        return progress.clone();
    }
    let counts = execution.counts.unwrap_or_default();
    let n_total = total(&counts);
    let n_done = terminal(&counts);
    Progress {
        execution_id: execution.execution_id.clone(),
        run_number: execution.run_number,
        state: execution.state,
        counts: Some(counts),
        total: n_total,
        done: n_done,
        percent: percent(n_done, n_total),
        eta_ms: None,
        wave: 0,
        waves: 0,
        reason: (!execution.reason.is_empty()).then(|| execution.reason.clone()),
        sequence: execution.last_sequence,
        sent_at_unix_ms: 0,
    }
}

/// Formats progress as one line:
/// `wave 2 of 5 · 12 completed · 3 running · 1 failed · 20 pending · 33% · ETA 12.0s`.
/// Counts that are zero are left out, except completed, running and pending, which are always
/// shown.
pub fn line(progress: &Progress) -> String {
    let counts = progress.counts.unwrap_or_default();
    let mut parts: Vec<String> = Vec::new();
    if progress.waves > 0 {
        parts.push(format!(
            "wave {} of {}",
            progress.wave.clamp(1, progress.waves),
            progress.waves
        ));
    }
    let pending = counts.pending + counts.queued + counts.blocked + counts.retry_scheduled;
    let waiting = counts.waiting_for_subtasks + counts.waiting_for_human;
    parts.push(format!("{} completed", counts.completed));
    parts.push(format!("{} running", counts.running));
    for (n, label) in [
        (waiting, "waiting"),
        (counts.failed, "failed"),
        (counts.skipped, "skipped"),
        (counts.cancelled, "cancelled"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {label}"));
        }
    }
    parts.push(format!("{pending} pending"));
    parts.push(format!("{:.0}%", progress.percent));
    if let Some(eta_ms) = progress.eta_ms {
        parts.push(format!("ETA {}", format_duration_ms(eta_ms)));
    }
    parts.join(" · ")
}

/// Follows one execution's `ObserveExecution` stream: the latest progress snapshot, the
/// execution's state and reason as far as the stream tells, the last sequence, and whether the
/// execution is over.
///
/// The execution is over after an `ExecutionFinished`, `ExecutionTimedOut` or `CancelRequested`
/// event, or a snapshot whose state is terminal.
#[derive(Debug)]
pub struct Tracker {
    state: ExecutionState,
    reason: String,
    snapshot: Option<Progress>,
    first_event_ms: i64,
    last_event_ms: i64,
    last_sequence: u64,
}

impl Default for Tracker {
    fn default() -> Self {
        Self {
            state: ExecutionState::Pending,
            reason: String::new(),
            snapshot: None,
            first_event_ms: 0,
            last_event_ms: 0,
            last_sequence: 0,
        }
    }
}

impl Tracker {
    /// Starts following an execution, before its first event.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one stream item: its event, then its snapshot (taken right after the event).
    pub fn apply(&mut self, item: &ObserveExecutionResponse) {
        if let Some(event) = &item.event {
            self.apply_event(event);
        }
        if let Some(snapshot) = observed(item) {
            self.apply_snapshot(snapshot);
        }
    }

    fn apply_event(&mut self, event: &Event) {
        if self.first_event_ms == 0 {
            self.first_event_ms = event.timestamp_unix_ms;
        }
        self.last_event_ms = event.timestamp_unix_ms;
        self.last_sequence = event.sequence;
        if let Some(change) = events::execution_change(event.kind.as_ref()) {
            // `execution_finished` after the event that ended the execution keeps its reason.
            if !(change.reason.is_empty() && change.state == self.state) {
                self.reason = change.reason;
            }
            self.state = change.state;
        }
    }

    fn apply_snapshot(&mut self, snapshot: Progress) {
        // The snapshot of an item reflects its event; one that reflects an earlier event (or does
        // not say) does not take back a state a later event told.
        let fresh = snapshot.sequence >= self.last_sequence || snapshot.sequence == 0;
        let state = ExecutionState::try_from(snapshot.state).unwrap_or_default();
        if fresh && state != ExecutionState::Unspecified {
            self.state = state;
            self.reason = snapshot.reason.clone().unwrap_or_default();
        }
        self.snapshot = Some(snapshot);
    }

    /// Returns whether the execution is over (completed, failed or cancelled).
    pub fn is_over(&self) -> bool {
        is_terminal(self.state)
    }

    /// Returns the execution's state as the stream tells it.
    pub fn state(&self) -> ExecutionState {
        self.state
    }

    /// Returns why the execution paused, failed or was cancelled; empty when not told.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Returns the latest snapshot, if the coordinator sent one yet.
    pub fn snapshot(&self) -> Option<&Progress> {
        self.snapshot.as_ref()
    }

    /// Returns the sequence of the last event seen (0 before any).
    pub fn last_sequence(&self) -> u64 {
        self.last_sequence
    }

    /// Returns milliseconds between the first and the last event seen.
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.last_event_ms - self.first_event_ms).unwrap_or(0)
    }
}

fn terminal(counts: &TaskStateCounts) -> u64 {
    counts.completed + counts.failed + counts.skipped + counts.cancelled
}

/// `done` over `total` as the coordinator computes it: 100 when there is nothing to do.
fn percent(n_done: u64, n_total: u64) -> f64 {
    if n_total == 0 {
        100.0
    } else {
        n_done as f64 * 100.0 / n_total as f64
    }
}

#[cfg(test)]
mod tests {
    use trellis_proto::v1::event::Kind;
    use trellis_proto::v1::{
        CancelRequested, ExecutionFinished, ExecutionOutcome, ExecutionStarted, PauseRequested,
        TaskDispatched,
    };

    use super::*;

    fn check(progress: &Progress, expected: &str) {
        assert_eq!(line(progress), expected);
    }

    #[test]
    fn line_shows_waves_counts_percent_and_eta() {
        check(
            &Progress {
                counts: Some(TaskStateCounts {
                    pending: 15,
                    queued: 5,
                    running: 3,
                    completed: 12,
                    failed: 1,
                    ..TaskStateCounts::default()
                }),
                total: 36,
                done: 13,
                percent: 36.1,
                eta_ms: Some(12_000),
                wave: 2,
                waves: 5,
                ..Progress::default()
            },
            "wave 2 of 5 · 12 completed · 3 running · 1 failed · 20 pending · 36% · ETA 12.0s",
        );
    }

    #[test]
    fn line_without_waves_or_eta() {
        check(
            &Progress::default(),
            "0 completed · 0 running · 0 pending · 0%",
        );
    }

    fn execution(progress: Option<Progress>) -> Execution {
        Execution {
            execution_id: "e".to_owned(),
            state: ExecutionState::Running as i32,
            run_number: 1,
            counts: Some(TaskStateCounts {
                completed: 1,
                running: 1,
                pending: 2,
                ..TaskStateCounts::default()
            }),
            last_sequence: 9,
            progress,
            ..Execution::default()
        }
    }

    #[test]
    fn an_execution_shows_the_coordinators_snapshot() {
        let snapshot = Progress {
            counts: Some(TaskStateCounts {
                completed: 1,
                running: 1,
                pending: 2,
                ..TaskStateCounts::default()
            }),
            total: 4,
            done: 1,
            percent: 25.0,
            eta_ms: Some(3_000),
            wave: 1,
            waves: 3,
            sequence: 9,
            ..Progress::default()
        };
        let progress = of_execution(&execution(Some(snapshot.clone())));
        assert_eq!(progress, snapshot);
        check(
            &progress,
            "wave 1 of 3 · 1 completed · 1 running · 2 pending · 25% · ETA 3.0s",
        );
    }

    #[test]
    fn an_execution_without_snapshot_shows_its_counts() {
        let progress = of_execution(&execution(None));
        assert_eq!((progress.done, progress.total), (1, 4));
        assert_eq!(progress.sequence, 9);
        check(&progress, "1 completed · 1 running · 2 pending · 25%");
        // Nothing to do is all done, as the coordinator counts it.
        let empty = Execution {
            counts: None,
            ..execution(None)
        };
        assert_eq!(of_execution(&empty).percent, 100.0);
    }

    fn item(sequence: u64, kind: Kind, progress: Option<Progress>) -> ObserveExecutionResponse {
        ObserveExecutionResponse {
            event: Some(Event {
                execution_id: "e".to_owned(),
                sequence,
                timestamp_unix_ms: 1_000 + i64::try_from(sequence).expect("small") * 250,
                kind: Some(kind),
            }),
            progress,
        }
    }

    fn dispatched(instance: &str) -> Kind {
        Kind::TaskDispatched(TaskDispatched {
            task_instance_id: instance.to_owned(),
            attempt: 1,
        })
    }

    fn snapshot(sequence: u64, state: ExecutionState, percent: f64) -> Progress {
        Progress {
            state: state as i32,
            percent,
            sequence,
            ..Progress::default()
        }
    }

    #[test]
    fn tracker_keeps_the_latest_snapshot_and_ends_with_the_last_event() {
        let mut tracker = Tracker::new();
        assert_eq!(tracker.state(), ExecutionState::Pending);
        tracker.apply(&item(
            1,
            Kind::ExecutionStarted(ExecutionStarted::default()),
            None,
        ));
        assert_eq!(tracker.state(), ExecutionState::Running);
        assert!(tracker.snapshot().is_none(), "history carries no snapshot");
        tracker.apply(&item(
            2,
            dispatched("a"),
            Some(snapshot(2, ExecutionState::Running, 0.0)),
        ));
        // Between snapshots the last one stays.
        tracker.apply(&item(3, dispatched("b"), None));
        assert_eq!(tracker.snapshot().map(|p| p.sequence), Some(2));
        assert!(!tracker.is_over());
        tracker.apply(&item(
            4,
            Kind::ExecutionFinished(ExecutionFinished {
                outcome: ExecutionOutcome::Failed as i32,
            }),
            Some(Progress {
                reason: Some("task b failed: boom".to_owned()),
                ..snapshot(4, ExecutionState::Failed, 100.0)
            }),
        ));
        assert!(tracker.is_over());
        assert_eq!(tracker.state(), ExecutionState::Failed);
        assert_eq!(tracker.reason(), "task b failed: boom");
        assert_eq!(tracker.snapshot().map(|p| p.percent), Some(100.0));
        assert_eq!(tracker.last_sequence(), 4);
        assert_eq!(tracker.elapsed_ms(), 750);
    }

    #[test]
    fn tracker_ends_with_a_cancel_even_without_a_snapshot() {
        let mut tracker = Tracker::new();
        tracker.apply(&item(
            5,
            dispatched("a"),
            Some(snapshot(5, ExecutionState::Running, 10.0)),
        ));
        tracker.apply(&item(
            6,
            Kind::CancelRequested(CancelRequested {
                reason: "wrong branch".to_owned(),
            }),
            None,
        ));
        assert!(tracker.is_over());
        assert_eq!(tracker.state(), ExecutionState::Cancelled);
        assert_eq!(tracker.reason(), "wrong branch");
        // A snapshot of an earlier event arriving late does not take the end back.
        tracker.apply(&ObserveExecutionResponse {
            event: None,
            progress: Some(snapshot(5, ExecutionState::Running, 10.0)),
        });
        assert_eq!(tracker.state(), ExecutionState::Cancelled);
    }

    #[test]
    fn tracker_takes_states_only_snapshots_tell() {
        let mut tracker = Tracker::new();
        tracker.apply(&item(
            2,
            Kind::PauseRequested(PauseRequested {
                reason: "lunch".to_owned(),
                ..PauseRequested::default()
            }),
            None,
        ));
        assert_eq!(tracker.state(), ExecutionState::Paused);
        assert_eq!(tracker.reason(), "lunch");
        // A budget that fails the execution is told by the snapshot only.
        tracker.apply(&item(
            3,
            Kind::BudgetExhausted(trellis_proto::v1::BudgetExhausted {
                reason: "tokens 110 of 100".to_owned(),
            }),
            Some(Progress {
                reason: Some("budget exhausted: tokens 110 of 100".to_owned()),
                ..snapshot(3, ExecutionState::Failed, 40.0)
            }),
        ));
        assert!(tracker.is_over());
        assert_eq!(tracker.reason(), "budget exhausted: tokens 110 of 100");
    }
}
