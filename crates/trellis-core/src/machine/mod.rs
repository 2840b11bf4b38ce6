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
//!
//! This file holds the state's types, [`Execution::start`] and the accessors; the rest is split by
//! concern, each file adding to `impl Execution`:
//! - `apply.rs`: [`Execution::apply`], one function per event kind a worker reports, and the
//!   checks they share; `control.rs`: requests and the execution's own transitions (questions
//!   answered or expired, pause, resume, cancel, budget, global timeout, finish, a new run);
//! - `decide.rs`: [`Execution::decide`];
//! - `slots.rs`: plan tasks becoming ready or settling, and releasing their dependents;
//! - `instances.rs`: creating instances, their states and the indexes that follow them;
//!   `ready.rs`: the ready set those indexes include;
//! - `groups.rs`: chains and subtask groups; `failure.rs`: escalation chains on failure;
//! - `read.rs`: progress, records, open questions, assignments;
//! - `snapshot.rs`: the state as bytes and back.

mod apply;
mod control;
mod decide;
mod event;
mod failure;
mod groups;
mod instances;
mod read;
mod ready;
mod slots;
mod snapshot;
mod types;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use event::{
    Command, Event, EventBody, GroupRule, Outcome, PauseMode, PauseScope, Question, SubtaskSpec,
    TimeoutAction, Usage,
};
pub use snapshot::{SNAPSHOT_FORMAT_VERSION, SnapshotError};
pub use types::{
    Applied, ApplyError, Assignment, ExecutionState, GroupSummary, Ignored, Progress,
    ResumeContext, SUMMARY_LIMIT, StateCounts, StepRecord,
};

use ready::ReadySet;

use crate::ids::{ExecutionId, GroupId, QuestionId, TaskInstanceId, WorkerId};
use crate::plan::{Plan, TaskIdx};
use crate::policy::ChainPosition;
use crate::record::{AttemptRecord, CheckResult, TaskState};

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
    /// The worker that took the current attempt, once one reported it.
    worker: Option<WorkerId>,
    avoid_worker: Option<WorkerId>,
    created_at_ms: u64,
    /// When the current attempt was dispatched (snapshots before the task record kept this
    /// field under the name `started_at_ms`; the encoding is positional).
    dispatched_at_ms: Option<u64>,
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
    /// When a worker took the current attempt (`task_started`).
    #[serde(default)]
    started_at_ms: Option<u64>,
    /// The attempts before the current one (empty unless an attempt ended and another followed).
    #[serde(default)]
    earlier_attempts: Vec<AttemptRecord>,
    /// The current attempt's `validate:` results (`task_validated`).
    #[serde(default)]
    validation: Vec<CheckResult>,
    /// Attempts that ended with their worker lost (`task_lost`). Each spent a delivery that no
    /// task message counts, so assignments carry them (`Assignment::lost_deliveries`).
    #[serde(default)]
    lost: u32,
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

/// A pause of a plan task or a subtask group, as [`Execution::holds`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub reason: String,
    pub mode: PauseMode,
    pub since_ms: u64,
}

/// The plan tasks and subtask groups paused on their own; the execution's own pause is its
/// state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Holds {
    tasks: BTreeMap<String, Hold>,
    groups: BTreeMap<GroupId, Hold>,
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
    instances: Vec<Instance>,
    by_id: HashMap<TaskInstanceId, InstIdx, IdHasher>,
    groups: Vec<Group>,
    group_by_id: HashMap<GroupId, GroupIdx>,
    questions: BTreeMap<QuestionId, OpenQuestion>,
    open_questions: u32,
    ready: ReadySet,
    next_ready_key: u64,
    retries: BTreeSet<(u64, InstIdx)>,
    deadlines: BTreeSet<(u64, InstIdx)>,
    expiries: BTreeSet<(u64, QuestionId)>,
    running: u32,
    /// Of the `running` attempts, those whose start is recorded (`TaskStarted`): the rest wait
    /// in a queue for a worker. Derived, not stored in a snapshot.
    started: u32,
    usage: Usage,
    budget_tripped: bool,
    settled_units: u64,
    holds: Holds,
    /// Ended by a request, a policy or a timeout (not by its tasks settling), with no
    /// `ExecutionFinished` logged yet: `decide` proposes it, so every ended log ends with one.
    finish_due: bool,
    /// Resumes after an exhausted budget paused the execution: each grants one more budget.
    budget_grants: u32,
    /// Instances whose record changed since [`Execution::take_changed_records`] last ran.
    changed: Changed,
    /// Instances by state, kept with every change of one (`set_state`) and counted again on
    /// restore, so a progress snapshot is not a pass over every instance.
    by_state: StateCounts,
}

