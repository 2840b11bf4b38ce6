//! The fault tests' plan and the check of what an execution of it left behind: nothing lost,
//! nothing doubled, every group resumed once.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::bail;
use trellis_proto::v1::{self, ExecutionState, TaskState, event};

use crate::system::describe;

/// An execution that ended, as [`crate::system::System::check_end`] read it.
#[derive(Debug)]
pub struct Ended {
    pub execution: v1::Execution,
    pub graph: v1::ExecutionGraph,
    pub events: Vec<v1::Event>,
}

/// The plan of the fault tests: `parents` plan tasks of type `fanout`, each spawning a group of
/// `members` `sleep` subtasks.
#[derive(Debug, Clone, Copy)]
pub struct FanoutPlan {
    pub parents: usize,
    pub members: usize,
    /// How long each subtask sleeps: the run must last long enough for the faults to land in it.
    pub member_ms: u64,
}

impl FanoutPlan {
    /// Returns the plan's YAML.
    pub fn yaml(&self) -> String {
        let mut yaml = String::from("name: system-faults\ntasks:\n");
        for idx in 0..self.parents {
            yaml.push_str(&format!(
                "- {{id: fan-{idx}, type: fanout, input: {{count: {}, child: {{type: sleep, input: {{ms: {}}}}}}}}}\n",
                self.members, self.member_ms
            ));
        }
        yaml
    }

    /// Returns how many subtasks the execution runs in all.
    pub fn n_members(&self) -> usize {
        self.parents * self.members
    }

    /// Returns how many instances complete in a good run: every member, each parent, and each
    /// parent's one resumed instance.
    pub fn n_completed(&self) -> u64 {
        (self.n_members() + 2 * self.parents) as u64
    }
}

