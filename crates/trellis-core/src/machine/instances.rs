//! Instance bookkeeping: creating an instance, changing its state together with the indexes that
//! follow it (the ready set, scheduled retries, settled units, changed records), dispatching an
//! attempt and ending its turn. Infallible: callers checked the event first.

use super::{
    ChainPosition, Execution, InstIdx, Instance, Origin, TaskInstanceId, TaskState, Usage, Work,
};
use crate::record::AttemptRecord;

impl Execution {
    pub(super) fn set_state(&mut self, idx: InstIdx, state: TaskState) {
        let inst = &mut self.instances[idx as usize];
        if inst.state == TaskState::Queued {
            self.ready.remove(inst.ready_key, idx);
        }
        if inst.state == TaskState::RetryScheduled {
            self.retries.remove(&(inst.not_before_ms, idx));
        }
        if state.is_terminal() && !inst.state.is_terminal() {
            self.settled_units += 1;
        }
        self.by_state.sub(inst.state, 1);
        self.by_state.add(state, 1);
        inst.state = state;
        self.changed.0.push(idx);
        if state == TaskState::Queued {
            inst.ready_key = self.next_ready_key;
            self.next_ready_key += 1;
            self.ready.insert(inst.ready_key, idx);
        }
        if state == TaskState::RetryScheduled {
            self.retries.insert((inst.not_before_ms, idx));
        }
    }

    pub(super) fn add_usage(&mut self, usage: Usage) {
        self.usage.tokens_used = self.usage.tokens_used.saturating_add(usage.tokens_used);
        self.usage.cost += usage.cost;
    }

    pub(super) fn dispatch(&mut self, idx: InstIdx, at: u64) {
        let lock = self.lock_task_of(idx);
        let timeout = match self.instances[idx as usize].work {
            Work::Plan(task_idx) => self.plan.tasks[task_idx].timeout,
            Work::Dynamic(_) => None,
        };
        self.set_state(idx, TaskState::Running);
        let inst = &mut self.instances[idx as usize];
        inst.attempt += 1;
        inst.worker = None;
        inst.dispatched_at_ms = Some(at);
        inst.started_at_ms = None;
        inst.validation.clear();
        inst.deadline_ms = timeout.map(|t| at.saturating_add(t.as_millis() as u64));
        if let Some(deadline) = inst.deadline_ms {
            self.deadlines.insert((deadline, idx));
        }
        self.running += 1;
        if let Some(lock) = lock {
            self.slots[lock].locked = true;
        }
    }

    /// Keeps the attempt that just ended at `at` in the instance's history: another one follows.
    pub(super) fn archive_attempt(&mut self, idx: InstIdx, at: u64, error: String) {
        let inst = &mut self.instances[idx as usize];
        let record = AttemptRecord {
            attempt: inst.attempt,
            worker_id: inst.worker.clone(),
            dispatched_at_ms: inst.dispatched_at_ms,
            started_at_ms: inst.started_at_ms,
            ended_at_ms: at,
            error,
            validation: std::mem::take(&mut inst.validation),
        };
        inst.earlier_attempts.push(record);
    }

    /// Ends the running attempt's turn: frees its slot and its deadline. Called before anything
    /// clears the attempt's worker, which tells whether its start was counted.
    pub(super) fn end_turn(&mut self, idx: InstIdx) {
        let inst = &self.instances[idx as usize];
        if let Some(deadline) = inst.deadline_ms {
            self.deadlines.remove(&(deadline, idx));
        }
        self.running -= 1;
        if inst.worker.is_some() {
            self.started -= 1;
        }
    }

    pub(super) fn new_instance(
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
            dispatched_at_ms: None,
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
            started_at_ms: None,
            earlier_attempts: Vec::new(),
            validation: Vec::new(),
            lost: 0,
        });
        self.by_id.insert(id, idx);
        self.by_state.add(TaskState::Pending, 1);
        idx
    }
}
