//! Chains and subtask groups: an instance's completion (which spawns a plan task's static
//! subtasks after its first turn), groups spawned and settled exactly once with their resumed
//! parent, the outcome of a chain, and cancelling a chain with the groups it spawned.

use super::{
    Execution, ExecutionState, Group, GroupIdx, GroupRule, GroupSummary, InstIdx, Next, Origin,
    ResumeContext, SUMMARY_LIMIT, SlotStatus, TaskInstanceId, TaskState, Work,
};
use crate::ids::{GroupId, mix};
use crate::plan::TaskIdx;

impl Execution {
    pub(super) fn complete(
        &mut self,
        idx: InstIdx,
        output: serde_json::Value,
        at: u64,
        stop: &mut Vec<TaskInstanceId>,
    ) {
        // A plan task with static subtasks (`subtask_of`) spawns them when its first turn ends.
        if let Work::Plan(task_idx) = self.instances[idx as usize].work
            && self.instances[idx as usize].head == idx
            && !self.slots[task_idx].static_group_spawned
            && let Some(members) = self.plan.shape().static_members.get(&task_idx).cloned()
        {
            self.slots[task_idx].static_group_spawned = true;
            self.instances[idx as usize].output = Some(output);
            let group_id = GroupId::derived(
                at,
                mix(self.instances[idx as usize].id.0.as_u128(), &[0x5354_4154]),
            );
            let works = members.into_iter().map(Work::Plan).collect();
            self.spawn_group(idx, group_id, GroupRule::AllSettled, works, at, stop);
            return;
        }
        let inst = &mut self.instances[idx as usize];
        inst.output = Some(output);
        inst.ended_at_ms = Some(at);
        self.set_state(idx, TaskState::Completed);
        self.settle_chain(idx, at, stop);
    }

    pub(super) fn spawn_group(
        &mut self,
        parent: InstIdx,
        group_id: GroupId,
        rule: GroupRule,
        works: Vec<Work>,
        at: u64,
        stop: &mut Vec<TaskInstanceId>,
    ) {
        let group = self.groups.len() as GroupIdx;
        let first = self.instances.len() as InstIdx;
        let len = works.len() as u32;
        self.groups.push(Group {
            id: group_id,
            parent,
            rule,
            first,
            len,
            completed: 0,
            failed: 0,
            cancelled: 0,
            settled: false,
            resumed: None,
            abandoned: false,
        });
        self.group_by_id.insert(group_id, group);
        self.set_state(parent, TaskState::WaitingForSubtasks);
        self.instances[parent as usize].next = Some(Next::Group(group));
        let base = group_id.0.as_u128();
        for (member_idx, work) in works.into_iter().enumerate() {
            let id = TaskInstanceId::derived(at, mix(base, &[member_idx as u64]));
            let plan_member = match work {
                Work::Plan(task_idx) => Some(task_idx),
                Work::Dynamic(_) => None,
            };
            let idx = self.new_instance(id, work, Origin::Member { group }, None, at);
            if let Some(task_idx) = plan_member {
                self.slots[task_idx].status = SlotStatus::Active;
                self.slots[task_idx].head = Some(idx);
            }
            self.set_state(idx, TaskState::Queued);
        }
        if len == 0 {
            self.settle_group(group, at, stop);
        }
    }

    /// Called when an instance reached a terminal state with nothing after it: its chain is done.
    pub(super) fn settle_chain(&mut self, idx: InstIdx, at: u64, stop: &mut Vec<TaskInstanceId>) {
        let state = self.instances[idx as usize].state;
        let head = self.instances[idx as usize].head;
        let origin = self.instances[head as usize].origin;
        if let Work::Plan(task_idx) = self.instances[head as usize].work {
            self.slots[task_idx].result = Some(idx);
            let ok = matches!(state, TaskState::Completed | TaskState::Skipped);
            let continue_on_failure = self.plan.options.failure.continue_on_partial_failure;
            let is_member = matches!(origin, Origin::Member { .. });
            if !is_member
                && !continue_on_failure
                && state != TaskState::Completed
                && state != TaskState::Cancelled
            {
                let task = &self.plan.tasks[task_idx].id;
                let error = self.instances[idx as usize]
                    .error
                    .clone()
                    .unwrap_or_default();
                let reason = format!("task {task} {}: {error}", state.as_str());
                let mut settle = Vec::new();
                self.mark_done(task_idx, state, false, &mut settle);
                self.terminate(ExecutionState::Failed, reason, at, stop);
                return;
            }
            let mut settle = Vec::new();
            self.mark_done(
                task_idx,
                state,
                ok && state != TaskState::Cancelled,
                &mut settle,
            );
            self.release(settle, at);
        }
        if let Origin::Member { group } = origin {
            let g = &mut self.groups[group as usize];
            if g.settled {
                return;
            }
            match state {
                TaskState::Completed => g.completed += 1,
                TaskState::Cancelled => g.cancelled += 1,
                _ => g.failed += 1,
            }
            let settled = g.completed + g.failed + g.cancelled;
            let done = match g.rule {
                GroupRule::AllSettled => settled == g.len,
                GroupRule::AllSucceeded => g.failed + g.cancelled > 0 || settled == g.len,
                GroupRule::Quorum(k) => g.completed >= k || g.len - (g.failed + g.cancelled) < k,
                GroupRule::FirstSuccess => g.completed >= 1 || settled == g.len,
            };
            if done {
                self.settle_group(group, at, stop);
            }
        }
    }

