//! Applying events: [`Execution::apply`] checks an event against the rules and hands it to the
//! function of its kind. This file holds the reports of workers about an attempt (dispatched,
//! started, step checkpointed, completed, failed, timed out, lost, subtasks spawned, question
//! asked) and the checks they share; requests and the execution's own transitions are in
//! `control.rs`.
//!
//! A handler either refuses the event with an [`ApplyError`] before changing anything, or applies
//! all of it; a duplicate or late report is [`Applied::Ignored`].

use serde_json::Value;

use super::{
    Applied, ApplyError, Event, EventBody, Execution, ExecutionState, GroupRule, Ignored, InstIdx,
    OpenQuestion, Question, StepRecord, SubtaskSpec, TaskState, Usage, Work, invalid_execution,
};
use crate::ids::{GroupId, TaskInstanceId, WorkerId};
use crate::record::CheckResult;

impl Execution {
    /// Applies one event. Deterministic; on error nothing changed.
    pub fn apply(&mut self, event: &Event) -> Result<Applied, ApplyError> {
        let at = event.at_ms;
        match &event.body {
            EventBody::TaskDispatched { instance, attempt } => {
                self.on_task_dispatched(*instance, *attempt, at)
            }
            EventBody::TaskStarted {
                instance,
                attempt,
                worker,
            } => self.on_task_started(*instance, *attempt, worker, at),
            EventBody::TaskValidated {
                instance,
                attempt,
                results,
            } => self.on_task_validated(*instance, *attempt, results),
            EventBody::StepCheckpointed {
                instance,
                attempt,
                step,
                state,
            } => self.on_step_checkpointed(*instance, *attempt, step, state),
            EventBody::TaskCompleted {
                instance,
                attempt,
                output,
                usage,
            } => self.on_task_completed(*instance, *attempt, output, *usage, at),
            EventBody::TaskFailed {
                instance,
                attempt,
                error,
                retryable,
                usage,
            } => self.on_task_failed(*instance, *attempt, error, *retryable, *usage, at),
            EventBody::TaskTimedOut { instance, attempt } => {
                self.on_task_timed_out(*instance, *attempt, at)
            }
            EventBody::TaskLost { instance, attempt } => self.on_task_lost(*instance, *attempt, at),
            EventBody::TaskPreempted { instance, attempt } => {
                self.on_task_preempted(*instance, *attempt, at)
            }
            EventBody::SubtasksSpawned {
                instance,
                attempt,
                group,
                rule,
                members,
            } => self.on_subtasks_spawned(*instance, *attempt, *group, *rule, members, at),
            EventBody::QuestionAsked {
                instance,
                attempt,
                question,
            } => self.on_question_asked(*instance, *attempt, question),
            EventBody::QuestionAnswered { question, answer } => {
                self.on_question_answered(*question, answer, at)
            }
            EventBody::QuestionExpired { question } => self.on_question_expired(*question, at),
            EventBody::PauseRequested {
                reason,
                scope,
                mode,
            } => self.on_pause_requested(reason, scope, *mode, at),
            EventBody::ResumeRequested { scope } => self.on_resume_requested(scope),
            EventBody::CancelRequested { reason } => self.on_cancel_requested(reason, at),
            EventBody::BudgetExhausted { reason } => self.on_budget_exhausted(reason, at),
            EventBody::ExecutionTimedOut => self.on_execution_timed_out(at),
            EventBody::ExecutionFinished { outcome } => self.on_execution_finished(*outcome, at),
            EventBody::RunStarted { run } => self.on_run_started(*run, at),
            // The claim is for the log's sake; the execution is as it was.
            EventBody::ExecutionClaimed { .. } => Ok(Applied::Changed { stop: Vec::new() }),
        }
    }

    fn on_task_dispatched(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let idx = self.instance_idx(instance)?;
        if let Some(ignored) = self.check_dispatch(idx, attempt, at)? {
            return Ok(Applied::Ignored(ignored));
        }
        self.dispatch(idx, at);
        Ok(Applied::Changed { stop: Vec::new() })
    }

