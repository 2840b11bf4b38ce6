//! The execution state machine (docs/design.md §2, §4–§7).
//!
//! One [`Execution`] per running plan. Inputs are [`Event`]s: results reported by workers, requests
//! from people (pause, resume, cancel, answers) and the machine's own decisions. [`Execution::apply`]
//! is deterministic: the same events in the same order always give the same state, which is how an
//! execution is rebuilt after a crash. [`Execution::decide`] reads the state and the clock value it
//! is given and returns [`Command`]s; each command is recorded as an event (write-ahead) and then
//! applied like any other.
//!
//! The rules enforced here, whatever order or how often events arrive:
//! - a plan task is instantiated only when all of its dependencies have settled acceptably;
//! - `TaskDispatched` is refused when it would exceed `max_concurrency` or when a conflicting task
//!   (file conflict or `conflicts_with`) holds its path lock;
//! - a subtask group settles once and creates exactly one resumed parent;
//! - a result is applied only to the attempt it belongs to, and only once.
//!
//! Events that would break a rule are refused with an [`ApplyError`] and change nothing; duplicates
//! and late results are [`Applied::Ignored`].

mod event;
mod snapshot;
mod types;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use event::{
    Command, Event, EventBody, GroupRule, Outcome, Question, SubtaskSpec, TimeoutAction, Usage,
};
pub use snapshot::{SNAPSHOT_FORMAT_VERSION, SnapshotError};
pub use types::{
    Applied, ApplyError, Assignment, ExecutionState, GroupSummary, Ignored, Progress,
    ResumeContext, SUMMARY_LIMIT, StateCounts, StepRecord,
};

use crate::ids::{ExecutionId, GroupId, QuestionId, TaskInstanceId, WorkerId, mix};
use crate::plan::{NotRun, Plan, TaskIdx};
use crate::policy::{ChainPosition, Escalation, EscalationChain, FailureAction};
use crate::record::{TaskState, TaskStatusRecord};

type InstIdx = u32;
type GroupIdx = u32;

/// What an instance runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Work {
    /// A plan task (also a static subtask, a resumed plan task, or a fallback task).
    Plan(TaskIdx),
    /// A subtask spawned at run time.
    Dynamic(Box<SubtaskSpec>),
}

