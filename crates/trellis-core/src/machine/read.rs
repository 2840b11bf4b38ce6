//! Read projections of the state: progress, the seed-000 records (all, or those changed since the
//! last call), open questions, what a worker is handed for an attempt, and why a task was skipped.

use super::{
    AskedQuestion, Assignment, Execution, ExecutionState, GroupId, InstIdx, Instance, Next, Origin,
    Progress, Question, SlotStatus, TaskInstanceId, TaskState, Work,
};
use crate::ids::{QuestionId, mix};
use crate::plan::TaskIdx;
use crate::record::TaskStatusRecord;

impl Execution {
    /// Returns what a worker needs to run the instance's current attempt.
    pub fn assignment(&self, instance: TaskInstanceId) -> Option<Assignment<'_>> {
        let idx = *self.by_id.get(&instance)?;
        let inst = &self.instances[idx as usize];
        let (task_id, task_type, queue, input, checks, upstream, keep_output_inline) =
            match &inst.work {
                Work::Plan(task_idx) => {
                    let task = &self.plan.tasks[*task_idx];
                    (
                        task.id.as_str(),
                        task.task_type.as_str(),
                        task.queue.as_str(),
                        &task.input,
                        task.validate.as_slice(),
                        self.upstream(*task_idx),
                        self.is_router(*task_idx),
                    )
                }
                Work::Dynamic(spec) => (
                    spec.task_type.as_str(),
                    spec.task_type.as_str(),
                    spec.queue.as_deref().unwrap_or(&spec.task_type),
                    &spec.input,
                    &[][..],
                    Vec::new(),
                    false,
                ),
            };
        let (parent, group) = match inst.origin {
            Origin::Member { group } => {
                let g = &self.groups[group as usize];
                (Some(self.instances[g.parent as usize].id), Some(g.id))
            }
            _ => (None, None),
        };
        Some(Assignment {
            instance: inst.id,
            task_id,
            task_type,
            queue,
            input,
            attempt: inst.attempt.max(1),
            deadline_ms: inst.deadline_ms,
            avoid_worker: inst.avoid_worker.as_ref(),
            lost_deliveries: inst.lost,
            resume: inst.resume.as_deref(),
            steps: &inst.steps,
            parent,
            group,
            checks,
            upstream,
            keep_output_inline,
        })
    }

    /// Returns the outputs of the plan task's dependencies that completed, in dependency order.
    fn upstream(&self, task_idx: TaskIdx) -> Vec<(&str, &serde_json::Value)> {
        self.plan.deps[task_idx]
            .iter()
            .filter_map(|&dep| {
                let output = self.task_output(dep)?;
                Some((self.plan.tasks[dep].id.as_str(), output))
            })
            .collect()
    }

    /// Returns true when a `route:` of another task reads this task's output (the routed tasks
    /// depend on their router, so its dependents are where to look).
    fn is_router(&self, task_idx: TaskIdx) -> bool {
        self.plan.dependents[task_idx].iter().any(|&dependent| {
            self.plan.tasks[dependent]
                .condition
                .as_ref()
                .is_some_and(|condition| condition.router == task_idx)
        })
    }

    /// Returns the plan tasks a route skipped without running, in plan order, each with why
    /// ([`Self::skip_reason`]): they have no instance to show.
    pub fn routed_out(&self) -> Vec<(&str, String)> {
        self.plan
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| task.condition.is_some())
            .filter_map(|(idx, task)| Some((task.id.as_str(), self.skip_reason(idx)?)))
            .collect()
    }

    /// Returns why a settled plan task was skipped without running, when a route decided it
    /// (the route's deciding task and what its output held).
    pub fn skip_reason(&self, task_idx: TaskIdx) -> Option<String> {
        let condition = self.plan.tasks.get(task_idx)?.condition.as_ref()?;
        if !matches!(
            self.slots[task_idx].status,
            SlotStatus::Done {
                state: TaskState::Skipped,
                ok: true
            }
        ) || !self.route_skips(task_idx)
        {
            return None;
        }
        let router = &self.plan.tasks[condition.router].id;
        let pointer = if condition.pointer.is_empty() {
            "its output".to_owned()
        } else {
            format!("output {}", condition.pointer)
        };
        Some(match self.task_output(condition.router) {
            None => format!("not routed: route of {router:?} did not complete"),
            Some(output) => {
                let value = output
                    .pointer(&condition.pointer)
                    .map_or_else(|| "nothing".to_owned(), ToString::to_string);
                format!("not routed: route of {router:?} chose by {pointer} = {value}")
            }
        })
    }

    /// Returns a progress snapshot at `now_ms`.
    pub fn progress(&self, now_ms: u64) -> Progress {
        // Instances as their state holds them, but a queued one a conflicting task holds back,
        // which shows as blocked (only queued instances are in the ready set).
        let shape = self.plan.shape();
        let mut counts = self.by_state.clone();
        if shape.conflicts {
            for (_, idx) in self.ready.iter() {
                if self.display_state(idx) == TaskState::Blocked {
                    counts.sub(TaskState::Queued, 1);
                    counts.add(TaskState::Blocked, 1);
                }
            }
        }
        // Plan tasks without an instance: not reached yet (pending), decided out (a route, a
        // supersedes or duplicate_of relationship, a fallback not needed: settled ok, so done), or
        // left behind a failure (counted in their state, never done: a failed run does not read
        // 100%).
        let mut uninstantiated = 0u64;
        let mut decided_out = 0u64;
        let mut wave = shape.waves;
        for (task_idx, slot) in self.slots.iter().enumerate() {
            if slot.head.is_none() {
                match slot.status {
                    SlotStatus::Waiting | SlotStatus::Active => {
                        counts.add(TaskState::Pending, 1);
                        uninstantiated += 1;
                    }
                    SlotStatus::Done { state, ok } => {
                        counts.add(state, 1);
                        uninstantiated += 1;
                        decided_out += u64::from(ok);
                    }
                }
            }
            if !matches!(slot.status, SlotStatus::Done { .. }) && shape.wave_of[task_idx] > 0 {
                wave = wave.min(shape.wave_of[task_idx]);
            }
        }
        let total = self.instances.len() as u64 + uninstantiated;
        let done = self.settled_units + decided_out;
        let percent = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        let elapsed = now_ms.saturating_sub(self.started_at_ms);
        // Only while tasks run: a paused execution or one waiting for a person has no ETA.
        let eta_ms = (done > 0 && self.state == ExecutionState::Running)
            .then(|| (elapsed as u128 * u128::from(total - done) / u128::from(done)) as u64);
        Progress {
            state: self.state,
            counts,
            total,
            done,
            percent,
            eta_ms,
            wave,
            waves: shape.waves,
            reason: self.reason.clone().map(Into::into),
        }
    }

    fn display_state(&self, idx: InstIdx) -> TaskState {
        let inst = &self.instances[idx as usize];
        if inst.state == TaskState::Queued
            && let Some(lock) = self.lock_task_of(idx)
            && !self.slots[lock].locked
            && self.plan.conflicts[lock]
                .iter()
                .any(|&c| self.slots[c].locked)
        {
            return TaskState::Blocked;
        }
        inst.state
    }

    /// Returns one task instance's seed-000 record, if it exists.
    pub fn record(&self, instance: TaskInstanceId) -> Option<TaskStatusRecord> {
        self.by_id.get(&instance).map(|&idx| self.record_of(idx))
    }

    /// Returns every task instance as a seed-000 record, preceded by a root record standing for
    /// the execution itself: plan task instances are members of the root's group, so one execution
    /// is one tree.
    pub fn records(&self) -> Vec<TaskStatusRecord> {
        let mut records = Vec::with_capacity(self.instances.len() + 1);
        records.push(self.root_record());
        records.extend((0..self.instances.len() as InstIdx).map(|idx| self.record_of(idx)));
        records
    }

    /// Returns the root record and the records of the instances that changed since the last call
    /// (each once, in instance order): what a read model needs to stay current without a pass over
    /// every instance.
    pub fn take_changed_records(&mut self) -> Vec<TaskStatusRecord> {
        let mut changed = std::mem::take(&mut self.changed.0);
        changed.sort_unstable();
        changed.dedup();
        let mut records = Vec::with_capacity(changed.len() + 1);
        records.push(self.root_record());
        records.extend(changed.into_iter().map(|idx| self.record_of(idx)));
        records
    }

    fn root_record(&self) -> TaskStatusRecord {
        TaskStatusRecord {
            task_instance_id: self.root_instance_id(),
            task_id: self.plan.name.clone(),
            parent_task_instance_id: None,
            subtask_group_id: None,
            resumed_after_subtasks_group_id: None,
            continues_task_instance_id: None,
            correlation_id: self.id,
            run_number: self.run_number,
            attempt: 1,
            state: match self.state {
                ExecutionState::Completed => TaskState::Completed,
                ExecutionState::Failed => TaskState::Failed,
                ExecutionState::Cancelled => TaskState::Cancelled,
                _ => TaskState::WaitingForSubtasks,
            },
            worker_id: None,
            created_at_ms: self.started_at_ms,
            dispatched_at_ms: Some(self.started_at_ms),
            started_at_ms: Some(self.started_at_ms),
            ended_at_ms: self.ended_at_ms,
            output: None,
            error: self.reason.clone(),
            earlier_attempts: Vec::new(),
            validation: Vec::new(),
        }
    }

    fn record_of(&self, idx: InstIdx) -> TaskStatusRecord {
        let root_id = self.root_instance_id();
        let inst = &self.instances[idx as usize];
        let (parent, group, resumed_after, continues) = match inst.origin {
            Origin::Plan => (Some(root_id), Some(GroupId(root_id.0)), None, None),
            Origin::Member { group } => {
                let g = &self.groups[group as usize];
                (
                    Some(self.instances[g.parent as usize].id),
                    Some(g.id),
                    None,
                    None,
                )
            }
            Origin::Resumed { group } => (None, None, Some(self.groups[group as usize].id), None),
            Origin::Continues { of } => (None, None, None, Some(self.instances[of as usize].id)),
        };
        let task_id = self.task_id_of(inst);
        TaskStatusRecord {
            task_instance_id: inst.id,
            task_id,
            parent_task_instance_id: parent,
            subtask_group_id: group,
            resumed_after_subtasks_group_id: resumed_after,
            continues_task_instance_id: continues,
            correlation_id: self.id,
            run_number: inst.run,
            attempt: inst.attempt,
            state: self.display_state(idx),
            worker_id: inst.worker.clone(),
            created_at_ms: inst.created_at_ms,
            dispatched_at_ms: inst.dispatched_at_ms,
            started_at_ms: inst.started_at_ms,
            ended_at_ms: inst.ended_at_ms,
            output: inst.output.clone(),
            error: inst.error.clone(),
            earlier_attempts: inst.earlier_attempts.clone(),
            validation: inst.validation.clone(),
        }
    }

    /// The plan task id of an instance, or the handler type of a dynamic subtask.
    fn task_id_of(&self, inst: &Instance) -> String {
        match &inst.work {
            Work::Plan(task_idx) => self.plan.tasks[*task_idx].id.clone(),
            Work::Dynamic(spec) => spec.task_type.clone(),
        }
    }

    /// The questions waiting for an answer, oldest first (question ids are UUIDv7).
    pub fn open_questions(&self) -> Vec<AskedQuestion<'_>> {
        self.questions
            .values()
            .filter(|open| !open.answered)
            .map(|open| {
                let inst = &self.instances[open.instance as usize];
                AskedQuestion {
                    instance: inst.id,
                    task_id: self.task_id_of(inst),
                    question: &open.question,
                    // The machine keeps no time of its own for a question: the asking turn's
                    // start stands for it.
                    asked_at_ms: inst
                        .ended_at_ms
                        .or(inst.started_at_ms)
                        .or(inst.dispatched_at_ms)
                        .unwrap_or(inst.created_at_ms),
                }
            })
            .collect()
    }

    /// The question `id` while it waits for an answer.
    pub fn open_question(&self, id: QuestionId) -> Option<&Question> {
        self.questions
            .get(&id)
            .filter(|open| !open.answered)
            .map(|open| &open.question)
    }

    /// The instance that continues the task after `question` was answered; `None` while it is
    /// open, or when the question is unknown or expired.
    pub fn question_continuation(&self, question: QuestionId) -> Option<TaskInstanceId> {
        let open = self.questions.get(&question)?;
        match self.instances[open.instance as usize].next {
            Some(Next::Instance(next)) if open.answered => Some(self.instances[next as usize].id),
            _ => None,
        }
    }

    /// Returns the id of the root record that stands for the execution in [`Execution::records`].
    pub fn root_instance_id(&self) -> TaskInstanceId {
        TaskInstanceId::derived(
            self.started_at_ms,
            // The root stands for the execution across all its runs.
            mix(self.id.0.as_u128(), &[0x524f_4f54, 1]),
        )
    }
}
