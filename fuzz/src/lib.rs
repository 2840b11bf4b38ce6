//! What the fuzz targets share: a live execution with attempts running, to deliver what arrives
//! from NATS to, and the checks that must hold after anything was delivered.
//!
//! Every id here is derived, so the committed seeds (written by `cargo run --bin seeds`) carry the
//! very ids of the live execution and the fuzzer starts from messages that reach deep into the
//! state machine.

use std::sync::Arc;

use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_core::machine::{Applied, ApplyError, Event, Execution};
use trellis_core::plan::{Limits, compile_str};
use trellis_core::record::TaskState;

/// When the live execution starts.
pub const T0: u64 = 1_700_000_000_000;

/// The execution every target delivers to.
pub fn execution_id() -> ExecutionId {
    ExecutionId::derived(T0, 7)
}

/// A plan with one task of each built-in kind a worker answers without I/O, all ready at once,
/// and a dependent task: results of every kind have an attempt to land on.
pub const PLAN: &str = r#"
name: fuzz
options:
  max_concurrency: 4
  failure:
    default_action: retry
    max_retries: 2
    backoff: {kind: constant, base: 10ms}
tasks:
  - id: spread
    type: fanout
    input: {count: 3, child: {type: noop}}
  - id: ask
    type: question
    input: {text: "ship it?", options: [yes, no]}
  - id: flaky
    type: fail
    input: {times: 1}
  - id: echo
    type: noop
    input: {hello: world}
  - id: after
    type: noop
    depends_on: [spread, echo]
"#;

/// A live execution and the log of what it applied, the way the coordinator keeps both.
pub struct Live {
    pub exec: Execution,
    pub log: Vec<Event>,
    pub now: u64,
}

impl Live {
    /// Starts [`PLAN`] and dispatches what is ready: four attempts are running.
    pub fn new() -> Live {
        // The plan is a constant of this crate, checked by the seeds binary and every run.
        let plan = compile_str(PLAN, &Limits::default()).expect("the fuzz plan compiles");
        let mut live = Live {
            exec: Execution::start(execution_id(), Arc::new(plan), 1, T0),
            log: Vec::new(),
            now: T0,
        };
        live.decide();
        live
    }

    /// Applies an event from outside (a worker, a user); on success it joins the log.
    pub fn deliver(&mut self, event: Event) -> Result<Applied, ApplyError> {
        let applied = self.exec.apply(&event)?;
        self.log.push(event);
        Ok(applied)
    }

    /// Runs `decide` and applies its commands, as the coordinator does after every change. The
    /// machine refusing its own decision is a bug.
    pub fn decide(&mut self) {
        for command in self.exec.decide(self.now) {
            let event = command.into_event(self.now);
            if let Err(err) = self.exec.apply(&event) {
                panic!(
                    "the machine refused its own decision {:?}: {err}",
                    event.body
                );
            }
            self.log.push(event);
        }
    }

    /// The attempts that are out with workers (queued or running), in instance order.
    pub fn attempts(&self) -> Vec<(TaskInstanceId, u32)> {
        let mut attempts: Vec<(TaskInstanceId, u32)> = [TaskState::Queued, TaskState::Running]
            .into_iter()
            .flat_map(|state| self.exec.instances_in(state))
            .filter_map(|instance| Some((instance, self.exec.attempt(instance)?)))
            .collect();
        attempts.sort_unstable();
        attempts
    }

    /// Lets `ms` milliseconds pass.
    pub fn advance(&mut self, ms: u64) {
        self.now = self.now.saturating_add(ms);
    }

    /// The invariants that must hold whatever was delivered: the concurrency limit, a snapshot
    /// restores the same state, and replaying the log rebuilds it.
    pub fn check(&self) {
        let plan = self.exec.plan();
        if let Some(limit) = plan.options.max_concurrency {
            assert!(self.exec.running() <= limit, "over the concurrency limit");
        }
        for (group, ..) in self.exec.groups() {
            assert!(
                self.exec.resumptions_of(group) <= 1,
                "group {group} resumed twice"
            );
        }
        let restored = Execution::restore(Arc::clone(plan), &self.exec.snapshot())
            .expect("a snapshot restores");
        assert!(restored == self.exec, "the snapshot restored another state");
        let mut replayed = Execution::start(execution_id(), Arc::clone(plan), 1, T0);
        for event in &self.log {
            if let Err(err) = replayed.apply(event) {
                panic!("replay refused {:?}: {err}", event.body);
            }
        }
        assert!(
            replayed == self.exec,
            "the replayed log rebuilt another state"
        );
    }
}

impl Default for Live {
    fn default() -> Self {
        Live::new()
    }
}
