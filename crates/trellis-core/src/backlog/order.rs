//! The order tasks must run in: dependency cycles among backlog tasks.
//!
//! A task waits for its `depends_on` targets, and for the tasks that say they `blocks` it.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{BacklogTask, display_id};
use crate::plan::RelationshipKind;

/// Returns each task's prerequisites: the tasks it must wait for.
pub fn prerequisites(tasks: &[BacklogTask]) -> BTreeMap<u32, BTreeSet<u32>> {
    let mut waits: BTreeMap<u32, BTreeSet<u32>> = tasks
        .iter()
        .map(|task| (task.number, BTreeSet::new()))
        .collect();
    for task in tasks {
        for link in &task.links {
            match link.kind {
                RelationshipKind::DependsOn => {
                    waits.entry(task.number).or_default().insert(link.target);
                }
                RelationshipKind::Blocks => {
                    waits.entry(link.target).or_default().insert(task.number);
                }
                _ => {}
            }
        }
    }
    waits
}

/// Returns a dependency cycle among `tasks` as the numbers along it (the first repeated at the
/// end: `[1, 2, 3, 1]` means T-1 waits for T-2, which waits for T-3, which waits for T-1), or
/// `None`. Deterministic: the cycle found from the lowest-numbered task that is on one.
pub fn dependency_cycle(tasks: &[BacklogTask]) -> Option<Vec<u32>> {
    let waits = prerequisites(tasks);
    // Iterative depth-first search with colours: 0 unvisited, 1 on the path, 2 done.
    let mut colour: BTreeMap<u32, u8> = BTreeMap::new();
    for &start in waits.keys() {
        if colour.get(&start).copied().unwrap_or(0) != 0 {
            continue;
        }
        let mut path: Vec<u32> = vec![start];
        let mut next: Vec<std::collections::btree_set::Iter<'_, u32>> = Vec::new();
        colour.insert(start, 1);
        let empty = BTreeSet::new();
        next.push(waits.get(&start).unwrap_or(&empty).iter());
        while let Some(children) = next.last_mut() {
            match children.next() {
                Some(&child) => match colour.get(&child).copied().unwrap_or(0) {
                    0 => {
                        colour.insert(child, 1);
                        path.push(child);
                        next.push(waits.get(&child).unwrap_or(&empty).iter());
                    }
                    1 => {
                        let from = path.iter().position(|&n| n == child).unwrap_or(0);
                        let mut cycle = path[from..].to_vec();
                        cycle.push(child);
                        return Some(cycle);
                    }
                    _ => {}
                },
                None => {
                    next.pop();
                    if let Some(done) = path.pop() {
                        colour.insert(done, 2);
                    }
                }
            }
        }
    }
    None
}

/// Writes a cycle as `T-1 → T-2 → T-1`.
pub fn describe_cycle(cycle: &[u32]) -> String {
    cycle
        .iter()
        .map(|&n| display_id(n))
        .collect::<Vec<_>>()
        .join(" → ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backlog::model::{Category, Effort, Link, Placement, Priority, TaskStatus};

    fn task(number: u32, links: &[(RelationshipKind, u32)]) -> BacklogTask {
        BacklogTask {
            number,
            title: format!("task {number}"),
            description: String::new(),
            category: Category::Task,
            priority: Priority::P3,
            effort: Effort::Medium,
            phase: 3,
            status: TaskStatus::Pending,
            placement: Placement::Evaluation,
            files: Vec::new(),
            acceptance_criteria: Vec::new(),
            codebase_tests: Vec::new(),
            api_tests: Vec::new(),
            ui_tests: Vec::new(),
            links: links
                .iter()
                .map(|&(kind, target)| Link { kind, target })
                .collect(),
            blocks: Vec::new(),
        }
    }

    #[test]
    fn a_chain_has_no_cycle_and_closing_it_is_found() {
        use RelationshipKind::DependsOn;
        let chain = [
            task(1, &[]),
            task(2, &[(DependsOn, 1)]),
            task(3, &[(DependsOn, 2)]),
        ];
        assert_eq!(dependency_cycle(&chain), None);
        let mut closed = chain.to_vec();
        closed[0] = task(1, &[(DependsOn, 3)]);
        let cycle = dependency_cycle(&closed).expect("a cycle");
        assert_eq!(cycle, [1, 3, 2, 1]);
        assert_eq!(describe_cycle(&cycle), "T-1 → T-3 → T-2 → T-1");
    }

    #[test]
    fn blocks_counts_as_the_reverse_dependency() {
        use RelationshipKind::{Blocks, DependsOn, RelatedTo};
        // T-1 blocks T-2 (T-2 waits for T-1) and T-1 depends on T-2: a cycle.
        let tasks = [task(1, &[(Blocks, 2), (DependsOn, 2)]), task(2, &[])];
        assert!(dependency_cycle(&tasks).is_some());
        // Metadata relationships order nothing.
        let tasks = [task(1, &[(RelatedTo, 2)]), task(2, &[(RelatedTo, 1)])];
        assert_eq!(dependency_cycle(&tasks), None);
    }
}