/// Why an instance exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Origin {
    /// The first instance of a plan task.
    Plan,
    /// Member `index` of a subtask group.
    Member { group: GroupIdx },
    /// The parent resumed after its group settled.
    Resumed { group: GroupIdx },
    /// Continues an instance directly (after an answer, or a fallback in its place).
    Continues { of: InstIdx },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Next {
    Group(GroupIdx),
    Instance(InstIdx),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Instance {
    id: TaskInstanceId,
    /// The execution run that created it.
    run: u32,
    work: Work,
    origin: Origin,
    /// The first instance of this chain (itself for a chain head). A chain's outcome is the
    /// outcome of its last instance.
    head: InstIdx,
    state: TaskState,
    /// The last dispatched attempt, 0 before the first dispatch.
    attempt: u32,
    worker: Option<WorkerId>,
    avoid_worker: Option<WorkerId>,
    created_at_ms: u64,
    started_at_ms: Option<u64>,
    ended_at_ms: Option<u64>,
    deadline_ms: Option<u64>,
    not_before_ms: u64,
    /// Key in the ready set while queued.
    ready_key: u64,
    chain_position: ChainPosition,
    output: Option<serde_json::Value>,
    error: Option<String>,
    next: Option<Next>,
    resume: Option<Box<ResumeContext>>,
    steps: Vec<StepRecord>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Group {
    id: GroupId,
    parent: InstIdx,
    rule: GroupRule,
    first: InstIdx,
    len: u32,
    completed: u32,
    failed: u32,
    cancelled: u32,
    settled: bool,
    /// The parent's resumed instance, once the group settled.
    resumed: Option<InstIdx>,
    /// Cancelled together with its parent's chain (or the execution): it resumes nothing.
    abandoned: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum SlotStatus {
    /// Dependencies not met.
    Waiting,
    /// Instantiated; its chain is running.
    Active,
    /// Settled; `ok` means dependents may proceed.
    Done { state: TaskState, ok: bool },
}

/// Per plan task bookkeeping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Slot {
    unmet: u32,
    status: SlotStatus,
    head: Option<InstIdx>,
    /// The instance whose output stands for the task once it settled.
    result: Option<InstIdx>,
    /// Holds its path lock: its chain was dispatched and has not settled.
    locked: bool,
    static_group_spawned: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct OpenQuestion {
    instance: InstIdx,
    question: Question,
    answered: bool,
}

/// A question waiting for an answer, as [`Execution::open_questions`] lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct AskedQuestion<'a> {
    /// The instance that asked.
    pub instance: TaskInstanceId,
    /// Its plan task id (the handler type for a dynamic subtask).
    pub task_id: String,
    pub question: &'a Question,
    /// When the asking instance started the turn in which it asked.
    pub asked_at_ms: u64,
}

/// The live state of one execution.
#[derive(Clone, Debug, PartialEq)]
pub struct Execution {
    id: ExecutionId,
    plan: Arc<Plan>,
    run_number: u32,
    state: ExecutionState,
    reason: Option<String>,
    started_at_ms: u64,
    /// When the current run started (the global timeout counts from here).
    run_started_at_ms: u64,
    ended_at_ms: Option<u64>,
    slots: Vec<Slot>,
    /// Plan tasks that must settle before the execution can finish.
    open_slots: u32,
    failed_slots: u32,
    /// Static subtask members per parent plan task (`subtask_of`).
    static_members: HashMap<TaskIdx, Vec<TaskIdx>>,
    wave_of: Vec<u32>,
    waves: u32,
    instances: Vec<Instance>,
    by_id: HashMap<TaskInstanceId, InstIdx>,
    groups: Vec<Group>,
    group_by_id: HashMap<GroupId, GroupIdx>,
    questions: BTreeMap<QuestionId, OpenQuestion>,
    open_questions: u32,
    ready: BTreeSet<(u64, InstIdx)>,
    next_ready_key: u64,
    retries: BTreeSet<(u64, InstIdx)>,
    deadlines: BTreeSet<(u64, InstIdx)>,
    expiries: BTreeSet<(u64, QuestionId)>,
    running: u32,
    usage: Usage,
    budget_tripped: bool,
    settled_units: u64,
    /// Instances whose record changed since [`Execution::take_changed_records`] last ran.
    changed: Changed,
}

/// Bookkeeping for readers of [`Execution::take_changed_records`]: not part of the state, so it
/// never makes two executions unequal and is not in snapshots.
#[derive(Clone, Debug, Default)]
struct Changed(Vec<InstIdx>);

impl PartialEq for Changed {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Execution {
    /// Starts an execution of `plan`: every task without dependencies becomes ready.
    pub fn start(id: ExecutionId, plan: Arc<Plan>, run_number: u32, at_ms: u64) -> Self {
        let n_tasks = plan.tasks.len();
        let mut static_members: HashMap<TaskIdx, Vec<TaskIdx>> = HashMap::new();
        for (task_idx, task) in plan.tasks.iter().enumerate() {
            if let Some(parent) = task.subtask_of {
                static_members.entry(parent).or_default().push(task_idx);
            }
        }
        let (wave_of, waves) = waves_of(&plan);
        let slots = plan
            .deps
            .iter()
            .map(|deps| Slot {
                unmet: deps.len() as u32,
                status: SlotStatus::Waiting,
                head: None,
                result: None,
                locked: false,
                static_group_spawned: false,
            })
            .collect();
        let mut execution = Self {
            id,
            plan: Arc::clone(&plan),
            run_number,
            state: ExecutionState::Running,
            reason: None,
            started_at_ms: at_ms,
            run_started_at_ms: at_ms,
            ended_at_ms: None,
            slots,
            open_slots: 0,
            failed_slots: 0,
            static_members,
            wave_of,
            waves,
            instances: Vec::with_capacity(n_tasks),
            by_id: HashMap::with_capacity(n_tasks),
            groups: Vec::new(),
            group_by_id: HashMap::new(),
            questions: BTreeMap::new(),
            open_questions: 0,
            ready: BTreeSet::new(),
            next_ready_key: 0,
            retries: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            expiries: BTreeSet::new(),
            running: 0,
            usage: Usage::default(),
            budget_tripped: false,
            settled_units: 0,
            changed: Changed::default(),
        };
        let mut fallback_only = Vec::new();
        let mut roots = Vec::new();
        for (task_idx, task) in plan.tasks.iter().enumerate() {
            if task.is_fallback_only {
                fallback_only.push(task_idx);
            } else {
                execution.open_slots += 1;
                if task.subtask_of.is_none() && plan.deps[task_idx].is_empty() {
                    roots.push(task_idx);
                }
            }
        }
        let mut settle = Vec::new();
        for task_idx in fallback_only {
            // A fallback task runs only in another task's place; as a task of its own it is done.
            execution.slots[task_idx].status = SlotStatus::Done {
                state: TaskState::Skipped,
                ok: true,
            };
            for &dependent in &plan.dependents[task_idx] {
                settle.push(dependent);
            }
        }
        for task_idx in roots {
            execution.make_ready(task_idx, at_ms, &mut settle);
        }
        execution.release(settle, at_ms);
        execution
    }

    /// Returns the execution id.
    pub fn id(&self) -> ExecutionId {
        self.id
    }

    /// Returns the plan.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// Returns the current run, from 1.
    pub fn run_number(&self) -> u32 {
        self.run_number
    }

    /// Returns when the execution started and, once it is terminal, when it ended.
    pub fn times_ms(&self) -> (u64, Option<u64>) {
        (self.started_at_ms, self.ended_at_ms)
    }

    /// Returns the execution state.
    pub fn state(&self) -> ExecutionState {
        self.state
    }

    /// Returns why the execution is paused or failed, if it says.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Returns the number of instances currently running.
    pub fn running(&self) -> u32 {
        self.running
    }

    /// Returns the resources consumed so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Returns the number of task instances created so far.
    pub fn n_instances(&self) -> usize {
        self.instances.len()
    }

    /// Returns the state of the instance, if it exists.
    pub fn instance_state(&self, instance: TaskInstanceId) -> Option<TaskState> {
        self.by_id
            .get(&instance)
            .map(|&idx| self.instances[idx as usize].state)
    }

    /// Returns when the instance was created (became ready, for one whose dependencies were met
    /// then) and when its current attempt was dispatched, if it was.
    pub fn instance_times(&self, instance: TaskInstanceId) -> Option<(u64, Option<u64>)> {
        let inst = &self.instances[*self.by_id.get(&instance)? as usize];
        Some((inst.created_at_ms, inst.started_at_ms))
    }

    /// Returns the plan task an instance runs, if it runs one.
    pub fn instance_task(&self, instance: TaskInstanceId) -> Option<TaskIdx> {
        let idx = *self.by_id.get(&instance)?;
        match self.instances[idx as usize].work {
            Work::Plan(task_idx) => Some(task_idx),
            Work::Dynamic(_) => None,
        }
    }

    /// Returns the plan task whose path lock the instance's chain takes, if any.
    pub fn lock_task(&self, instance: TaskInstanceId) -> Option<TaskIdx> {
        self.by_id
            .get(&instance)
            .and_then(|&idx| self.lock_task_of(idx))
    }

    /// Returns the ids of instances in a state.
    pub fn instances_in(&self, state: TaskState) -> impl Iterator<Item = TaskInstanceId> + '_ {
        self.instances
            .iter()
            .filter(move |i| i.state == state)
            .map(|i| i.id)
    }

    /// Returns the current attempt of an instance.
    pub fn attempt(&self, instance: TaskInstanceId) -> Option<u32> {
        self.by_id
            .get(&instance)
            .map(|&idx| self.instances[idx as usize].attempt)
    }

    /// Returns the plan-level outcome of a task once it settled.
    pub fn task_outcome(&self, task_idx: TaskIdx) -> Option<TaskState> {
        match self.slots.get(task_idx)?.status {
            SlotStatus::Done { state, .. } => Some(state),
            _ => None,
        }
    }

    /// Returns how many instances were resumed after this group settled (0 or 1).
    pub fn resumptions_of(&self, group: GroupId) -> usize {
        self.instances
            .iter()
            .filter(|i| matches!(i.origin, Origin::Resumed { group: g } if self.groups[g as usize].id == group))
            .count()
    }

    /// Returns every subtask group with its parent instance, whether it settled, and whether it was
    /// abandoned (cancelled with its parent's chain or the execution, so it resumes nothing).
    pub fn groups(&self) -> impl Iterator<Item = (GroupId, TaskInstanceId, bool, bool)> + '_ {
        self.groups.iter().map(|g| {
            let parent = self.instances[g.parent as usize].id;
            (g.id, parent, g.settled, g.abandoned)
        })
    }

    /// Returns what a worker needs to run the instance's current attempt.
    pub fn assignment(&self, instance: TaskInstanceId) -> Option<Assignment<'_>> {
        let idx = *self.by_id.get(&instance)?;
        let inst = &self.instances[idx as usize];
        let (task_id, task_type, queue, input) = match &inst.work {
            Work::Plan(task_idx) => {
                let task = &self.plan.tasks[*task_idx];
                (
                    task.id.as_str(),
                    task.task_type.as_str(),
                    task.queue.as_str(),
                    &task.input,
                )
            }
            Work::Dynamic(spec) => (
                spec.task_type.as_str(),
                spec.task_type.as_str(),
                spec.queue.as_deref().unwrap_or(&spec.task_type),
                &spec.input,
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
            resume: inst.resume.as_deref(),
            steps: &inst.steps,
            parent,
            group,
        })
    }

    // ------------------------------------------------------------------------------------------
    // decide
    // ------------------------------------------------------------------------------------------

    /// Returns what should happen now. Pure: calling it twice without applying anything returns the
    /// same commands. Dispatches respect `max_concurrency` and path locks, retries wait for their
    /// backoff, and nothing is dispatched while the execution is paused or waiting for a human.
    pub fn decide(&self, now_ms: u64) -> Vec<Command> {
        let mut commands = Vec::new();
        if self.state.is_terminal() {
            return commands;
        }
        if let Some(timeout) = self.plan.options.global_timeout
            && now_ms
                >= self
                    .run_started_at_ms
                    .saturating_add(timeout.as_millis() as u64)
        {
            commands.push(Command::TimeOutExecution);
            return commands;
        }
        for &(deadline, idx) in &self.deadlines {
            if deadline > now_ms {
                break;
            }
            let inst = &self.instances[idx as usize];
            commands.push(Command::TimeOut {
                instance: inst.id,
                attempt: inst.attempt,
            });
        }
        for &(expiry, question) in &self.expiries {
            if expiry > now_ms {
                break;
            }
            commands.push(Command::ExpireQuestion { question });
        }
        if let Some(reason) = self.budget_exceeded() {
            commands.push(Command::ExhaustBudget { reason });
        }
        if self.open_slots == 0 {
            let outcome = if self.failed_slots > 0 {
                Outcome::Failed
            } else {
                Outcome::Completed
            };
            commands.push(Command::Finish { outcome });
            return commands;
        }
        if self.state != ExecutionState::Running || !commands.is_empty() {
            return commands;
        }
        let mut free = match self.plan.options.max_concurrency {
            Some(limit) => limit.saturating_sub(self.running),
            None => u32::MAX,
        };
        let mut locked_now: Vec<TaskIdx> = Vec::new();
        let candidates = self
            .retries
            .iter()
            .take_while(|(not_before, _)| *not_before <= now_ms)
            .chain(self.ready.iter())
            .map(|&(_, idx)| idx);
        for idx in candidates {
            if free == 0 {
                break;
            }
            if let Some(lock) = self.lock_task_of(idx)
                && !self.slots[lock].locked
            {
                let conflicts = &self.plan.conflicts[lock];
                if conflicts
                    .iter()
                    .any(|&c| self.slots[c].locked || locked_now.contains(&c))
                {
                    continue;
                }
                locked_now.push(lock);
            }
            let inst = &self.instances[idx as usize];
            commands.push(Command::Dispatch {
                instance: inst.id,
                attempt: inst.attempt + 1,
            });
            free -= 1;
        }
        commands
    }

    fn budget_exceeded(&self) -> Option<String> {
        if self.budget_tripped {
            return None;
        }
        let budget = &self.plan.options.budget;
        if let Some(max) = budget.max_tokens
            && self.usage.tokens_used >= max
        {
            return Some(format!(
                "token budget exhausted: {} of {max} tokens used",
                self.usage.tokens_used
            ));
        }
        if let Some(max) = budget.max_cost
            && self.usage.cost >= max
        {
            return Some(format!(
                "cost budget exhausted: {:.4} of {max:.4} spent",
                self.usage.cost
            ));
        }
        None
    }

    // ------------------------------------------------------------------------------------------
    // apply
    // ------------------------------------------------------------------------------------------

    /// Applies one event. Deterministic; on error nothing changed.
    pub fn apply(&mut self, event: &Event) -> Result<Applied, ApplyError> {
        let at = event.at_ms;
        let mut stop = Vec::new();
        match &event.body {
            EventBody::TaskDispatched { instance, attempt } => {
                let idx = self.instance_idx(*instance)?;
                if let Some(ignored) = self.check_dispatch(idx, *attempt, at)? {
                    return Ok(Applied::Ignored(ignored));
                }
                self.dispatch(idx, at);
            }
            EventBody::TaskStarted {
                instance,
                attempt,
                worker,
            } => {
                let idx = self.running_attempt(*instance, *attempt, "task_started")?;
                let Some(idx) = idx.ok() else {
                    return Ok(Applied::Ignored(Ignored::StaleAttempt));
                };
                let inst = &mut self.instances[idx as usize];
                if inst.worker.as_ref() == Some(worker) {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                }
                inst.worker = Some(worker.clone());
                self.changed.0.push(idx);
            }
            EventBody::StepCheckpointed {
                instance,
                attempt,
                step,
                state,
            } => {
                let Ok(idx) = self.running_attempt(*instance, *attempt, "step_checkpointed")?
                else {
                    return Ok(Applied::Ignored(Ignored::StaleAttempt));
                };
                let inst = &mut self.instances[idx as usize];
                if inst.steps.iter().any(|s| s.step == *step) {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                }
                inst.steps.push(StepRecord {
                    step: step.clone(),
                    state: state.clone(),
                });
            }
            EventBody::TaskCompleted {
                instance,
                attempt,
                output,
                usage,
            } => {
                let Ok(idx) = self.running_attempt(*instance, *attempt, "task_completed")? else {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                };
                self.add_usage(*usage);
                self.end_turn(idx);
                self.complete(idx, output.clone(), at, &mut stop);
            }
            EventBody::TaskFailed {
                instance,
                attempt,
                error,
                retryable,
                usage,
            } => {
                let Ok(idx) = self.running_attempt(*instance, *attempt, "task_failed")? else {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                };
                self.add_usage(*usage);
                self.end_turn(idx);
                self.fail(idx, error.clone(), *retryable, at, &mut stop);
            }
            EventBody::TaskTimedOut { instance, attempt } => {
                let Ok(idx) = self.running_attempt(*instance, *attempt, "task_timed_out")? else {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                };
                if self.instances[idx as usize]
                    .deadline_ms
                    .is_none_or(|d| d > at)
                {
                    return Err(ApplyError::DeadlineNotReached {
                        instance: *instance,
                    });
                }
                self.end_turn(idx);
                stop.push(*instance);
                let error = "timed out".to_owned();
                self.fail(idx, error, true, at, &mut stop);
            }
            EventBody::TaskLost { instance, attempt } => {
                let Ok(idx) = self.running_attempt(*instance, *attempt, "task_lost")? else {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                };
                self.end_turn(idx);
                let inst = &mut self.instances[idx as usize];
                inst.avoid_worker = inst.worker.take();
                self.schedule_retry(idx, at);
            }
            EventBody::SubtasksSpawned {
                instance,
                attempt,
                group,
                rule,
                members,
            } => {
                let Ok(idx) = self.running_attempt(*instance, *attempt, "subtasks_spawned")? else {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                };
                if self.group_by_id.contains_key(group) {
                    return Err(ApplyError::GroupIdReused(*group));
                }
                // A group is known to the records only through its members (seed 000), so an
                // empty one could never be linked to its resumed parent.
                if members.is_empty() {
                    return Err(ApplyError::EmptyGroup(*group));
                }
                if let GroupRule::Quorum(k) = rule
                    && (*k == 0 || *k as usize > members.len())
                {
                    return Err(ApplyError::InvalidQuorum {
                        k: *k,
                        members: members.len(),
                    });
                }
                self.end_turn(idx);
                let works = members
                    .iter()
                    .map(|spec| Work::Dynamic(Box::new(spec.clone())))
                    .collect();
                self.spawn_group(idx, *group, *rule, works, at, &mut stop);
            }
            EventBody::QuestionAsked {
                instance,
                attempt,
                question,
            } => {
                let Ok(idx) = self.running_attempt(*instance, *attempt, "question_asked")? else {
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
                if self.plan.options.pause_on_human_review && self.state == ExecutionState::Running
                {
                    self.state = ExecutionState::WaitingForHuman;
                }
            }
            EventBody::QuestionAnswered { question, answer } => {
                let open = self
                    .questions
                    .get(question)
                    .ok_or(ApplyError::UnknownQuestion(*question))?;
                if open.answered {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                }
                self.require_live("question_answered")?;
                self.answer(*question, answer.clone(), at);
            }
            EventBody::QuestionExpired { question } => {
                let open = self
                    .questions
                    .get(question)
                    .ok_or(ApplyError::UnknownQuestion(*question))?;
                if open.answered {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                }
                if open.question.expires_at_ms.is_none_or(|e| e > at) {
                    return Err(ApplyError::QuestionNotExpired(*question));
                }
                self.require_live("question_expired")?;
                let instance = open.instance;
                match open.question.timeout_action.clone() {
                    TimeoutAction::Answer(answer) => self.answer(*question, answer, at),
                    action => {
                        self.close_question(*question);
                        let (state, error) = match action {
                            TimeoutAction::Skip => {
                                (TaskState::Skipped, "question expired; skipped")
                            }
                            _ => (TaskState::Failed, "question expired unanswered"),
                        };
                        let inst = &mut self.instances[instance as usize];
                        inst.error = Some(error.to_owned());
                        inst.ended_at_ms = Some(at);
                        self.set_state(instance, state);
                        self.settle_chain(instance, at, &mut stop);
                    }
                }
            }
            EventBody::PauseRequested { reason } => {
                match self.state {
                    ExecutionState::Running | ExecutionState::WaitingForHuman => {}
                    ExecutionState::Paused => return Ok(Applied::Ignored(Ignored::Duplicate)),
                    state => return Err(invalid_execution(state, "pause_requested")),
                }
                self.state = ExecutionState::Paused;
                self.reason = Some(reason.clone());
            }
            EventBody::ResumeRequested => {
                match self.state {
                    ExecutionState::Paused => {}
                    ExecutionState::Running | ExecutionState::WaitingForHuman => {
                        return Ok(Applied::Ignored(Ignored::Duplicate));
                    }
                    state => return Err(invalid_execution(state, "resume_requested")),
                }
                self.reason = None;
                self.state = if self.open_questions > 0 && self.plan.options.pause_on_human_review {
                    ExecutionState::WaitingForHuman
                } else {
                    ExecutionState::Running
                };
            }
            EventBody::CancelRequested { reason } => {
                if self.state == ExecutionState::Cancelled {
                    return Ok(Applied::Ignored(Ignored::Duplicate));
                }
                self.require_live("cancel_requested")?;
                self.terminate(ExecutionState::Cancelled, reason.clone(), at, &mut stop);
            }
            EventBody::BudgetExhausted { reason } => {
                self.require_live("budget_exhausted")?;
                if self.budget_exceeded().is_none() {
                    return Err(ApplyError::BudgetNotExhausted);
                }
                self.budget_tripped = true;
                match self.plan.options.budget.on_exhausted {
                    crate::plan::BudgetAction::Pause => {
                        self.state = ExecutionState::Paused;
                        self.reason = Some(reason.clone());
                    }
                    crate::plan::BudgetAction::Fail => {
                        self.terminate(ExecutionState::Failed, reason.clone(), at, &mut stop);
                    }
                }
            }
            EventBody::ExecutionTimedOut => {
                self.require_live("execution_timed_out")?;
                let timeout = self.plan.options.global_timeout;
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
            }
            EventBody::ExecutionFinished { outcome } => {
                self.require_live("execution_finished")?;
                if self.open_slots > 0 {
                    let reason = format!("{} tasks have not settled", self.open_slots);
                    return Err(ApplyError::CannotFinish {
                        claimed: *outcome,
                        reason,
                    });
                }
                let actual = if self.failed_slots > 0 {
                    Outcome::Failed
                } else {
                    Outcome::Completed
                };
                if actual != *outcome {
                    let reason = format!("{} tasks failed", self.failed_slots);
                    return Err(ApplyError::CannotFinish {
                        claimed: *outcome,
                        reason,
                    });
                }
                self.state = (*outcome).into();
                self.ended_at_ms = Some(at);
                if actual == Outcome::Failed && self.reason.is_none() {
                    self.reason = Some(format!("{} tasks failed", self.failed_slots));
                }
            }
            EventBody::RunStarted { run } => {
                if !matches!(
                    self.state,
                    ExecutionState::Failed | ExecutionState::Cancelled
                ) {
                    return Err(invalid_execution(self.state, "run_started"));
                }
                if *run != self.run_number + 1 {
                    return Err(ApplyError::RunOutOfOrder {
                        expected: self.run_number + 1,
                        got: *run,
                    });
                }
                self.start_run(*run, at);
            }
        }
        Ok(Applied::Changed { stop })
    }

    /// Starts run `run` of a failed or cancelled execution (docs/design.md §4, "Execution runs"): plan
    /// tasks that settled acceptably keep their results; every other task is instantiated again
    /// (with ids of the new run) once its dependencies allow. The earlier runs' instances stay, as
    /// history.
    fn start_run(&mut self, run: u32, at: u64) {
        self.run_number = run;
        self.run_started_at_ms = at;
        self.state = ExecutionState::Running;
        self.reason = None;
        self.ended_at_ms = None;
        self.budget_tripped = false;
        self.failed_slots = 0;
        // Questions of the ended run died with their instances.
        for open in self.questions.values_mut() {
            open.answered = true;
        }
        self.open_questions = 0;
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

    // ------------------------------------------------------------------------------------------
    // validation helpers (no mutation)
    // ------------------------------------------------------------------------------------------

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

    fn require_live(&self, event: &'static str) -> Result<(), ApplyError> {
        if self.state.is_terminal() {
            Err(invalid_execution(self.state, event))
        } else {
            Ok(())
        }
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

    /// Returns the plan task whose path lock an instance's chain needs: the plan task its chain
    /// head runs. Dynamic subtasks declare no files and take no lock.
    fn lock_task_of(&self, idx: InstIdx) -> Option<TaskIdx> {
        let head = &self.instances[self.instances[idx as usize].head as usize];
        match head.work {
            Work::Plan(task_idx) => Some(task_idx),
            Work::Dynamic(_) => None,
        }
    }

    // ------------------------------------------------------------------------------------------
    // mutation helpers (infallible)
    // ------------------------------------------------------------------------------------------

    fn set_state(&mut self, idx: InstIdx, state: TaskState) {
        let inst = &mut self.instances[idx as usize];
        if inst.state == TaskState::Queued {
            self.ready.remove(&(inst.ready_key, idx));
        }
        if inst.state == TaskState::RetryScheduled {
            self.retries.remove(&(inst.not_before_ms, idx));
        }
        if state.is_terminal() && !inst.state.is_terminal() {
            self.settled_units += 1;
        }
        inst.state = state;
        self.changed.0.push(idx);
        if state == TaskState::Queued {
            inst.ready_key = self.next_ready_key;
            self.next_ready_key += 1;
            self.ready.insert((inst.ready_key, idx));
        }
        if state == TaskState::RetryScheduled {
            self.retries.insert((inst.not_before_ms, idx));
        }
    }

    fn add_usage(&mut self, usage: Usage) {
        self.usage.tokens_used = self.usage.tokens_used.saturating_add(usage.tokens_used);
        self.usage.cost += usage.cost;
    }

    fn dispatch(&mut self, idx: InstIdx, at: u64) {
        let lock = self.lock_task_of(idx);
        let timeout = match self.instances[idx as usize].work {
            Work::Plan(task_idx) => self.plan.tasks[task_idx].timeout,
            Work::Dynamic(_) => None,
        };
        self.set_state(idx, TaskState::Running);
        let inst = &mut self.instances[idx as usize];
        inst.attempt += 1;
        inst.worker = None;
        inst.started_at_ms = Some(at);
        inst.deadline_ms = timeout.map(|t| at.saturating_add(t.as_millis() as u64));
        if let Some(deadline) = inst.deadline_ms {
            self.deadlines.insert((deadline, idx));
        }
        self.running += 1;
        if let Some(lock) = lock {
            self.slots[lock].locked = true;
        }
    }

    /// Ends the running attempt's turn: frees its slot and its deadline.
    fn end_turn(&mut self, idx: InstIdx) {
        let inst = &self.instances[idx as usize];
        if let Some(deadline) = inst.deadline_ms {
            self.deadlines.remove(&(deadline, idx));
        }
        self.running -= 1;
    }

    fn new_instance(
        &mut self,
        id: TaskInstanceId,
        work: Work,
        origin: Origin,
        head: Option<InstIdx>,
        at: u64,
    ) -> InstIdx {
        let idx = self.instances.len() as InstIdx;
        self.instances.push(Instance {
            id,
            run: self.run_number,
            work,
            origin,
            head: head.unwrap_or(idx),
            state: TaskState::Pending,
            attempt: 0,
            worker: None,
            avoid_worker: None,
            created_at_ms: at,
            started_at_ms: None,
            ended_at_ms: None,
            deadline_ms: None,
            not_before_ms: 0,
            ready_key: 0,
            chain_position: ChainPosition::default(),
            output: None,
            error: None,
            next: None,
            resume: None,
            steps: Vec::new(),
        });
        self.by_id.insert(id, idx);
        idx
    }

    /// Makes a plan task whose dependencies are met runnable; a task that is not to be run settles
    /// at once (and its dependents are pushed onto `settle`).
    fn make_ready(&mut self, task_idx: TaskIdx, at: u64, settle: &mut Vec<TaskIdx>) {
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

    fn mark_done(
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
        if !ok && let Some(members) = self.static_members.get(&task_idx) {
            settle.extend(members.iter().copied());
        }
        if state == TaskState::Failed {
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
                }
            }
        }
    }

    /// Works through plan tasks whose dependencies changed: ready ones are instantiated, those
    /// behind a failed dependency are skipped. Iterative, so long chains cannot overflow the stack.
    fn release(&mut self, mut settle: Vec<TaskIdx>, at: u64) {
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
    fn route_skips(&self, task_idx: TaskIdx) -> bool {
        let Some(condition) = &self.plan.tasks[task_idx].condition else {
            return false;
        };
        match self.slots[condition.router].status {
            SlotStatus::Done { .. } => !condition.holds(self.task_output(condition.router)),
            _ => false,
        }
    }

    /// Returns the output standing for a plan task that completed.
    fn task_output(&self, task_idx: TaskIdx) -> Option<&serde_json::Value> {
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

    fn complete(
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
            && let Some(members) = self.static_members.get(&task_idx).cloned()
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

    fn schedule_retry(&mut self, idx: InstIdx, not_before: u64) {
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

    fn fail(
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

    fn spawn_group(
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
    fn settle_chain(&mut self, idx: InstIdx, at: u64, stop: &mut Vec<TaskInstanceId>) {
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
    fn terminate(
        &mut self,
        state: ExecutionState,
        reason: String,
        at: u64,
        stop: &mut Vec<TaskInstanceId>,
    ) {
        self.state = state;
        self.reason = Some(reason);
        self.ended_at_ms = Some(at);
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
        self.deadlines.clear();
        self.expiries.clear();
    }

    // ------------------------------------------------------------------------------------------
    // read models
    // ------------------------------------------------------------------------------------------

    /// Returns a progress snapshot at `now_ms`.
    pub fn progress(&self, now_ms: u64) -> Progress {
        let mut counts = StateCounts::default();
        for idx in 0..self.instances.len() as InstIdx {
            counts.add(self.display_state(idx), 1);
        }
        let mut uninstantiated = 0u64;
        let mut wave = self.waves;
        for (task_idx, slot) in self.slots.iter().enumerate() {
            if slot.head.is_none() && slot.status == SlotStatus::Waiting {
                uninstantiated += 1;
            }
            if !matches!(slot.status, SlotStatus::Done { .. }) && self.wave_of[task_idx] > 0 {
                wave = wave.min(self.wave_of[task_idx]);
            }
        }
        counts.add(TaskState::Pending, uninstantiated);
        let total = self.instances.len() as u64 + uninstantiated;
        let done = self.settled_units;
        let percent = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        let elapsed = now_ms.saturating_sub(self.started_at_ms);
        let eta_ms = (done > 0 && !self.state.is_terminal())
            .then(|| (elapsed as u128 * u128::from(total - done) / u128::from(done)) as u64);
        Progress {
            state: self.state,
            counts,
            total,
            done,
            percent,
            eta_ms,
            wave,
            waves: self.waves,
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
            started_at_ms: Some(self.started_at_ms),
            ended_at_ms: self.ended_at_ms,
            output: None,
            error: self.reason.clone(),
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
            started_at_ms: inst.started_at_ms,
            ended_at_ms: inst.ended_at_ms,
            output: inst.output.clone(),
            error: inst.error.clone(),
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

fn invalid_execution(state: ExecutionState, event: &'static str) -> ApplyError {
    ApplyError::InvalidExecutionTransition {
        state: state.as_str(),
        event,
    }
}

/// Returns each task's 1-based wave (0 for tasks outside the waves: fallbacks and static subtasks)
/// and the number of waves.
fn waves_of(plan: &Plan) -> (Vec<u32>, u32) {
    let waves = crate::analysis::waves(plan);
    let wave_of = waves
        .wave_of
        .iter()
        .map(|w| w.map_or(0, |w| w as u32 + 1))
        .collect();
    (wave_of, waves.waves.len() as u32)
}