/// The hasher of the instance-id map. Instance ids are made by the machine (derived from the
/// execution's id and a counter), never chosen by a caller, so a fast hash with a fixed seed is
/// safe here, and keeps every run of the machine the same; SipHash's inserts were a tenth of
/// starting a 20,000-task execution.
type IdHasher = foldhash::fast::FixedState;

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
            instances: Vec::with_capacity(n_tasks),
            by_id: HashMap::with_capacity_and_hasher(n_tasks, IdHasher::default()),
            groups: Vec::new(),
            group_by_id: HashMap::new(),
            questions: BTreeMap::new(),
            open_questions: 0,
            ready: ReadySet::default(),
            next_ready_key: 0,
            retries: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            expiries: BTreeSet::new(),
            running: 0,
            started: 0,
            usage: Usage::default(),
            budget_tripped: false,
            settled_units: 0,
            holds: Holds::default(),
            finish_due: false,
            budget_grants: 0,
            changed: Changed::default(),
            by_state: StateCounts::default(),
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

    /// Returns the number of instances currently running: dispatched, their attempt not ended.
    pub fn running(&self) -> u32 {
        self.running
    }

    /// Returns how many of the [`running`](Self::running) attempts have no start recorded yet:
    /// dispatched and, as far as this execution knows, still waiting in a queue for a worker.
    /// A start is recorded from a heartbeat that names the attempt or with its result.
    pub fn unstarted(&self) -> u32 {
        self.running - self.started
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
        Some((inst.created_at_ms, inst.dispatched_at_ms))
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

    /// Returns the plan tasks and subtask groups paused on their own, with why and how.
    pub fn holds(&self) -> impl Iterator<Item = (PauseScope, &Hold)> + '_ {
        let tasks = self
            .holds
            .tasks
            .iter()
            .map(|(task, hold)| (PauseScope::Task(task.clone()), hold));
        let groups = self
            .holds
            .groups
            .iter()
            .map(|(group, hold)| (PauseScope::Group(*group), hold));
        tasks.chain(groups)
    }

    /// Returns the running instances a pause of `scope` covers, with their attempts: those a
    /// pause in `preempt` mode asks to stop.
    pub fn running_in(&self, scope: &PauseScope) -> Vec<(TaskInstanceId, u32)> {
        self.instances
            .iter()
            .enumerate()
            .filter(|(idx, inst)| {
                inst.state == TaskState::Running && self.in_scope(*idx as InstIdx, scope)
            })
            .map(|(_, inst)| (inst.id, inst.attempt))
            .collect()
    }

    /// Returns the running instances whose queue `held` names, with their attempts.
    pub fn running_on(&self, held: &dyn Fn(&str) -> bool) -> Vec<(TaskInstanceId, u32)> {
        self.instances
            .iter()
            .filter(|inst| inst.state == TaskState::Running && held(self.queue_of(&inst.work)))
            .map(|inst| (inst.id, inst.attempt))
            .collect()
    }

    /// Returns true when a pause of `scope` covers the instance: the execution covers all; a
    /// task, the instances of its chain; a group, the chains of its members.
    fn in_scope(&self, idx: InstIdx, scope: &PauseScope) -> bool {
        let head = &self.instances[self.instances[idx as usize].head as usize];
        match scope {
            PauseScope::Execution => true,
            PauseScope::Task(task) => {
                matches!(head.work, Work::Plan(t) if self.plan.tasks[t].id == *task)
            }
            PauseScope::Group(group) => {
                matches!(head.origin, Origin::Member { group: g } if self.groups[g as usize].id == *group)
            }
        }
    }

    /// Returns the pause of a task or group that holds the instance, if one does.
    fn held(&self, idx: InstIdx) -> Option<PauseScope> {
        if self.holds.tasks.is_empty() && self.holds.groups.is_empty() {
            return None;
        }
        let head = &self.instances[self.instances[idx as usize].head as usize];
        if let Work::Plan(t) = head.work
            && self.holds.tasks.contains_key(&self.plan.tasks[t].id)
        {
            return Some(PauseScope::Task(self.plan.tasks[t].id.clone()));
        }
        if let Origin::Member { group } = head.origin {
            let id = self.groups[group as usize].id;
            if self.holds.groups.contains_key(&id) {
                return Some(PauseScope::Group(id));
            }
        }
        None
    }

    /// Returns the queue an instance's work is published on.
    fn type_of<'a>(&'a self, work: &'a Work) -> &'a str {
        match work {
            Work::Plan(task_idx) => self.plan.tasks[*task_idx].task_type.as_str(),
            Work::Dynamic(spec) => spec.task_type.as_str(),
        }
    }

    fn queue_of<'a>(&'a self, work: &'a Work) -> &'a str {
        match work {
            Work::Plan(task_idx) => self.plan.tasks[*task_idx].queue.as_str(),
            Work::Dynamic(spec) => spec.queue.as_deref().unwrap_or(&spec.task_type),
        }
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
}

fn invalid_execution(state: ExecutionState, event: &'static str) -> ApplyError {
    ApplyError::InvalidExecutionTransition {
        state: state.as_str(),
        event,
    }
}
