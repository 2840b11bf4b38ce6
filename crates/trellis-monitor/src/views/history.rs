//! A plan's history across its executions: the grid of the monitor's `#/plans/<name>` page.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use trellis_core::record::TaskState;
use trellis_proto::v1;
use trellis_wire::read;

use super::execution_state_name;

/// One execution of a plan's history grid: a column.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HistoryColumn {
    pub id: String,
    pub created_ms: i64,
    pub state: &'static str,
    pub run_number: u32,
}

/// A plan's recent executions (columns, newest first) by its tasks (rows): each cell the task's
/// final state in that execution, `None` where the task has no instance there (not reached yet,
/// not in that version of the plan, or not in the read model yet).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PlanHistory {
    pub plan: String,
    pub executions: Vec<HistoryColumn>,
    pub tasks: Vec<String>,
    pub cells: BTreeMap<String, Vec<Option<&'static str>>>,
}

impl PlanHistory {
    /// The grid of plan `plan` from its executions (newest first) and, for each, its task
    /// instances as the read model holds them. Rows come in the order the newest execution
    /// created their instances, then the tasks only older executions have.
    pub fn build(plan: &str, executions: &[(v1::Execution, Vec<v1::TaskInstance>)]) -> Self {
        let mut history = Self {
            plan: plan.to_owned(),
            ..Self::default()
        };
        let width = executions.len();
        for (column, (execution, instances)) in executions.iter().enumerate() {
            history.executions.push(HistoryColumn {
                id: execution.execution_id.clone(),
                created_ms: execution.created_at_unix_ms,
                state: execution_state_name(execution.state),
                run_number: execution.run_number,
            });
            let mut finals = final_task_states(instances);
            // A task a `route:` skipped has no instance; the coordinator names it.
            for skipped in &execution.skipped {
                if !finals.iter().any(|(task, _)| *task == skipped.task_id) {
                    finals.push((skipped.task_id.clone(), TaskState::Skipped.as_str()));
                }
            }
            for (task, state) in finals {
                let row = history.cells.entry(task.clone()).or_insert_with(|| {
                    history.tasks.push(task);
                    vec![None; width]
                });
                row[column] = Some(state);
            }
        }
        history
    }
}

/// Whether `instance` is the first of a plan task's chain: a member of the root's group, whose id
/// is the root's own.
fn is_plan_task(instance: &v1::TaskInstance) -> bool {
    instance.parent_task_instance_id.is_some()
        && instance.parent_task_instance_id == instance.subtask_group_id
}

