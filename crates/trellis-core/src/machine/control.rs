//! Requests and the execution's own transitions: answers and expiries of questions, pause,
//! resume, cancel, an exhausted budget, the global timeout, the end of the execution and a new
//! run of a failed or cancelled one; with what they share (closing a question, ending the
//! execution).

use std::sync::Arc;

use super::{
    Applied, ApplyError, Execution, ExecutionState, Hold, Ignored, InstIdx, Next, Origin, Outcome,
    PauseMode, PauseScope, ResumeContext, Slot, SlotStatus, TaskState, TimeoutAction,
    invalid_execution,
};
use crate::ids::{QuestionId, TaskInstanceId, mix};
use crate::plan::BudgetAction;

impl Execution {
    pub(super) fn on_question_answered(
        &mut self,
        question: QuestionId,
        answer: &str,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let open = self
            .questions
            .get(&question)
            .ok_or(ApplyError::UnknownQuestion(question))?;
        if open.answered {
            return Ok(Applied::Ignored(self.closed_question(open.instance)));
        }
        self.require_live("question_answered")?;
        self.answer(question, answer.to_owned(), at);
        Ok(Applied::Changed { stop: Vec::new() })
    }

    pub(super) fn on_question_expired(
        &mut self,
        question: QuestionId,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let open = self
            .questions
            .get(&question)
            .ok_or(ApplyError::UnknownQuestion(question))?;
        if open.answered {
            return Ok(Applied::Ignored(self.closed_question(open.instance)));
        }
        if open.question.expires_at_ms.is_none_or(|e| e > at) {
            return Err(ApplyError::QuestionNotExpired(question));
        }
        self.require_live("question_expired")?;
        let instance = open.instance;
        let mut stop = Vec::new();
        match open.question.timeout_action.clone() {
            TimeoutAction::Answer(answer) => self.answer(question, answer, at),
            action => {
                self.close_question(question);
                let (state, error) = match action {
                    TimeoutAction::Skip => (TaskState::Skipped, "question expired; skipped"),
                    _ => (TaskState::Failed, "question expired unanswered"),
                };
                let inst = &mut self.instances[instance as usize];
                inst.error = Some(error.to_owned());
                inst.ended_at_ms = Some(at);
                self.set_state(instance, state);
                self.settle_chain(instance, at, &mut stop);
            }
        }
        Ok(Applied::Changed { stop })
    }

    pub(super) fn on_pause_requested(
        &mut self,
        reason: &str,
        scope: &PauseScope,
        mode: PauseMode,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let hold = Hold {
            reason: reason.to_owned(),
            mode,
            since_ms: at,
        };
        match scope {
            PauseScope::Execution => {
                match self.state {
                    ExecutionState::Running | ExecutionState::WaitingForHuman => {}
                    ExecutionState::Paused => return Ok(Applied::Ignored(Ignored::Duplicate)),
                    state => return Err(invalid_execution(state, "pause_requested")),
                }
                self.state = ExecutionState::Paused;
                self.reason = Some(reason.to_owned());
            }
            PauseScope::Task(task) => {
                self.require_live("pause_requested")?;
                if !self.plan.tasks.iter().any(|t| t.id == *task) {
                    return Err(ApplyError::UnknownTask(task.clone()));
                }
                if self.holds.tasks.contains_key(task) {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                }
                self.holds.tasks.insert(task.clone(), hold);
            }
            PauseScope::Group(group) => {
                self.require_live("pause_requested")?;
                if !self.group_by_id.contains_key(group) {
                    return Err(ApplyError::UnknownGroup(*group));
                }
                if self.holds.groups.contains_key(group) {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                }
                self.holds.groups.insert(*group, hold);
            }
        }
        Ok(Applied::Changed { stop: Vec::new() })
    }

