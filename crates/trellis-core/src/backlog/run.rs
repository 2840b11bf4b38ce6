//! From a task list to a plan: what `trellis lists run` starts.
//!
//! Each task of the list becomes a plan task (`T-<number>`) of the handler type the run names, its
//! input the task's fields, its files and dependencies those of the task, and its tests of the
//! three levels `validate:` checks; the list's `max_parallel_agents` is the plan's concurrency.
//! The plan then goes through the one compiler, which finds the waves and the file conflicts.

use serde_json::json;

use super::model::{BacklogTask, FieldError, ItemStatus, TaskStatus, display_id};
use super::order::prerequisites;
use crate::plan::spec::{
    CheckSpec, CommandSpec, FileOpSpec, FileSpec, OptionsSpec, PlanSpec, RelationshipSpec, TaskSpec,
};
use crate::plan::{CheckLevel, FileOp, RelationshipKind};
use crate::record::TaskState;

/// What a run of a list is made of.
#[derive(Clone, Debug)]
pub struct ListRun<'a> {
    pub project: &'a str,
    pub list: &'a str,
    pub run_number: u32,
    pub max_parallel_agents: u32,
    /// The handler type every task runs with (the handler build agents register).
    pub task_type: &'a str,
    /// The worker queue; `None` = the default queue.
    pub queue: Option<&'a str>,
}

/// The plan of one run of a list: `listed` are the list's tasks in order, `all` every task of the
/// project (for dependencies outside the list).
///
/// # Errors
///
/// The list is empty; a task is blocked; a task depends on one outside the list that is not
/// completed. Each error names the task (`tasks.T-3`) and says what to do.
pub fn list_plan(
    run: &ListRun<'_>,
    listed: &[BacklogTask],
    all: &[BacklogTask],
) -> Result<PlanSpec, FieldError> {
    if listed.is_empty() {
        return Err(FieldError::new(
            "list",
            format!(
                "list {} has no tasks (add some with `trellis lists add {} T-1`)",
                run.list, run.list
            ),
        ));
    }
    let waits = prerequisites(all);
    let in_list = |number: u32| listed.iter().any(|task| task.number == number);
    let mut tasks = Vec::with_capacity(listed.len());
    for task in listed {
        let field = format!("tasks.{}", task.display_id());
        if let Some(block) = task.blocks.first() {
            return Err(FieldError::new(
                field,
                format!(
                    "is blocked ({}: {}); unblock it or take it out of the list",
                    block.kind, block.reason
                ),
            ));
        }
        let mut depends_on = Vec::new();
        for &prerequisite in waits.get(&task.number).into_iter().flatten() {
            if in_list(prerequisite) {
                depends_on.push(display_id(prerequisite));
                continue;
            }
            let done = all
                .iter()
                .any(|other| other.number == prerequisite && other.status == TaskStatus::Completed);
            if !done {
                return Err(FieldError::new(
                    field,
                    format!(
                        "waits for {}, which is neither in list {} nor completed",
                        display_id(prerequisite),
                        run.list
                    ),
                ));
            }
        }
        // Relationships the compiler acts on besides dependencies, between tasks of this run.
        let relationships = task
            .links
            .iter()
            .filter(|link| link.kind == RelationshipKind::ConflictsWith && in_list(link.target))
            .map(|link| RelationshipSpec {
                kind: link.kind,
                target: display_id(link.target),
            })
            .collect();
        tasks.push(plan_task(run, task, depends_on, relationships));
    }
    Ok(PlanSpec {
        name: format!("{}-{}-run-{}", run.project, run.list, run.run_number),
        options: OptionsSpec {
            max_concurrency: Some(run.max_parallel_agents.max(1)),
            ..OptionsSpec::default()
        },
        tasks,
        ..PlanSpec::default()
    })
}

/// The list item status a plan task's latest instance stands for.
pub fn item_status(state: TaskState) -> ItemStatus {
    match state {
        TaskState::Pending | TaskState::Queued | TaskState::Blocked => ItemStatus::Pending,
        TaskState::Running
        | TaskState::WaitingForSubtasks
        | TaskState::WaitingForHuman
        | TaskState::RetryScheduled => ItemStatus::InProgress,
        TaskState::Completed => ItemStatus::Completed,
        TaskState::Failed => ItemStatus::Failed,
        // Not run to an end of its own: skipped by a route, or cancelled with its execution.
        TaskState::Skipped | TaskState::Cancelled => ItemStatus::Skipped,
    }
}