/// Checks a finished execution of `plan` lost nothing and doubled nothing: from the graph, every
/// member and every resumed parent completed and each group resumed its parent exactly once; from
/// the event log, no gaps or repeats in the sequence, and exactly one `TaskCompleted` for each
/// member and resumed parent of the graph and for nothing else.
/// Reports every violation at once.
pub fn check_outcome(
    plan: &FanoutPlan,
    execution: &v1::Execution,
    graph: &v1::ExecutionGraph,
    events: &[v1::Event],
) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    if execution.state() != ExecutionState::Completed {
        problems.push(format!(
            "the execution did not complete: {}",
            describe(execution)
        ));
    }

    // The graph. Its root record stands for the execution; the root's group holds the plan
    // tasks' first instances (here the fanout parents), the other groups are the spawned ones.
    let root_idx = graph.root_indices.first().copied();
    let root_group = root_idx
        .and_then(|idx| graph.nodes.get(idx as usize))
        .and_then(|root| match root.next {
            Some(v1::graph_node::Next::GroupIndex(group_idx)) => {
                graph.groups.get(group_idx as usize)
            }
            _ => None,
        })
        .map(|group| group.group_id.as_str());
    if root_group.is_none() {
        problems.push("the graph has no root whose group holds the plan tasks".to_owned());
    }
    let records: Vec<&v1::TaskInstance> = graph
        .nodes
        .iter()
        .enumerate()
        .filter(|(idx, _)| Some(*idx as u32) != root_idx)
        .filter_map(|(_, node)| node.record.as_ref())
        .collect();
    let mut n_plan_tasks = 0;
    let mut members_by_group: HashMap<&str, usize> = HashMap::new();
    let mut resumed_by_group: HashMap<&str, usize> = HashMap::new();
    let mut not_completed: BTreeMap<String, usize> = BTreeMap::new();
    // Members and resumed parents end with a `TaskCompleted` of their own; a parent that spawned
    // a group completes through its resumed instance instead.
    let mut completed_by_a_worker: HashSet<&str> = HashSet::new();
    for record in &records {
        match record.subtask_group_id.as_deref() {
            Some(group) if Some(group) == root_group => n_plan_tasks += 1,
            Some(group) => {
                *members_by_group.entry(group).or_default() += 1;
                completed_by_a_worker.insert(&record.task_instance_id);
            }
            None => {}
        }
        if let Some(group) = record.resumed_after_subtasks_group_id.as_deref() {
            *resumed_by_group.entry(group).or_default() += 1;
            completed_by_a_worker.insert(&record.task_instance_id);
        }
        if record.state() != TaskState::Completed {
            *not_completed
                .entry(format!("{:?}", record.state()))
                .or_default() += 1;
        }
    }
    if n_plan_tasks != plan.parents {
        problems.push(format!(
            "the graph has {n_plan_tasks} plan task instances, the plan has {}",
            plan.parents
        ));
    }
    let n_members: usize = members_by_group.values().sum();
    if n_members != plan.n_members() {
        problems.push(format!(
            "the graph has {n_members} subtasks, the plan spawns {}",
            plan.n_members()
        ));
    }
    if members_by_group.len() != plan.parents {
        problems.push(format!(
            "the graph has {} subtask groups, the plan spawns {}",
            members_by_group.len(),
            plan.parents
        ));
    }
    for (group, n) in &members_by_group {
        if *n != plan.members {
            problems.push(format!(
                "group {group} has {n} members, not {}",
                plan.members
            ));
        }
        match resumed_by_group.get(group) {
            Some(1) => {}
            Some(n) => problems.push(format!("group {group} resumed its parent {n} times")),
            None => problems.push(format!("group {group} never resumed its parent")),
        }
    }
    for group in resumed_by_group.keys() {
        if !members_by_group.contains_key(group) {
            problems.push(format!(
                "an instance resumed after {group}, a group with no members"
            ));
        }
    }
    if !not_completed.is_empty() {
        problems.push(format!(
            "instances not completed, by state: {not_completed:?}"
        ));
    }
    let completed_in_graph: HashSet<&str> = records
        .iter()
        .filter(|record| record.state() == TaskState::Completed)
        .map(|record| record.task_instance_id.as_str())
        .collect();
    if completed_in_graph.len() as u64 != plan.n_completed() {
        problems.push(format!(
            "{} instances completed, a good run completes {}",
            completed_in_graph.len(),
            plan.n_completed()
        ));
    }

    // The event log.
    let mut completions: HashMap<&str, usize> = HashMap::new();
    let mut spawns: HashMap<&str, usize> = HashMap::new();
    let mut sequence_problems = Vec::new();
    for (idx, event) in events.iter().enumerate() {
        let expected = idx as u64 + 1;
        if event.sequence != expected && sequence_problems.len() < 5 {
            sequence_problems.push(format!(
                "event {idx} has sequence {}, expected {expected}",
                event.sequence
            ));
        }
        match &event.kind {
            Some(event::Kind::TaskCompleted(completed)) => {
                *completions.entry(&completed.task_instance_id).or_default() += 1;
            }
            Some(event::Kind::SubtasksSpawned(spawned)) => {
                *spawns.entry(&spawned.task_instance_id).or_default() += 1;
            }
            _ => {}
        }
    }
    if events.is_empty() {
        problems.push("the event log is empty".to_owned());
    }
    if !sequence_problems.is_empty() {
        problems.push(format!(
            "the event log has gaps or repeats: {}",
            sequence_problems.join("; ")
        ));
    }
    let twice: Vec<(&&str, &usize)> = completions.iter().filter(|(_, n)| **n > 1).collect();
    if !twice.is_empty() {
        problems.push(format!(
            "{} instances have more than one TaskCompleted in the log, e.g. {:?}",
            twice.len(),
            twice.iter().take(3).collect::<Vec<_>>()
        ));
    }
    let logged: HashSet<&str> = completions.keys().copied().collect();
    if logged != completed_by_a_worker {
        problems.push(format!(
            "the log completes {} instances, the graph has {} members and resumed parents ({} only in the log, {} only in the graph)",
            logged.len(),
            completed_by_a_worker.len(),
            logged.difference(&completed_by_a_worker).count(),
            completed_by_a_worker.difference(&logged).count()
        ));
    }
    if spawns.len() != plan.parents || spawns.values().any(|n| *n != 1) {
        problems.push(format!(
            "the log has SubtasksSpawned from {} instances ({} in all), expected one from each of {} parents",
            spawns.len(),
            spawns.values().sum::<usize>(),
            plan.parents
        ));
    }
    match events.last().and_then(|event| event.kind.as_ref()) {
        Some(event::Kind::ExecutionFinished(_)) => {}
        other => problems.push(format!(
            "the log does not end with ExecutionFinished but with {other:?}"
        )),
    }

    if problems.is_empty() {
        Ok(())
    } else {
        bail!(
            "the execution lost or doubled work:\n- {}",
            problems.join("\n- ")
        )
    }
}

mod tests {
    use super::*;

    /// What the check reads: the execution, its graph and its log.
    type Run = (v1::Execution, v1::ExecutionGraph, Vec<v1::Event>);

    const PLAN: FanoutPlan = FanoutPlan {
        parents: 2,
        members: 3,
        member_ms: 0,
    };

    fn record(id: String, state: TaskState) -> v1::TaskInstance {
        v1::TaskInstance {
            task_instance_id: id,
            state: state as i32,
            ..v1::TaskInstance::default()
        }
    }

    fn node(record: v1::TaskInstance, next: Option<v1::graph_node::Next>) -> v1::GraphNode {
        v1::GraphNode {
            record: Some(record),
            next,
        }
    }