    pub(super) fn on_resume_requested(
        &mut self,
        scope: &PauseScope,
    ) -> Result<Applied, ApplyError> {
        let released = match scope {
            PauseScope::Execution => {
                match self.state {
                    ExecutionState::Paused => {}
                    ExecutionState::Running | ExecutionState::WaitingForHuman => {
                        return Ok(Applied::Ignored(Ignored::Duplicate));
                    }
                    state => return Err(invalid_execution(state, "resume_requested")),
                }
                self.reason = None;
                if self.budget_tripped {
                    // Resumed past an exhausted budget: the budget counts again, one more of it.
                    self.budget_tripped = false;
                    self.budget_grants += 1;
                }
                self.state = if self.open_questions > 0 && self.plan.options.pause_on_human_review {
                    ExecutionState::WaitingForHuman
                } else {
                    ExecutionState::Running
                };
                return Ok(Applied::Changed { stop: Vec::new() });
            }
            PauseScope::Task(task) => {
                self.require_live("resume_requested")?;
                self.holds.tasks.remove(task).is_some()
            }
            PauseScope::Group(group) => {
                self.require_live("resume_requested")?;
                self.holds.groups.remove(group).is_some()
            }
        };
        Ok(if released {
            Applied::Changed { stop: Vec::new() }
        } else {
            Applied::Ignored(Ignored::Duplicate)
        })
    }

    pub(super) fn on_cancel_requested(
        &mut self,
        reason: &str,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        if self.state == ExecutionState::Cancelled {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        }
        self.require_live("cancel_requested")?;
        let mut stop = Vec::new();
        self.terminate(ExecutionState::Cancelled, reason.to_owned(), at, &mut stop);
        Ok(Applied::Changed { stop })
    }

    pub(super) fn on_budget_exhausted(
        &mut self,
        reason: &str,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        self.require_live("budget_exhausted")?;
        if self.budget_exceeded().is_none() {
            return Err(ApplyError::BudgetNotExhausted);
        }
        self.budget_tripped = true;
        let mut stop = Vec::new();
        match self.plan.options.budget.on_exhausted {
            BudgetAction::Pause => {
                self.state = ExecutionState::Paused;
                self.reason = Some(reason.to_owned());
            }
            BudgetAction::Fail => {
                self.terminate(ExecutionState::Failed, reason.to_owned(), at, &mut stop);
            }
        }
        Ok(Applied::Changed { stop })
    }

    pub(super) fn on_execution_timed_out(&mut self, at: u64) -> Result<Applied, ApplyError> {
        self.require_live("execution_timed_out")?;
        let timeout = self.plan.options.global_timeout;
        let mut stop = Vec::new();
        match timeout {
            Some(t) if at >= self.started_at_ms.saturating_add(t.as_millis() as u64) => {
                let reason = format!(
                    "global timeout of {} exceeded",
                    humantime::format_duration(t)
                );
                self.terminate(ExecutionState::Failed, reason, at, &mut stop);
            }
            _ => return Err(ApplyError::GlobalTimeoutNotReached),
        }
        Ok(Applied::Changed { stop })
    }

    pub(super) fn on_execution_finished(
        &mut self,
        outcome: Outcome,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        if self.state.is_terminal() && self.finish_due {
            // Ended by a request, a policy or a timeout: the log's last word, changing nothing.
            let actual = Outcome::of(self.state);
            if actual != Some(outcome) {
                return Err(ApplyError::CannotFinish {
                    claimed: outcome,
                    reason: format!("the execution ended {}", self.state.as_str()),
                });
            }
            self.finish_due = false;
            return Ok(Applied::Changed { stop: Vec::new() });
        }
        self.require_live("execution_finished")?;
        if outcome == Outcome::Cancelled {
            return Err(ApplyError::CannotFinish {
                claimed: outcome,
                reason: "only a cancel request cancels an execution".to_owned(),
            });
        }
        if self.open_slots > 0 {
            let reason = format!("{} not settled", tasks(self.open_slots));
            return Err(ApplyError::CannotFinish {
                claimed: outcome,
                reason,
            });
        }
        let actual = if self.failed_slots > 0 {
            Outcome::Failed
        } else {
            Outcome::Completed
        };
        if actual != outcome {
            let reason = format!("{} failed", tasks(self.failed_slots));
            return Err(ApplyError::CannotFinish {
                claimed: outcome,
                reason,
            });
        }
        self.state = outcome.into();
        self.ended_at_ms = Some(at);
        if actual == Outcome::Failed && self.reason.is_none() {
            self.reason = Some(format!("{} failed", tasks(self.failed_slots)));
        }
        Ok(Applied::Changed { stop: Vec::new() })
    }

