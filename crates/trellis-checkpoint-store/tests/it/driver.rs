//! Plays coordinator and workers around a real [`Execution`]: applies what `decide` proposes and
//! what simulated workers report, and keeps the event log exactly as the coordinator writes it
//! (`log::started_to_proto`, `log::event_to_proto`), to publish as `EventBatch`es.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::Context;
use trellis_core::ids::{ExecutionId, GroupId, TaskInstanceId, WorkerId};
use trellis_core::machine::{Applied, Event, EventBody, Execution, GroupRule, SubtaskSpec, Usage};
use trellis_core::plan::{Limits, compile_str};
use trellis_core::record::TaskState;
use trellis_proto::v1;
use trellis_wire::log::{self, Started};
use trellis_wire::read;

/// A plan with dependencies and a task (`fan`) that spawns a group of three subtasks.
pub const SPEC: &str = r#"
name: store-read-model
tasks:
  - id: fetch
    type: noop
  - id: fan
    type: noop
  - id: build
    type: noop
    depends_on: [fetch]
  - id: report
    type: noop
    depends_on: [build, fan]
"#;

/// An execution driven to completion step by step.
pub struct Driver {
    pub id: ExecutionId,
    pub machine: Execution,
    pub now_ms: u64,
    /// The last sequence recorded.
    pub sequence: u64,
    /// Log entries not yet taken.
    pending: Vec<v1::Event>,
    spawned: HashSet<TaskInstanceId>,
    /// Members of the group `fan` spawns.
    members: usize,
}

impl Driver {
    /// Starts an execution of `spec`; its `ExecutionStarted` entry is the first pending one.
    pub fn start(spec: &str, labels: &[(&str, &str)]) -> anyhow::Result<Self> {
        let plan = compile_str(spec, &Limits::default())
            .map_err(|errors| anyhow::anyhow!("plan does not compile: {errors}"))?;
        let now_ms = 1_750_000_000_000;
        let id = ExecutionId(uuid::Uuid::now_v7());
        let started = Started {
            plan_name: plan.name.clone(),
            run_number: 1,
            spec: spec.to_owned(),
            format: v1::PlanFormat::Yaml,
            started_at_ms: now_ms,
            idempotency_key: String::new(),
            labels: labels
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
            ..Started::default()
        };
        let machine = Execution::start(id, Arc::new(plan), 1, now_ms);
        Ok(Self {
            id,
            machine,
            now_ms,
            sequence: 1,
            pending: vec![log::started_to_proto(id, &started)],
            spawned: HashSet::new(),
            members: 3,
        })
    }

    /// Makes `fan` spawn `members` subtasks instead of three.
    pub fn with_members(mut self, members: usize) -> Self {
        self.members = members;
        self
    }

    /// Applies an event and logs it when it changed the state.
    pub fn record(&mut self, body: EventBody) -> anyhow::Result<()> {
        let event = Event {
            at_ms: self.now_ms,
            body,
        };
        let applied = self
            .machine
            .apply(&event)
            .with_context(|| format!("event refused: {event:?}"))?;
        if let Applied::Changed { .. } = applied {
            self.sequence += 1;
            self.pending
                .push(log::event_to_proto(self.id, self.sequence, &event));
        }
        Ok(())
    }

    /// Logs an event of a kind this build does not know (a `kind` the decoder leaves unset), as a
    /// newer coordinator would.
    pub fn record_unknown(&mut self) {
        self.sequence += 1;
        self.pending.push(v1::Event {
            execution_id: self.id.to_string(),
            sequence: self.sequence,
            timestamp_unix_ms: self.now_ms as i64,
            kind: None,
        });
    }

    /// One turn: the coordinator decides, then every running attempt starts and either spawns
    /// (the first instance of `fan`) or completes.
    pub fn step(&mut self) -> anyhow::Result<()> {
        self.now_ms += 10;
        for command in self.machine.decide(self.now_ms) {
            self.record(command.into_event(self.now_ms).body)?;
        }
        let running: Vec<TaskInstanceId> = self.machine.instances_in(TaskState::Running).collect();
        for instance in running {
            let attempt = self.machine.attempt(instance).context("running instance")?;
            self.record(EventBody::TaskStarted {
                instance,
                attempt,
                worker: WorkerId("worker-1".to_owned()),
            })?;
            let task_id = self
                .machine
                .instance_task(instance)
                .map(|task_idx| self.machine.plan().tasks[task_idx].id.clone());
            let is_first_fan = task_id.as_deref() == Some("fan")
                && self.spawned.is_empty()
                && self.spawned.insert(instance);
            if is_first_fan {
                self.record(EventBody::SubtasksSpawned {
                    instance,
                    attempt,
                    group: GroupId::v7(self.now_ms, [7; 10]),
                    rule: GroupRule::default(),
                    members: (0..self.members)
                        .map(|n| SubtaskSpec {
                            task_type: "noop".to_owned(),
                            queue: None,
                            input: serde_json::json!({ "member": n }),
                        })
                        .collect(),
                })?;
            } else {
                self.record(EventBody::TaskCompleted {
                    instance,
                    attempt,
                    output: serde_json::json!({ "done": instance.to_string() }),
                    usage: Usage {
                        tokens_used: 10,
                        cost: 0.5,
                    },
                })?;
            }
        }
        Ok(())
    }

    /// Returns true once the execution ended.
    pub fn finished(&self) -> bool {
        self.machine.state().is_terminal()
    }

    /// Takes the log entries recorded since the last call, as one batch (`None` when there are
    /// none).
    pub fn take_batch(&mut self) -> Option<v1::EventBatch> {
        (!self.pending.is_empty()).then(|| v1::EventBatch {
            events: std::mem::take(&mut self.pending),
        })
    }

    /// Returns the records the store should hold, in `task_instance_id` order.
    pub fn expected_records(&self) -> Vec<v1::TaskInstance> {
        let mut records: Vec<v1::TaskInstance> = self
            .machine
            .records()
            .iter()
            .map(read::record_to_proto)
            .collect();
        records.sort_by(|a, b| a.task_instance_id.cmp(&b.task_instance_id));
        records
    }
}