    fn event(kind: event::Kind) -> v1::Event {
        v1::Event {
            kind: Some(kind),
            ..v1::Event::default()
        }
    }

    fn completed_event(id: &str) -> v1::Event {
        event(event::Kind::TaskCompleted(v1::TaskCompleted {
            task_instance_id: id.to_owned(),
            ..v1::TaskCompleted::default()
        }))
    }

    /// A good run of `PLAN`: its execution, graph and log.
    fn good_run() -> Run {
        let mut nodes = vec![node(
            record("root".to_owned(), TaskState::Completed),
            Some(v1::graph_node::Next::GroupIndex(0)),
        )];
        let mut groups = vec![v1::GraphGroup {
            group_id: "plan".to_owned(),
            ..v1::GraphGroup::default()
        }];
        let mut events = vec![event(event::Kind::ExecutionStarted(
            v1::ExecutionStarted::default(),
        ))];
        for parent in 0..PLAN.parents {
            let group = format!("g{parent}");
            let group_idx = groups.len() as u32;
            groups[0].node_indices.push(nodes.len() as u32);
            let mut parent_record = record(format!("p{parent}"), TaskState::Completed);
            parent_record.subtask_group_id = Some("plan".to_owned());
            nodes.push(node(
                parent_record,
                Some(v1::graph_node::Next::GroupIndex(group_idx)),
            ));
            events.push(event(event::Kind::SubtasksSpawned(v1::SubtasksSpawned {
                task_instance_id: format!("p{parent}"),
                ..v1::SubtasksSpawned::default()
            })));
            let mut spawned = v1::GraphGroup {
                group_id: group.clone(),
                ..v1::GraphGroup::default()
            };
            for member in 0..PLAN.members {
                let id = format!("m{parent}-{member}");
                let mut member_record = record(id.clone(), TaskState::Completed);
                member_record.subtask_group_id = Some(group.clone());
                spawned.node_indices.push(nodes.len() as u32);
                nodes.push(node(member_record, None));
                events.push(completed_event(&id));
            }
            let mut resumed = record(format!("r{parent}"), TaskState::Completed);
            resumed.resumed_after_subtasks_group_id = Some(group);
            spawned.next_node_index = Some(nodes.len() as u32);
            nodes.push(node(resumed, None));
            events.push(completed_event(&format!("r{parent}")));
            groups.push(spawned);
        }
        events.push(event(event::Kind::ExecutionFinished(
            v1::ExecutionFinished::default(),
        )));
        for (idx, event) in events.iter_mut().enumerate() {
            event.sequence = idx as u64 + 1;
        }
        let execution = v1::Execution {
            state: ExecutionState::Completed as i32,
            ..v1::Execution::default()
        };
        let graph = v1::ExecutionGraph {
            nodes,
            groups,
            root_indices: vec![0],
        };
        (execution, graph, events)
    }

    /// Runs the check and returns its complaint, empty when it found none.
    fn complaint(run: &Run) -> String {
        check_outcome(&PLAN, &run.0, &run.1, &run.2)
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_good_run_passes_the_check() {
        assert_eq!(complaint(&good_run()), "");
    }

    #[test]
    fn the_check_catches_lost_and_doubled_work() {
        let check = |what: &str, spoil: &dyn Fn(&mut Run), expected: &str| {
            let mut run = good_run();
            spoil(&mut run);
            let complaint = complaint(&run);
            assert!(complaint.contains(expected), "{what}: {complaint:?}");
        };
        check(
            "a second resumed parent",
            &|run| {
                let mut again = record("r0-again".to_owned(), TaskState::Completed);
                again.resumed_after_subtasks_group_id = Some("g0".to_owned());
                run.1.nodes.push(node(again, None));
                run.2.push(completed_event("r0-again"));
            },
            "resumed its parent 2 times",
        );
        check(
            "a lost member",
            &|run| {
                let lost = run.1.nodes.iter_mut().find_map(|node| {
                    node.record
                        .as_mut()
                        .filter(|record| record.task_instance_id == "m1-2")
                });
                if let Some(lost) = lost {
                    lost.state = TaskState::Running as i32;
                }
                run.2.retain(|event| match &event.kind {
                    Some(event::Kind::TaskCompleted(completed)) => {
                        completed.task_instance_id != "m1-2"
                    }
                    _ => true,
                });
            },
            "instances not completed",
        );
        check(
            "a completion logged twice",
            &|run| {
                let last = run.2.len() - 1;
                run.2.insert(last, completed_event("m0-0"));
            },
            "more than one TaskCompleted",
        );
        check(
            "a repeated sequence",
            &|run| run.2[3].sequence = 3,
            "gaps or repeats",
        );
        check(
            "an execution that failed",
            &|run| run.0.state = ExecutionState::Failed as i32,
            "did not complete",
        );
    }
}