    /// A worker took the attempt at `at` (its own clock, never before the dispatch). A second
    /// report from the same worker is a duplicate; one from another worker (the message was
    /// delivered again after the first one died) names the worker running it now.
    fn on_task_started(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        worker: &WorkerId,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "task_started")? else {
            return Ok(Applied::Ignored(Ignored::StaleAttempt));
        };
        let inst = &mut self.instances[idx as usize];
        if inst.worker.as_ref() == Some(worker) {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        }
        let first = inst.worker.replace(worker.clone()).is_none();
        inst.started_at_ms = Some(inst.dispatched_at_ms.map_or(at, |d| at.max(d)));
        self.started += u32::from(first);
        self.changed.0.push(idx);
        Ok(Applied::Changed { stop: Vec::new() })
    }

    fn on_task_validated(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        results: &[CheckResult],
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "task_validated")? else {
            return Ok(Applied::Ignored(Ignored::StaleAttempt));
        };
        let inst = &mut self.instances[idx as usize];
        if inst.validation == results {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        }
        inst.validation = results.to_vec();
        self.changed.0.push(idx);
        Ok(Applied::Changed { stop: Vec::new() })
    }

    fn on_step_checkpointed(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        step: &str,
        state: &Value,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "step_checkpointed")? else {
            return Ok(Applied::Ignored(Ignored::StaleAttempt));
        };
        let inst = &mut self.instances[idx as usize];
        if inst.steps.iter().any(|s| s.step == step) {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        }
        inst.steps.push(StepRecord {
            step: step.to_owned(),
            state: state.clone(),
        });
        Ok(Applied::Changed { stop: Vec::new() })
    }

    fn on_task_completed(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        output: &Value,
        usage: Usage,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "task_completed")? else {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        };
        let mut stop = Vec::new();
        self.add_usage(usage);
        self.end_turn(idx);
        self.complete(idx, output.clone(), at, &mut stop);
        Ok(Applied::Changed { stop })
    }

    fn on_task_failed(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        error: &str,
        retryable: bool,
        usage: Usage,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "task_failed")? else {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        };
        let mut stop = Vec::new();
        self.add_usage(usage);
        self.end_turn(idx);
        self.fail(idx, error.to_owned(), retryable, at, &mut stop);
        Ok(Applied::Changed { stop })
    }

    fn on_task_timed_out(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "task_timed_out")? else {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        };
        if self.instances[idx as usize]
            .deadline_ms
            .is_none_or(|d| d > at)
        {
            return Err(ApplyError::DeadlineNotReached { instance });
        }
        self.end_turn(idx);
        let mut stop = vec![instance];
        let error = "timed out".to_owned();
        self.fail(idx, error, true, at, &mut stop);
        Ok(Applied::Changed { stop })
    }

    fn on_task_lost(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "task_lost")? else {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        };
        self.end_turn(idx);
        self.archive_attempt(idx, at, "its worker was lost".to_owned());
        let inst = &mut self.instances[idx as usize];
        inst.avoid_worker = inst.worker.take();
        inst.lost = inst.lost.saturating_add(1);
        self.schedule_retry(idx, at);
        Ok(Applied::Changed { stop: Vec::new() })
    }

    /// The attempt stopped at a step boundary because a pause asked it to: it runs again, with
    /// its recorded steps, once nothing holds it; no retry of its escalation chain is used.
    fn on_task_preempted(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "task_preempted")? else {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        };
        self.end_turn(idx);
        self.archive_attempt(idx, at, "stopped at a step boundary by a pause".to_owned());
        self.instances[idx as usize].worker = None;
        self.schedule_retry(idx, at);
        Ok(Applied::Changed { stop: Vec::new() })
    }

    fn on_subtasks_spawned(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        group: GroupId,
        rule: GroupRule,
        members: &[SubtaskSpec],
        at: u64,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "subtasks_spawned")? else {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        };
        if self.group_by_id.contains_key(&group) {
            return Err(ApplyError::GroupIdReused(group));
        }
        // A group is known to the records only through its members (seed 000), so an
        // empty one could never be linked to its resumed parent.
        if members.is_empty() {
            return Err(ApplyError::EmptyGroup(group));
        }
        if let GroupRule::Quorum(k) = rule
            && (k == 0 || k as usize > members.len())
        {
            return Err(ApplyError::InvalidQuorum {
                k,
                members: members.len(),
            });
        }
        let mut stop = Vec::new();
        self.end_turn(idx);
        let works = members
            .iter()
            .map(|spec| Work::Dynamic(Box::new(spec.clone())))
            .collect();
        self.spawn_group(idx, group, rule, works, at, &mut stop);
        Ok(Applied::Changed { stop })
    }

    fn on_question_asked(
        &mut self,
        instance: TaskInstanceId,
        attempt: u32,
        question: &Question,
    ) -> Result<Applied, ApplyError> {
        let Ok(idx) = self.running_attempt(instance, attempt, "question_asked")? else {
            return Ok(Applied::Ignored(Ignored::Duplicate));
        };
        if self.questions.contains_key(&question.id) {
            return Err(ApplyError::QuestionIdReused(question.id));
        }
        self.end_turn(idx);
        self.set_state(idx, TaskState::WaitingForHuman);
        if let Some(expiry) = question.expires_at_ms {
            self.expiries.insert((expiry, question.id));
        }
        self.questions.insert(
            question.id,
            OpenQuestion {
                instance: idx,
                question: question.clone(),
                answered: false,
            },
        );
        self.open_questions += 1;
        if self.plan.options.pause_on_human_review && self.state == ExecutionState::Running {
            self.state = ExecutionState::WaitingForHuman;
        }
        Ok(Applied::Changed { stop: Vec::new() })
    }

    fn instance_idx(&self, instance: TaskInstanceId) -> Result<InstIdx, ApplyError> {
        self.by_id
            .get(&instance)
            .copied()
            .ok_or(ApplyError::UnknownInstance(instance))
    }

    /// Checks that a worker's report is for the running attempt. `Ok(Err(()))` means the report is
    /// a duplicate or late and must be ignored.
    fn running_attempt(
        &self,
        instance: TaskInstanceId,
        attempt: u32,
        event: &'static str,
    ) -> Result<Result<InstIdx, ()>, ApplyError> {
        let idx = self.instance_idx(instance)?;
        let inst = &self.instances[idx as usize];
        if attempt > inst.attempt {
            return Err(ApplyError::AttemptNotDispatched {
                instance,
                attempt,
                current: inst.attempt,
            });
        }
        if attempt < inst.attempt || inst.state != TaskState::Running {
            if attempt == 0 {
                return Err(ApplyError::InvalidTaskTransition {
                    instance,
                    state: inst.state.as_str(),
                    event,
                });
            }
            return Ok(Err(()));
        }
        Ok(Ok(idx))
    }

    fn check_dispatch(
        &self,
        idx: InstIdx,
        attempt: u32,
        at: u64,
    ) -> Result<Option<Ignored>, ApplyError> {
        let inst = &self.instances[idx as usize];
        if attempt <= inst.attempt {
            return Ok(Some(Ignored::Duplicate));
        }
        if attempt != inst.attempt + 1 {
            return Err(ApplyError::AttemptNotDispatched {
                instance: inst.id,
                attempt,
                current: inst.attempt,
            });
        }
        match inst.state {
            TaskState::Queued => {}
            TaskState::RetryScheduled if inst.not_before_ms <= at => {}
            TaskState::RetryScheduled => {
                return Err(ApplyError::RetryNotDue {
                    instance: inst.id,
                    not_before_ms: inst.not_before_ms,
                });
            }
            state => {
                return Err(ApplyError::InvalidTaskTransition {
                    instance: inst.id,
                    state: state.as_str(),
                    event: "task_dispatched",
                });
            }
        }
        if self.state != ExecutionState::Running {
            return Err(invalid_execution(self.state, "task_dispatched"));
        }
        if let Some(scope) = self.held(idx) {
            return Err(ApplyError::Held {
                instance: inst.id,
                scope,
            });
        }
        if let Some(limit) = self.plan.options.max_concurrency
            && self.running >= limit
        {
            return Err(ApplyError::ConcurrencyExceeded {
                instance: inst.id,
                limit,
            });
        }
        if let Some(lock) = self.lock_task_of(idx)
            && let Some(&holder) = self.plan.conflicts[lock]
                .iter()
                .find(|&&c| self.slots[c].locked)
        {
            return Err(ApplyError::PathLocked {
                instance: inst.id,
                holder: self.plan.tasks[holder].id.clone(),
            });
        }
        Ok(None)
    }
}
