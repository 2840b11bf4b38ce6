//! Benchmark of the execution-graph builder on one large execution: 1,000,000 task instances.
//!
//! The shape is a realistic fan-out: the root spawns a group of about 100 subtasks, each of which
//! spawns its own group, and so on breadth-first until the budget is spent; every group is resumed,
//! and one leaf in 64 is continued (a human answer). The records are shuffled, as a read model
//! gives no useful order, and the build alone is timed (the input clone and the drop are not).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use trellis_core::graph;
use trellis_core::ids::{ExecutionId, GroupId, TaskInstanceId};
use trellis_core::record::{TaskState, TaskStatusRecord};

const N_INSTANCES: usize = 1_000_000;
const T0: u64 = 1_700_000_000_000;

/// A small xorshift, so the data set is the same on every run.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn record(n: usize, task_id: &str) -> TaskStatusRecord {
    TaskStatusRecord {
        // Shifted clear of the bits the UUIDv7 layout overwrites in a derived seed.
        task_instance_id: TaskInstanceId::derived(T0 + n as u64 / 1000, (n as u128) << 24),
        task_id: task_id.to_owned(),
        parent_task_instance_id: None,
        subtask_group_id: None,
        resumed_after_subtasks_group_id: None,
        continues_task_instance_id: None,
        correlation_id: ExecutionId::derived(T0, 1),
        run_number: 1,
        attempt: 1,
        state: TaskState::Completed,
        worker_id: None,
        created_at_ms: T0 + n as u64 / 1000,
        dispatched_at_ms: None,
        started_at_ms: Some(T0 + n as u64 / 1000),
        ended_at_ms: Some(T0 + n as u64 / 1000 + 5),
        output: None,
        error: None,
        earlier_attempts: Vec::new(),
        validation: Vec::new(),
    }
}

/// Builds the records of one execution of `n_instances` instances, shuffled.
fn execution(n_instances: usize) -> Vec<TaskStatusRecord> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut records = vec![record(0, "plan")];
    let mut to_expand = std::collections::VecDeque::from([0usize]);
    let mut n_groups: u128 = 0;
    while records.len() < n_instances {
        let Some(parent) = to_expand.pop_front() else {
            break;
        };
        let parent_id = records[parent].task_instance_id;
        let group_id = GroupId::derived(T0, n_groups << 24);
        n_groups += 1;
        let n_members = 50 + (rng.next_u64() % 101) as usize;
        for _ in 0..n_members {
            if records.len() + 2 > n_instances {
                break;
            }
            let n = records.len();
            let mut member = record(n, "work");
            member.parent_task_instance_id = Some(parent_id);
            member.subtask_group_id = Some(group_id);
            records.push(member);
            // A continued member goes on as its continuation, which may spawn a group in turn.
            if rng.next_u64().is_multiple_of(64) {
                let mut answer = record(n + 1, "work");
                answer.continues_task_instance_id = Some(records[n].task_instance_id);
                records.push(answer);
                to_expand.push_back(n + 1);
            } else {
                to_expand.push_back(n);
            }
        }
        if records.len() < n_instances {
            let mut resumed = record(records.len(), &records[parent].task_id.clone());
            resumed.resumed_after_subtasks_group_id = Some(group_id);
            records.push(resumed);
        }
    }
    for i in (1..records.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        records.swap(i, j);
    }
    records
}

fn bench_build(c: &mut Criterion) {
    let records = execution(N_INSTANCES);
    let n_groups = graph::build(records.clone())
        .map(|graph| graph.n_groups())
        .unwrap_or_else(|err| panic!("the benchmark data is not a tree: {err}"));
    eprintln!("{} instances, {n_groups} groups", records.len());
    let mut group = c.benchmark_group("graph");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(15));
    group.bench_function("build_1m_instances", |b| {
        b.iter_batched(
            || records.clone(),
            |records| black_box(graph::build(records)),
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

criterion_group!(benches, bench_build);
criterion_main!(benches);
