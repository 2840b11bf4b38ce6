//! Failure handling of an instance (docs/design.md §5): the escalation chain that applies to it
//! picks retry (after its backoff), reassign, pause, skip, abort or a fallback task run in its
//! place; an exhausted chain fails the instance and settles its chain.

use super::{Execution, ExecutionState, InstIdx, Next, Origin, TaskInstanceId, TaskState, Work};
use crate::ids::mix;
use crate::policy::{Escalation, EscalationChain, FailureAction};

impl Execution {
    pub(super) fn fail(
        &mut self,
        idx: InstIdx,
        error: String,
        retryable: bool,
        at: u64,
        stop: &mut Vec<TaskInstanceId>,
    ) {
        let chain = self.chain_of(idx);
        let position = self.instances[idx as usize].chain_position;
        let is_plan_chain = self.lock_task_of(idx).is_some();
        let inst = &mut self.instances[idx as usize];
        inst.error = Some(error.clone());
        let action = match chain.next(position, retryable) {
            Escalation::Act { action, next } => {
                inst.chain_position = next;
                Some(action)
            }
            Escalation::Exhausted => None,
        };
        if matches!(
            action,
            Some(FailureAction::Retry { .. } | FailureAction::Reassign | FailureAction::Pause)
        ) {
            // The instance runs again: this attempt joins its history.
            self.archive_attempt(idx, at, error.clone());
        }
        match action {
            Some(FailureAction::Retry { backoff, .. }) => {
                let retry = self.instances[idx as usize].chain_position.used;
                let entropy = mix(
                    self.instances[idx as usize].id.0.as_u128(),
                    &[u64::from(retry)],
                ) as u64;
                let delay = backoff.delay(retry, entropy).as_millis() as u64;
                self.schedule_retry(idx, at.saturating_add(delay));
            }
            Some(FailureAction::Reassign) => {
                let inst = &mut self.instances[idx as usize];
                inst.avoid_worker = inst.worker.take();
                self.schedule_retry(idx, at);
            }
            Some(FailureAction::Pause) => {
                self.schedule_retry(idx, at);
                if matches!(
                    self.state,
                    ExecutionState::Running | ExecutionState::WaitingForHuman
                ) {
                    self.state = ExecutionState::Paused;
                    let task = self
                        .assignment(self.instances[idx as usize].id)
                        .map(|a| a.task_id.to_owned());
                    self.reason =
                        Some(format!("task {} failed: {error}", task.unwrap_or_default()));
                }
            }
            Some(FailureAction::Skip) => {
                self.instances[idx as usize].ended_at_ms = Some(at);
                self.set_state(idx, TaskState::Skipped);
                self.settle_chain(idx, at, stop);
            }
            Some(FailureAction::Abort) => {
                self.instances[idx as usize].ended_at_ms = Some(at);
                self.set_state(idx, TaskState::Failed);
                let task = self
                    .assignment(self.instances[idx as usize].id)
                    .map(|a| a.task_id.to_owned());
                let reason = format!("aborted: task {} failed: {error}", task.unwrap_or_default());
                self.terminate(ExecutionState::Failed, reason, at, stop);
            }
            Some(FailureAction::Fallback { task }) if is_plan_chain => {
                self.instances[idx as usize].ended_at_ms = Some(at);
                self.set_state(idx, TaskState::Failed);
                let seed = mix(self.instances[idx as usize].id.0.as_u128(), &[0x4641_4c4c]);
                let head = self.instances[idx as usize].head;
                let position = self.instances[idx as usize].chain_position;
                let fallback = self.new_instance(
                    TaskInstanceId::derived(at, seed),
                    Work::Plan(task),
                    Origin::Continues { of: idx },
                    Some(head),
                    at,
                );
                self.instances[fallback as usize].chain_position = position;
                self.instances[idx as usize].next = Some(Next::Instance(fallback));
                self.set_state(fallback, TaskState::Queued);
            }
            Some(FailureAction::Fallback { .. }) | None => {
                self.instances[idx as usize].ended_at_ms = Some(at);
                self.set_state(idx, TaskState::Failed);
                self.settle_chain(idx, at, stop);
            }
        }
    }

    pub(super) fn schedule_retry(&mut self, idx: InstIdx, not_before: u64) {
        self.instances[idx as usize].not_before_ms = not_before;
        self.set_state(idx, TaskState::RetryScheduled);
    }

    fn chain_of(&self, idx: InstIdx) -> EscalationChain {
        let head = &self.instances[self.instances[idx as usize].head as usize];
        match &head.work {
            Work::Plan(task_idx) => self.plan.tasks[*task_idx].on_failure.clone(),
            Work::Dynamic(spec) => self.plan.options.failure.chain_for(&spec.task_type),
        }
    }
}
