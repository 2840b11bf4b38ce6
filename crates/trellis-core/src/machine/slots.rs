//! Plan tasks (slots): a task becomes ready once its dependencies settled acceptably, or settles
//! without running (a route that did not pick it, `supersedes`, `duplicate_of`, a failed
//! dependency); settling one releases its dependents, iteratively.

use std::sync::Arc;

use super::{Execution, Origin, SlotStatus, TaskState, Work};
use crate::ids::{TaskInstanceId, mix};
use crate::plan::{NotRun, TaskIdx};

impl Execution {
    /// Makes a plan task whose dependencies are met runnable; a task that is not to be run settles
    /// at once (and its dependents are pushed onto `settle`).
    pub(super) fn make_ready(&mut self, task_idx: TaskIdx, at: u64, settle: &mut Vec<TaskIdx>) {
        if self.route_skips(task_idx) {
            self.mark_done(task_idx, TaskState::Skipped, true, settle);
            return;
        }
        if let Some(not_run) = &self.plan.tasks[task_idx].not_run {
            let (state, result) = match *not_run {
                NotRun::DuplicateOf(original) => {
                    (TaskState::Completed, self.slots[original].result)
                }
                NotRun::SupersededBy(_) => (TaskState::Skipped, None),
            };
            self.slots[task_idx].result = result;
            self.mark_done(task_idx, state, true, settle);
            return;
        }
        let seed = mix(
            self.id.0.as_u128(),
            &[0x504c_414e, task_idx as u64, u64::from(self.run_number)],
        );
        let id = TaskInstanceId::derived(at, seed);
        let idx = self.new_instance(id, Work::Plan(task_idx), Origin::Plan, None, at);
        self.slots[task_idx].status = SlotStatus::Active;
        self.slots[task_idx].head = Some(idx);
        self.set_state(idx, TaskState::Queued);
    }

    pub(super) fn mark_done(
        &mut self,
        task_idx: TaskIdx,
        state: TaskState,
        ok: bool,
        settle: &mut Vec<TaskIdx>,
    ) {
        let slot = &mut self.slots[task_idx];
        if matches!(slot.status, SlotStatus::Done { .. }) {
            return;
        }
        slot.status = SlotStatus::Done { state, ok };
        slot.locked = false;
        self.open_slots -= 1;
        if !ok {
            self.failed_slots += u32::from(state != TaskState::Skipped);
        }
        let plan = Arc::clone(&self.plan);
        for &dependent in &plan.dependents[task_idx] {
            if ok {
                // Saturating: after a retry, a dependent kept from the previous run has no unmet
                // dependencies left to count down.
                let unmet = &mut self.slots[dependent].unmet;
                *unmet = unmet.saturating_sub(1);
                let routed_here = plan.tasks[dependent]
                    .condition
                    .as_ref()
                    .is_some_and(|c| c.router == task_idx);
                if (*unmet == 0 || routed_here) && plan.tasks[dependent].subtask_of.is_none() {
                    settle.push(dependent);
                }
            } else {
                settle.push(dependent);
            }
        }
        if !ok && let Some(members) = self.plan.shape().static_members.get(&task_idx) {
            settle.extend(members.iter().copied());
        }
        if state == TaskState::Failed {
            let why = self.slots[task_idx]
                .result
                .and_then(|idx| self.instances[idx as usize].error.clone())
                .unwrap_or_else(|| "it was not run".to_owned());
            for &target in &plan.tasks[task_idx].tests {
                if let SlotStatus::Done {
                    state: TaskState::Completed,
                    ..
                } = self.slots[target].status
                {
                    self.slots[target].status = SlotStatus::Done {
                        state: TaskState::Failed,
                        ok: false,
                    };
                    self.failed_slots += 1;
                    // Its record says so too: the instance that stood for it failed its tests.
                    if let Some(idx) = self.slots[target].result {
                        self.instances[idx as usize].error = Some(format!(
                            "completed, but {}, which tests it, failed: {why}",
                            plan.tasks[task_idx].id
                        ));
                        self.set_state(idx, TaskState::Failed);
                    }
                }
            }
        }
    }

    /// Works through plan tasks whose dependencies changed: ready ones are instantiated, those
    /// behind a failed dependency are skipped. Iterative, so long chains cannot overflow the stack.
    pub(super) fn release(&mut self, mut settle: Vec<TaskIdx>, at: u64) {
        while let Some(task_idx) = settle.pop() {
            if self.slots[task_idx].status != SlotStatus::Waiting {
                continue;
            }
            let blocked = self.plan.deps[task_idx]
                .iter()
                .chain(self.plan.tasks[task_idx].subtask_of.iter())
                .any(|&dep| matches!(self.slots[dep].status, SlotStatus::Done { ok: false, .. }));
            if blocked {
                self.mark_done(task_idx, TaskState::Skipped, false, &mut settle);
            } else if self.route_skips(task_idx) {
                // Not picked by its route: skipped at once, and its dependents go on as after
                // any skipped task.
                self.mark_done(task_idx, TaskState::Skipped, true, &mut settle);
            } else if self.slots[task_idx].unmet == 0
                && self.plan.tasks[task_idx].subtask_of.is_none()
            {
                self.make_ready(task_idx, at, &mut settle);
            }
        }
    }

    /// Returns true when the task is routed and its router has settled without picking it.
    pub(super) fn route_skips(&self, task_idx: TaskIdx) -> bool {
        let Some(condition) = &self.plan.tasks[task_idx].condition else {
            return false;
        };
        match self.slots[condition.router].status {
            SlotStatus::Done { .. } => !condition.holds(self.task_output(condition.router)),
            _ => false,
        }
    }

    /// Returns the output standing for a plan task that completed.
    pub(super) fn task_output(&self, task_idx: TaskIdx) -> Option<&serde_json::Value> {
        match self.slots[task_idx].status {
            SlotStatus::Done {
                state: TaskState::Completed,
                ..
            } => {
                let result = self.slots[task_idx].result?;
                self.instances[result as usize].output.as_ref()
            }
            _ => None,
        }
    }
}