    pub(super) fn on_run_started(&mut self, run: u32, at: u64) -> Result<Applied, ApplyError> {
        if !matches!(
            self.state,
            ExecutionState::Failed | ExecutionState::Cancelled
        ) {
            return Err(invalid_execution(self.state, "run_started"));
        }
        if run != self.run_number + 1 {
            return Err(ApplyError::RunOutOfOrder {
                expected: self.run_number + 1,
                got: run,
            });
        }
        self.start_run(run, at);
        Ok(Applied::Changed { stop: Vec::new() })
    }

    /// Starts run `run` of a failed or cancelled execution (docs/design.md §4, "Execution runs"): plan
    /// tasks that settled acceptably keep their results; every other task is instantiated again
    /// (with ids of the new run) once its dependencies allow. The earlier runs' instances stay, as
    /// history.
    fn start_run(&mut self, run: u32, at: u64) {
        // A log written before every end was logged may start a run right after the end.
        self.finish_due = false;
        self.run_number = run;
        self.run_started_at_ms = at;
        self.state = ExecutionState::Running;
        self.reason = None;
        self.ended_at_ms = None;
        self.budget_tripped = false;
        self.failed_slots = 0;
        // Questions of the ended run died with their instances (`terminate` closed them; a
        // snapshot of an older version may still hold them open).
        self.close_all_questions();
        self.expiries.clear();
        let plan = Arc::clone(&self.plan);
        let n = self.slots.len();
        let mut reset: Vec<bool> = plan
            .tasks
            .iter()
            .zip(&self.slots)
            .map(|(task, slot)| {
                !task.is_fallback_only && !matches!(slot.status, SlotStatus::Done { ok: true, .. })
            })
            .collect();
        // A static subtask runs again with its parent, and only with it.
        for task_idx in 0..n {
            if let Some(parent) = plan.tasks[task_idx].subtask_of {
                reset[task_idx] = reset[parent];
            }
        }
        for task_idx in (0..n).filter(|&t| reset[t]) {
            self.slots[task_idx] = Slot {
                unmet: 0,
                status: SlotStatus::Waiting,
                head: None,
                result: None,
                locked: false,
                static_group_spawned: false,
            };
            self.open_slots += 1;
        }
        for task_idx in (0..n).filter(|&t| reset[t]) {
            self.slots[task_idx].unmet = plan.deps[task_idx]
                .iter()
                .filter(|&&dep| {
                    !matches!(self.slots[dep].status, SlotStatus::Done { ok: true, .. })
                })
                .count() as u32;
        }
        let mut settle = Vec::new();
        for task_idx in (0..n).filter(|&t| reset[t]) {
            if self.slots[task_idx].unmet == 0
                && plan.tasks[task_idx].subtask_of.is_none()
                && self.slots[task_idx].status == SlotStatus::Waiting
            {
                self.make_ready(task_idx, at, &mut settle);
            }
        }
        self.release(settle, at);
    }

    /// Why an answer or expiry of a closed question is ignored: it was answered (or expired)
    /// before, or withdrawn because the instance that asked it was cancelled.
    fn closed_question(&self, asker: InstIdx) -> Ignored {
        if self.instances[asker as usize].state == TaskState::Cancelled {
            Ignored::StaleAttempt
        } else {
            Ignored::Duplicate
        }
    }

