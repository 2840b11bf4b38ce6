//! Turning wire messages into lines for people and JSON for programs. Pure functions, no I/O, so
//! every format is unit-tested.
//!
//! - [`events`] is the only module that knows the kinds of `Event`.
//! - [`progress`] shows the coordinator's progress snapshots ("wave 3 of 7").
//! - [`tree`] draws the execution graph.
//! - [`plan_graph`] draws a plan as Mermaid or DOT.

pub mod checks;
pub mod events;
pub mod logs;
pub mod plan_graph;
pub mod progress;
pub mod tree;

use serde_json::{Value, json};
use trellis_proto::v1::{ExecutionState, TaskState, TaskStateCounts, Usage, WorkerState};

/// Returns the lowercase name of a task state (`completed`, `waiting_for_subtasks`), or the raw
/// number for a value this build does not know.
pub fn task_state_name(state: i32) -> String {
    match TaskState::try_from(state) {
        Ok(state) => short_name(state.as_str_name(), "TASK_STATE_"),
        Err(_) => format!("state_{state}"),
    }
}

/// Returns the lowercase name of an execution state (`running`, `waiting_for_human`).
pub fn execution_state_name(state: i32) -> String {
    match ExecutionState::try_from(state) {
        Ok(state) => short_name(state.as_str_name(), "EXECUTION_STATE_"),
        Err(_) => format!("state_{state}"),
    }
}

/// Returns the lowercase name of a worker state (`idle`, `running`).
pub fn worker_state_name(state: i32) -> String {
    match WorkerState::try_from(state) {
        Ok(state) => short_name(state.as_str_name(), "WORKER_STATE_"),
        Err(_) => format!("state_{state}"),
    }
}

/// Strips the protobuf enum prefix and lowercases the rest.
pub fn short_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_lowercase()
}

/// Returns whether an execution in `state` is done for good (this run).
pub fn is_terminal(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Completed | ExecutionState::Failed | ExecutionState::Cancelled
    )
}

/// Formats an instant as `2026-11-02 14:03:07Z` (UTC); `-` for 0 (not set).
pub fn format_time(unix_ms: i64) -> String {
    if unix_ms == 0 {
        return "-".to_owned();
    }
    format!("{}Z", trellis_core::time::utc(unix_ms))
}

/// Formats a duration for people: `450ms`, `12.3s`, `4m05s`, `2h03m`.
pub fn format_duration_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// Returns the counts by state as a JSON object keyed by state name.
pub fn counts_json(counts: &TaskStateCounts) -> Value {
    json!({
        "pending": counts.pending,
        "queued": counts.queued,
        "blocked": counts.blocked,
        "running": counts.running,
        "waiting_for_subtasks": counts.waiting_for_subtasks,
        "waiting_for_human": counts.waiting_for_human,
        "retry_scheduled": counts.retry_scheduled,
        "completed": counts.completed,
        "failed": counts.failed,
        "skipped": counts.skipped,
        "cancelled": counts.cancelled,
    })
}

/// Returns the sum of every count.
pub fn total(counts: &TaskStateCounts) -> u64 {
    trellis_wire::read::counts_from_proto(counts).0.iter().sum()
}

/// Returns what was consumed as JSON.
pub fn usage_json(usage: Option<&Usage>) -> Value {
    let usage = usage.cloned().unwrap_or_default();
    json!({"tokens_used": usage.tokens_used, "cost": usage.cost})
}

/// Returns the first line of `text`, cut to `max_chars` with an ellipsis.
pub fn one_line(text: &str, max_chars: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= max_chars && !text.contains('\n') {
        return line.to_owned();
    }
    let mut cut: String = line.chars().take(max_chars).collect();
    cut.push('…');
    cut
}

/// Lays rows out in columns as wide as their widest cell; the last column is not padded.
pub fn table<const N: usize>(header: &[String; N], rows: &[[String; N]]) -> String {
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut res = String::new();
    for row in std::iter::once(header).chain(rows) {
        let mut line = String::new();
        for (col, (cell, width)) in row.iter().zip(widths).enumerate() {
            if col + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  "));
            }
        }
        res.push_str(line.trim_end());
        res.push('\n');
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(format_time(0), "-");
        assert_eq!(format_time(1), "1970-01-01 00:00:00Z");
        assert_eq!(format_time(1_709_251_199_000), "2024-02-29 23:59:59Z");
        assert_eq!(format_time(1_793_628_187_000), "2026-11-02 14:03:07Z");
    }

    #[test]
    fn durations() {
        assert_eq!(format_duration_ms(450), "450ms");
        assert_eq!(format_duration_ms(12_345), "12.3s");
        assert_eq!(format_duration_ms(245_000), "4m05s");
        assert_eq!(format_duration_ms(7_380_000), "2h03m");
    }

    #[test]
    fn state_names() {
        assert_eq!(
            task_state_name(TaskState::WaitingForSubtasks as i32),
            "waiting_for_subtasks"
        );
        assert_eq!(
            execution_state_name(ExecutionState::Completed as i32),
            "completed"
        );
        assert_eq!(task_state_name(99), "state_99");
    }

    #[test]
    fn one_line_cuts() {
        assert_eq!(one_line("short", 10), "short");
        assert_eq!(one_line("abcdef", 3), "abc…");
        assert_eq!(one_line("first\nsecond", 80), "first…");
    }
}