    /// Settles a group exactly once: cancels members still running and resumes the parent.
    fn settle_group(&mut self, group: GroupIdx, at: u64, stop: &mut Vec<TaskInstanceId>) {
        if self.groups[group as usize].settled {
            return;
        }
        self.groups[group as usize].settled = true;
        let Group {
            id,
            parent,
            rule,
            first,
            len,
            ..
        } = self.groups[group as usize].clone();
        for member in first..first + len {
            self.cancel_chain(member, at, stop);
        }
        let g = &self.groups[group as usize];
        let succeeded = match rule {
            GroupRule::AllSettled => true,
            GroupRule::AllSucceeded => g.completed == g.len,
            GroupRule::Quorum(k) => g.completed >= k,
            GroupRule::FirstSuccess => g.completed >= 1,
        };
        let mut summary = GroupSummary {
            group: id,
            rule,
            succeeded,
            members: len,
            completed: g.completed,
            failed: g.failed,
            cancelled: len - g.completed - g.failed,
            failed_members: Vec::new(),
            outputs: Vec::new(),
            outputs_truncated: len as usize > SUMMARY_LIMIT,
        };
        for member in first..first + len {
            let (state, result) = self.chain_result(member);
            if state == TaskState::Failed && summary.failed_members.len() < SUMMARY_LIMIT {
                summary
                    .failed_members
                    .push(self.instances[member as usize].id);
            }
            if summary.outputs.len() < SUMMARY_LIMIT {
                summary.outputs.push(result);
            }
        }
        let parent_inst = &self.instances[parent as usize];
        let parent_work = parent_inst.work.clone();
        let head = parent_inst.head;
        self.instances[parent as usize].ended_at_ms = Some(at);
        self.set_state(parent, TaskState::Completed);
        if self.state.is_terminal() {
            return;
        }
        let seed = mix(id.0.as_u128(), &[0x5245_5355_4d45]);
        let resumed = self.new_instance(
            TaskInstanceId::derived(at, seed),
            parent_work,
            Origin::Resumed { group },
            Some(head),
            at,
        );
        self.instances[resumed as usize].resume = Some(Box::new(ResumeContext::Group(summary)));
        self.groups[group as usize].resumed = Some(resumed);
        self.set_state(resumed, TaskState::Queued);
    }

    /// Returns the final state and output of the chain starting at `idx`.
    fn chain_result(&self, mut idx: InstIdx) -> (TaskState, Option<serde_json::Value>) {
        loop {
            let inst = &self.instances[idx as usize];
            match inst.next {
                Some(Next::Instance(next)) => idx = next,
                Some(Next::Group(group)) => match self.groups[group as usize].resumed {
                    Some(resumed) => idx = resumed,
                    None => return (inst.state, inst.output.clone()),
                },
                None => return (inst.state, inst.output.clone()),
            }
        }
    }

    /// Cancels every unsettled instance of the chain starting at `idx`, and of the groups it
    /// spawned, iteratively.
    fn cancel_chain(&mut self, idx: InstIdx, at: u64, stop: &mut Vec<TaskInstanceId>) {
        let mut work = vec![idx];
        while let Some(idx) = work.pop() {
            let inst = &self.instances[idx as usize];
            let state = inst.state;
            match inst.next {
                Some(Next::Instance(next)) => work.push(next),
                Some(Next::Group(group)) => {
                    let g = &mut self.groups[group as usize];
                    if !g.settled {
                        g.settled = true;
                        g.abandoned = true;
                        work.extend(g.first..g.first + g.len);
                    }
                    if let Some(resumed) = g.resumed {
                        work.push(resumed);
                    }
                }
                None => {}
            }
            if state.is_terminal() {
                continue;
            }
            if state == TaskState::Running {
                self.end_turn(idx);
                stop.push(self.instances[idx as usize].id);
            }
            if state == TaskState::WaitingForHuman {
                // Its question goes with it: an answer or an expiry must not continue a
                // cancelled instance.
                self.withdraw_question_of(idx);
            }
            self.instances[idx as usize].ended_at_ms = Some(at);
            self.set_state(idx, TaskState::Cancelled);
            if let Some(task_idx) = self.plan_task_of_member(idx) {
                let mut settle = Vec::new();
                self.mark_done(task_idx, TaskState::Cancelled, false, &mut settle);
            }
        }
    }

    fn plan_task_of_member(&self, idx: InstIdx) -> Option<TaskIdx> {
        let inst = &self.instances[idx as usize];
        match (&inst.work, inst.origin) {
            (Work::Plan(task_idx), Origin::Member { .. }) => Some(*task_idx),
            _ => None,
        }
    }
}