    fn require_live(&self, event: &'static str) -> Result<(), ApplyError> {
        if self.state.is_terminal() {
            Err(invalid_execution(self.state, event))
        } else {
            Ok(())
        }
    }

    /// Closes the open question instance `idx` waits on, if any, because the instance is being
    /// cancelled. An instance waits on one question at most; the scan over the execution's
    /// questions runs only when a waiting instance is cancelled.
    pub(super) fn withdraw_question_of(&mut self, idx: InstIdx) {
        let open = self
            .questions
            .iter()
            .find(|(_, open)| open.instance == idx && !open.answered)
            .map(|(id, _)| *id);
        if let Some(question) = open {
            self.close_question(question);
        }
    }

    /// Closes every question (the execution ended), leaving the execution's state as it is.
    fn close_all_questions(&mut self) {
        for open in self.questions.values_mut() {
            open.answered = true;
        }
        self.open_questions = 0;
    }

    fn close_question(&mut self, question: QuestionId) {
        if let Some(open) = self.questions.get_mut(&question) {
            open.answered = true;
            if let Some(expiry) = open.question.expires_at_ms {
                self.expiries.remove(&(expiry, question));
            }
            self.open_questions -= 1;
        }
        if self.open_questions == 0 && self.state == ExecutionState::WaitingForHuman {
            self.state = ExecutionState::Running;
        }
    }

    fn answer(&mut self, question: QuestionId, answer: String, at: u64) {
        let Some(open) = self.questions.get(&question) else {
            return;
        };
        let asker = open.instance;
        self.close_question(question);
        let inst = &self.instances[asker as usize];
        let work = inst.work.clone();
        let head = inst.head;
        self.instances[asker as usize].ended_at_ms = Some(at);
        self.set_state(asker, TaskState::Completed);
        let seed = mix(question.0.as_u128(), &[0x414e_5357]);
        let next = self.new_instance(
            TaskInstanceId::derived(at, seed),
            work,
            Origin::Continues { of: asker },
            Some(head),
            at,
        );
        self.instances[asker as usize].next = Some(Next::Instance(next));
        self.instances[next as usize].resume =
            Some(Box::new(ResumeContext::Answer { question, answer }));
        self.set_state(next, TaskState::Queued);
    }

    /// Ends the execution: every unsettled instance is cancelled (running ones are to be stopped).
    pub(super) fn terminate(
        &mut self,
        state: ExecutionState,
        reason: String,
        at: u64,
        stop: &mut Vec<TaskInstanceId>,
    ) {
        self.state = state;
        self.reason = Some(reason);
        self.ended_at_ms = Some(at);
        self.finish_due = true;
        for idx in 0..self.instances.len() as InstIdx {
            let (state, id) = (
                self.instances[idx as usize].state,
                self.instances[idx as usize].id,
            );
            if state.is_terminal() {
                continue;
            }
            if state == TaskState::Running {
                self.end_turn(idx);
                stop.push(id);
            }
            self.instances[idx as usize].ended_at_ms = Some(at);
            self.set_state(idx, TaskState::Cancelled);
        }
        for group in &mut self.groups {
            group.abandoned |= !group.settled;
            group.settled = true;
        }
        let mut ignored = Vec::new();
        for task_idx in 0..self.slots.len() {
            if !matches!(self.slots[task_idx].status, SlotStatus::Done { .. })
                && !self.plan.tasks[task_idx].is_fallback_only
            {
                self.mark_done(task_idx, TaskState::Cancelled, false, &mut ignored);
            }
        }
        // Its questions die with the instances that asked them.
        self.close_all_questions();
        self.deadlines.clear();
        self.expiries.clear();
        self.holds = Default::default();
    }
}

/// "1 task", "3 tasks".
fn tasks(n: u32) -> String {
    if n == 1 {
        "1 task".to_owned()
    } else {
        format!("{n} tasks")
    }
}
