//! Progress of an execution (DESIGN.md §4): counts by state, percent, ETA and "wave k of n", and the
//! one line that shows it.
//!
//! Progress is read through [`observed`] (from an `ObserveExecution` item) and [`of_execution`]
//! (from an `Execution` summary). Where the coordinator does not send a snapshot, a [`Tracker`]
//! derives one from the events themselves.

use std::collections::HashMap;

use trellis_proto::v1::{
    Event, Execution, ExecutionState, ObserveExecutionResponse, Progress, TaskState,
    TaskStateCounts,
};

use super::events::{self, InstanceChange};
use super::{format_duration_ms, total};

/// Returns the coordinator's own progress snapshot carried by a stream item, if any.
///
/// `ObserveExecutionResponse` carries only the event today; when it gains its `progress` field,
/// this returns it and the [`Tracker`] is only the fallback.
pub fn observed(_response: &ObserveExecutionResponse) -> Option<Progress> {
    None
}

/// Returns the progress of an execution summary, built from its counts (the summary does not
/// carry waves yet, so `total_waves` is 0 and the wave is not shown).
pub fn of_execution(execution: &Execution) -> Progress {
    let counts = execution.counts.unwrap_or_default();
    let n_total = total(&counts);
    let n_done = terminal(&counts);
    Progress {
        execution_id: execution.execution_id.clone(),
        run_number: execution.run_number,
        state: execution.state,
        counts: Some(counts),
        percent: percent(n_done, n_total),
        eta_ms: None,
        current_wave: 0,
        total_waves: 0,
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
    if progress.total_waves > 0 {
        parts.push(format!(
            "wave {} of {}",
            progress.current_wave.max(1),
            progress.total_waves
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

/// Derives progress from an execution's events, for coordinators that do not send snapshots.
///
/// Counts are kept up to date per event (no scan per snapshot), so following a 100,000-task
/// execution costs O(1) per event, and the wave position costs O(waves) per snapshot.
#[derive(Debug, Default)]
pub struct Tracker {
    execution_id: String,
    state: ExecutionState,
    reason: String,
    run_number: u32,
    /// Wave (from 0) of each plan task; tasks not in the plan (dynamic subtasks) are not in it.
    wave_of_task: HashMap<String, usize>,
    /// Per wave, the plan tasks not finished yet (never instantiated, or with an unfinished
    /// instance).
    open_tasks_per_wave: Vec<u32>,
    /// Per plan task seen so far, its unfinished instances.
    open_instances_per_task: HashMap<String, u32>,
    /// Each instance's task id (when known) and state.
    instances: HashMap<String, (Option<String>, TaskState)>,
    /// Instances by state, indexed by the `TaskState` number.
    counts: [u32; 12],
    /// Plan tasks that have no instance yet; shown as pending.
    n_unseen_plan_tasks: u32,
    first_event_ms: i64,
    last_event_ms: i64,
    last_sequence: u64,
    final_counts: Option<TaskStateCounts>,
}

impl Tracker {
    /// Starts tracking an execution of a plan whose waves are `waves` (task ids, wave 1 first).
    pub fn new(execution_id: &str, waves: &[Vec<String>]) -> Self {
        let mut tracker = Self {
            execution_id: execution_id.to_owned(),
            state: ExecutionState::Pending,
            ..Self::default()
        };
        for (wave_idx, wave) in waves.iter().enumerate() {
            for task_id in wave {
                tracker.wave_of_task.insert(task_id.clone(), wave_idx);
            }
            tracker
                .open_tasks_per_wave
                .push(u32::try_from(wave.len()).unwrap_or(u32::MAX));
        }
        tracker.n_unseen_plan_tasks = u32::try_from(tracker.wave_of_task.len()).unwrap_or(u32::MAX);
        tracker
    }

    /// Applies one event.
    pub fn apply(&mut self, event: &Event) {
        if self.first_event_ms == 0 {
            self.first_event_ms = event.timestamp_unix_ms;
        }
        self.last_event_ms = event.timestamp_unix_ms;
        self.last_sequence = event.sequence;
        for change in events::instance_changes(event.kind.as_ref()) {
            self.change_instance(change);
        }
        if let Some(change) = events::execution_change(event.kind.as_ref()) {
            if change.state == ExecutionState::Running && self.run_number == 0 {
                self.run_number = 1;
            }
            self.state = change.state;
            self.reason = change.reason;
            if change.counts.is_some() {
                self.final_counts = change.counts;
            }
        }
    }

    /// Returns the execution's state as the events tell it.
    pub fn state(&self) -> ExecutionState {
        self.state
    }

    /// Returns why the execution paused, failed or was cancelled; empty otherwise.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Returns the sequence of the last event applied (0 before any).
    pub fn last_sequence(&self) -> u64 {
        self.last_sequence
    }

    /// Returns milliseconds between the first and the last event.
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.last_event_ms - self.first_event_ms).unwrap_or(0)
    }

    /// Returns the progress so far.
    pub fn snapshot(&self) -> Progress {
        let counts = self.final_counts.unwrap_or_else(|| self.counts());
        let n_total = total(&counts);
        let n_done = terminal(&counts);
        let eta_ms = (n_done > 0 && n_done < n_total && self.elapsed_ms() > 0).then(|| {
            let remaining = n_total - n_done;
            u64::try_from(
                u128::from(self.elapsed_ms()) * u128::from(remaining) / u128::from(n_done),
            )
            .unwrap_or(u64::MAX)
        });
        let total_waves = u32::try_from(self.open_tasks_per_wave.len()).unwrap_or(u32::MAX);
        let current_wave = self
            .open_tasks_per_wave
            .iter()
            .position(|&n_open| n_open > 0)
            .map_or(total_waves, |wave_idx| {
                u32::try_from(wave_idx + 1).unwrap_or(u32::MAX)
            });
        Progress {
            execution_id: self.execution_id.clone(),
            run_number: self.run_number,
            state: self.state as i32,
            counts: Some(counts),
            percent: percent(n_done, n_total),
            eta_ms,
            current_wave,
            total_waves,
            sequence: self.last_sequence,
            sent_at_unix_ms: self.last_event_ms,
        }
    }

    fn counts(&self) -> TaskStateCounts {
        let n = |state: TaskState| self.counts[state as usize];
        TaskStateCounts {
            pending: n(TaskState::Pending) + self.n_unseen_plan_tasks,
            queued: n(TaskState::Queued),
            blocked: n(TaskState::Blocked),
            running: n(TaskState::Running),
            waiting_for_subtasks: n(TaskState::WaitingForSubtasks),
            waiting_for_human: n(TaskState::WaitingForHuman),
            retry_scheduled: n(TaskState::RetryScheduled),
            completed: n(TaskState::Completed),
            failed: n(TaskState::Failed),
            skipped: n(TaskState::Skipped),
            cancelled: n(TaskState::Cancelled),
        }
    }

    fn change_instance(&mut self, change: InstanceChange) {
        let InstanceChange {
            task_instance_id,
            task_id,
            state,
        } = change;
        let (task_id, old_state) = match self.instances.get_mut(&task_instance_id) {
            Some((known_task_id, old_state)) => {
                if known_task_id.is_none() {
                    known_task_id.clone_from(&task_id);
                }
                let old = *old_state;
                *old_state = state;
                (known_task_id.clone(), Some(old))
            }
            None => {
                self.instances
                    .insert(task_instance_id, (task_id.clone(), state));
                (task_id, None)
            }
        };
        if let Some(old_state) = old_state {
            self.counts[old_state as usize] = self.counts[old_state as usize].saturating_sub(1);
        }
        self.counts[state as usize] += 1;

        // Plan-task bookkeeping for the wave position.
        let Some(task_id) = task_id else { return };
        let Some(&wave_idx) = self.wave_of_task.get(&task_id) else {
            return;
        };
        let was_open = old_state.is_some_and(|s| !is_terminal_task(s));
        let is_open = !is_terminal_task(state);
        let open_instances = match self.open_instances_per_task.get_mut(&task_id) {
            Some(open) => open,
            None => {
                // First instance of this plan task: it stops counting as unseen, and the task
                // (already open in its wave) now stays open through its instances.
                self.n_unseen_plan_tasks = self.n_unseen_plan_tasks.saturating_sub(1);
                self.open_tasks_per_wave[wave_idx] =
                    self.open_tasks_per_wave[wave_idx].saturating_sub(1);
                self.open_instances_per_task.entry(task_id).or_insert(0)
            }
        };
        let task_was_open = *open_instances > 0;
        match (was_open, is_open) {
            (false, true) => *open_instances += 1,
            (true, false) => *open_instances = open_instances.saturating_sub(1),
            _ => {}
        }
        let task_is_open = *open_instances > 0;
        match (task_was_open, task_is_open) {
            (false, true) => self.open_tasks_per_wave[wave_idx] += 1,
            (true, false) => {
                self.open_tasks_per_wave[wave_idx] =
                    self.open_tasks_per_wave[wave_idx].saturating_sub(1);
            }
            _ => {}
        }
    }
}

fn is_terminal_task(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Completed | TaskState::Failed | TaskState::Skipped | TaskState::Cancelled
    )
}

fn terminal(counts: &TaskStateCounts) -> u64 {
    u64::from(counts.completed)
        + u64::from(counts.failed)
        + u64::from(counts.skipped)
        + u64::from(counts.cancelled)
}

fn percent(n_done: u64, n_total: u64) -> f32 {
    if n_total == 0 {
        0.0
    } else {
        (n_done as f64 * 100.0 / n_total as f64) as f32
    }
}

#[cfg(test)]
mod tests {
    use trellis_proto::v1::event::Kind;
    use trellis_proto::v1::{ExecutionStarted, TaskCompleted, TaskDispatched, TaskQueued};

    use super::*;

    fn check(progress: Progress, expected: &str) {
        assert_eq!(line(&progress), expected);
    }

    #[test]
    fn line_shows_waves_counts_percent_and_eta() {
        check(
            Progress {
                counts: Some(TaskStateCounts {
                    pending: 15,
                    queued: 5,
                    running: 3,
                    completed: 12,
                    failed: 1,
                    ..TaskStateCounts::default()
                }),
                percent: 36.1,
                eta_ms: Some(12_000),
                current_wave: 2,
                total_waves: 5,
                ..Progress::default()
            },
            "wave 2 of 5 · 12 completed · 3 running · 1 failed · 20 pending · 36% · ETA 12.0s",
        );
    }

    #[test]
    fn line_without_waves_or_eta() {
        check(
            Progress::default(),
            "0 completed · 0 running · 0 pending · 0%",
        );
    }

    fn event(sequence: u64, at_ms: i64, kind: Kind) -> Event {
        Event {
            execution_id: "e".to_owned(),
            sequence,
            timestamp_unix_ms: at_ms,
            kind: Some(kind),
        }
    }

    fn queued(instance: &str, task: &str) -> Kind {
        Kind::TaskQueued(TaskQueued {
            task_instance_id: instance.to_owned(),
            task_id: task.to_owned(),
            attempt: 1,
            run_number: 1,
        })
    }

    fn completed(instance: &str) -> Kind {
        Kind::TaskCompleted(TaskCompleted {
            task_instance_id: instance.to_owned(),
            attempt: 1,
            ..TaskCompleted::default()
        })
    }

    #[test]
    fn tracker_follows_waves_and_estimates() {
        let waves = vec![vec!["a".to_owned(), "b".to_owned()], vec!["c".to_owned()]];
        let mut tracker = Tracker::new("e", &waves);
        check(
            tracker.snapshot(),
            "wave 1 of 2 · 0 completed · 0 running · 3 pending · 0%",
        );
        tracker.apply(&event(
            1,
            1_000,
            Kind::ExecutionStarted(ExecutionStarted::default()),
        ));
        tracker.apply(&event(2, 1_000, queued("ia", "a")));
        tracker.apply(&event(3, 1_000, queued("ib", "b")));
        tracker.apply(&event(
            4,
            1_000,
            Kind::TaskDispatched(TaskDispatched {
                task_instance_id: "ia".to_owned(),
                task_id: "a".to_owned(),
                ..TaskDispatched::default()
            }),
        ));
        check(
            tracker.snapshot(),
            "wave 1 of 2 · 0 completed · 1 running · 2 pending · 0%",
        );
        tracker.apply(&event(5, 2_000, completed("ia")));
        tracker.apply(&event(6, 3_000, completed("ib")));
        check(
            tracker.snapshot(),
            "wave 2 of 2 · 2 completed · 0 running · 1 pending · 67% · ETA 1.0s",
        );
        tracker.apply(&event(7, 3_000, queued("ic", "c")));
        tracker.apply(&event(8, 4_000, completed("ic")));
        let progress = tracker.snapshot();
        assert_eq!(progress.percent, 100.0);
        assert_eq!(progress.current_wave, 2);
        assert_eq!(tracker.state(), ExecutionState::Running);
        assert_eq!(tracker.last_sequence(), 8);
    }
}