fn plan_task(
    run: &ListRun<'_>,
    task: &BacklogTask,
    depends_on: Vec<String>,
    relationships: Vec<RelationshipSpec>,
) -> TaskSpec {
    let files = task
        .files
        .iter()
        .map(|file| FileSpec {
            path: file.path.clone(),
            op: match file.op {
                FileOp::Create => FileOpSpec::Create,
                FileOp::Update => FileOpSpec::Update,
                FileOp::Delete => FileOpSpec::Delete,
                FileOp::Read => FileOpSpec::Read,
            },
            confidence: Some(file.confidence),
        })
        .collect();
    let mut validate = Vec::new();
    for level in [CheckLevel::Codebase, CheckLevel::Api, CheckLevel::Ui] {
        for (i, command) in task.tests(level).iter().enumerate() {
            validate.push(CheckSpec {
                name: format!("{}-{}", level.as_str(), i + 1),
                level,
                command: Some(CommandSpec::Shell(command.clone())),
                http: None,
                timeout: None,
            });
        }
    }
    TaskSpec {
        id: task.display_id(),
        task_type: run.task_type.to_owned(),
        queue: run.queue.map(str::to_owned),
        input: json!({
            "project": run.project,
            "list": run.list,
            "run": run.run_number,
            "task": task.display_id(),
            "title": task.title,
            "description": task.description,
            "category": task.category.as_str(),
            "priority": task.priority.as_str(),
            "effort": task.effort.as_str(),
            "phase": task.phase,
            "acceptance_criteria": task.acceptance_criteria,
        }),
        files,
        depends_on,
        relationships,
        validate,
        ..TaskSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyze;
    use crate::backlog::model::{
        Block, BlockKind, Category, Effort, Link, Placement, Priority, TaskStatus,
    };
    use crate::plan::FileImpact;
    use crate::plan::compile;

    fn task(number: u32, depends_on: &[u32]) -> BacklogTask {
        BacklogTask {
            number,
            title: format!("task {number}"),
            description: String::new(),
            category: Category::Feature,
            priority: Priority::P2,
            effort: Effort::Small,
            phase: 3,
            status: TaskStatus::Pending,
            placement: Placement::List("release".into()),
            files: vec![FileImpact {
                path: format!("src/{number}.rs"),
                op: FileOp::Create,
                confidence: 1.0,
            }],
            acceptance_criteria: vec!["works".into()],
            codebase_tests: vec!["cargo test".into()],
            api_tests: Vec::new(),
            ui_tests: vec!["npx playwright test".into()],
            links: depends_on
                .iter()
                .map(|&target| Link {
                    kind: RelationshipKind::DependsOn,
                    target,
                })
                .collect(),
            blocks: Vec::new(),
        }
    }

    const RUN: ListRun<'static> = ListRun {
        project: "web",
        list: "release",
        run_number: 2,
        max_parallel_agents: 2,
        task_type: "agent",
        queue: None,
    };

    #[test]
    fn a_list_compiles_to_a_plan_in_waves_with_its_tests_as_checks() {
        let listed = [task(1, &[]), task(2, &[]), task(3, &[1, 2])];
        let spec = list_plan(&RUN, &listed, &listed).expect("a plan");
        assert_eq!(spec.name, "web-release-run-2");
        assert_eq!(spec.options.max_concurrency, Some(2));
        let third = &spec.tasks[2];
        assert_eq!(third.id, "T-3");
        assert_eq!(third.depends_on, ["T-1", "T-2"]);
        let checks: Vec<(&str, CheckLevel)> = third
            .validate
            .iter()
            .map(|check| (check.name.as_str(), check.level))
            .collect();
        assert_eq!(
            checks,
            [
                ("codebase-1", CheckLevel::Codebase),
                ("ui-1", CheckLevel::Ui)
            ]
        );
        assert_eq!(third.input["title"], "task 3");
        let plan = compile(spec, &crate::plan::Limits::default()).expect("it compiles");
        assert_eq!(analyze(&plan).waves.len(), 2);
    }

    #[test]
    fn a_blocked_task_or_an_unfinished_outside_dependency_stops_the_run() {
        let mut blocked = task(2, &[]);
        blocked.blocks.push(Block {
            kind: BlockKind::Validation,
            reason: "acceptance_criteria is empty".into(),
            blocking_task: None,
        });
        let err = list_plan(&RUN, &[task(1, &[]), blocked], &[]).unwrap_err();
        assert_eq!(err.field, "tasks.T-2");
        assert!(err.message.contains("is blocked (validation: "), "{err}");

        // T-2 waits for T-1, which is in no list and not completed.
        let mut outside = task(1, &[]);
        outside.placement = Placement::Evaluation;
        let listed = [task(2, &[1])];
        let all = [outside.clone(), listed[0].clone()];
        let err = list_plan(&RUN, &listed, &all).unwrap_err();
        assert_eq!(err.field, "tasks.T-2");
        assert!(err.message.contains("waits for T-1"), "{err}");

        // Once T-1 is completed, T-2 runs without waiting for it.
        outside.status = TaskStatus::Completed;
        let all = [outside, listed[0].clone()];
        let spec = list_plan(&RUN, &listed, &all).expect("a plan");
        assert!(spec.tasks[0].depends_on.is_empty());

        let err = list_plan(&RUN, &[], &[]).unwrap_err();
        assert_eq!(err.field, "list");
    }
}