/// The final state of each plan task among an execution's task instances (every run), in the
/// order the tasks' first instances were created.
///
/// A plan task's instances form a chain: the instance the plan started, then the instance that
/// continued it after a human answer or as a fallback, or the parent resumed after its subtasks;
/// a retry run starts a new chain. The newest instance of any of its chains holds the task's
/// state. Members of subtask groups are not plan tasks and have no row; the root record standing
/// for the execution neither.
pub fn final_task_states(instances: &[v1::TaskInstance]) -> Vec<(String, &'static str)> {
    let mut sorted: Vec<&v1::TaskInstance> = instances.iter().collect();
    // Instance ids are UUIDv7: their order is creation order.
    sorted.sort_by(|a, b| a.task_instance_id.cmp(&b.task_instance_id));
    let group_parents: HashMap<&str, &str> = sorted
        .iter()
        .filter(|i| !is_plan_task(i))
        .filter_map(|i| {
            Some((
                i.subtask_group_id.as_deref()?,
                i.parent_task_instance_id.as_deref()?,
            ))
        })
        .collect();
    // Instance id -> the plan task whose chain it is on.
    let mut chain_of: HashMap<&str, &str> = HashMap::new();
    let mut order: Vec<(String, &'static str)> = Vec::new();
    let mut row_of: HashMap<&str, usize> = HashMap::new();
    for instance in sorted {
        let task = if is_plan_task(instance) {
            Some(instance.task_id.as_str())
        } else if let Some(previous) = instance.continues_task_instance_id.as_deref() {
            chain_of.get(previous).copied()
        } else if let Some(group) = instance.resumed_after_subtasks_group_id.as_deref() {
            group_parents
                .get(group)
                .and_then(|parent| chain_of.get(parent))
                .copied()
        } else {
            None
        };
        let Some(task) = task else { continue };
        chain_of.insert(instance.task_instance_id.as_str(), task);
        let state =
            read::task_state_from_proto(instance.state).map_or("pending", |state| state.as_str());
        match row_of.get(task) {
            Some(&row) => order[row].1 = state,
            None => {
                row_of.insert(task, order.len());
                order.push((task.to_owned(), state));
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance `id` of `task` in `state`; `parent`/`group` make it a member (the root's group
    /// for a plan task).
    fn instance(id: &str, task: &str, state: v1::TaskState) -> v1::TaskInstance {
        v1::TaskInstance {
            task_instance_id: id.to_owned(),
            task_id: task.to_owned(),
            state: state as i32,
            ..v1::TaskInstance::default()
        }
    }

    fn member(mut i: v1::TaskInstance, parent: &str, group: &str) -> v1::TaskInstance {
        i.parent_task_instance_id = Some(parent.to_owned());
        i.subtask_group_id = Some(group.to_owned());
        i
    }

    /// Root `00`; `a` fails in run 1 and completes in run 2; `b` spawns `child` in group `g` and
    /// resumes; `c` asks a question and continues; `child` continues after a question too.
    fn instances_of_two_runs() -> Vec<v1::TaskInstance> {
        use v1::TaskState::{Completed, Failed, Running, WaitingForHuman, WaitingForSubtasks};
        let mut resumed = instance("06", "b", Completed);
        resumed.resumed_after_subtasks_group_id = Some("g".to_owned());
        let mut continued = instance("07", "c", Running);
        continued.continues_task_instance_id = Some("03".to_owned());
        let mut child_continued = instance("05", "child", Completed);
        child_continued.continues_task_instance_id = Some("04".to_owned());
        vec![
            instance("00", "the-plan", Failed),
            member(instance("01", "a", Failed), "00", "00"),
            member(instance("02", "b", WaitingForSubtasks), "00", "00"),
            member(instance("03", "c", WaitingForHuman), "00", "00"),
            member(instance("04", "child", WaitingForHuman), "02", "g"),
            child_continued,
            resumed,
            continued,
            member(instance("08", "a", Completed), "00", "00"),
        ]
    }

    #[test]
    fn a_plan_task_ends_in_the_state_of_its_newest_instance() {
        let mut instances = instances_of_two_runs();
        // The store's order does not matter.
        instances.reverse();
        assert_eq!(
            final_task_states(&instances),
            [
                ("a".to_owned(), "completed"),
                ("b".to_owned(), "completed"),
                ("c".to_owned(), "running"),
            ]
        );
        assert!(final_task_states(&[]).is_empty());
    }

    #[test]
    fn history_lines_up_tasks_across_executions() {
        use v1::TaskState::{Completed, Failed};
        let execution = |id: &str, state: v1::ExecutionState| v1::Execution {
            execution_id: id.to_owned(),
            state: state as i32,
            run_number: 1,
            created_at_unix_ms: 1_000,
            ..v1::Execution::default()
        };
        let mut newest = execution("e2", v1::ExecutionState::Failed);
        newest.skipped = vec![v1::SkippedTask {
            task_id: "notify".to_owned(),
            reason: "route".to_owned(),
        }];
        let grid = PlanHistory::build(
            "nightly",
            &[
                (
                    newest,
                    vec![
                        member(instance("11", "build", Completed), "10", "10"),
                        member(instance("12", "test", Failed), "10", "10"),
                    ],
                ),
                (
                    execution("e1", v1::ExecutionState::Completed),
                    vec![
                        member(instance("01", "lint", Completed), "00", "00"),
                        member(instance("02", "build", Completed), "00", "00"),
                        member(instance("03", "test", Completed), "00", "00"),
                    ],
                ),
            ],
        );
        assert_eq!(grid.tasks, ["build", "test", "notify", "lint"]);
        assert_eq!(grid.cells["test"], [Some("failed"), Some("completed")]);
        assert_eq!(grid.cells["notify"], [Some("skipped"), None]);
        assert_eq!(grid.cells["lint"], [None, Some("completed")]);
        assert_eq!(grid.executions[0].state, "failed");
        assert_eq!(grid.executions[1].id, "e1");
    }
}
