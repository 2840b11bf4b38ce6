//! The backlog's wire messages read into core values (each error names the field's path) and
//! stored rows written back as messages.

use trellis_checkpoint_store::store::backlog::{ListRow, ProjectRow, SuggestionRow, TaskRow};
use trellis_core::backlog::grouping::Weights;
use trellis_core::backlog::model::{
    self, check_description, check_file_path, check_phase, check_title, file_op_name,
    parse_file_op, parse_relationship,
};
use trellis_core::backlog::rules::{Finding, RuleSpec, Severity};
use trellis_core::backlog::{
    BacklogTask, Category, Effort, FieldError, Link, Placement, Priority, TaskStatus,
};
use trellis_core::plan::FileImpact;
use trellis_proto::v1;

/// The fields an edit may name in its `update_mask`.
pub const EDITABLE: [&str; 12] = [
    "title",
    "description",
    "category",
    "priority",
    "effort",
    "phase",
    "files",
    "acceptance_criteria",
    "codebase_tests",
    "api_tests",
    "ui_tests",
    "relationships",
];

/// Reads a task's fields over `base` (a new task's defaults, or the stored task for an edit),
/// taking only the fields `only` names (all when `None`). Errors are prefixed with `fields.`.
pub fn task_fields(
    fields: &v1::BacklogTaskFields,
    mut base: BacklogTask,
    only: Option<&[String]>,
) -> Result<BacklogTask, FieldError> {
    let take = |name: &str| only.is_none_or(|names| names.iter().any(|n| n == name));
    let prefix = |err: FieldError| FieldError::new(format!("fields.{}", err.field), err.message);
    if take("title") {
        check_title(&fields.title).map_err(prefix)?;
        base.title = fields.title.trim().to_owned();
    }
    if take("description") {
        check_description(&fields.description).map_err(prefix)?;
        base.description = fields.description.clone();
    }
    if take("category") && !(only.is_none() && fields.category.is_empty()) {
        base.category = Category::parse("fields.category", &fields.category)?;
    }
    if take("priority") && !(only.is_none() && fields.priority.is_empty()) {
        base.priority = Priority::parse("fields.priority", &fields.priority)?;
    }
    if take("effort") && !(only.is_none() && fields.effort.is_empty()) {
        base.effort = Effort::parse("fields.effort", &fields.effort)?;
    }
    if take("phase") && !(only.is_none() && fields.phase == 0) {
        base.phase = check_phase(fields.phase).map_err(prefix)?;
    }
    if take("files") {
        base.files = fields
            .files
            .iter()
            .enumerate()
            .map(|(i, file)| {
                let field = format!("fields.files[{i}]");
                check_file_path(&format!("{field}.path"), &file.path)?;
                Ok(FileImpact {
                    path: file.path.clone(),
                    op: parse_file_op(&format!("{field}.operation"), &file.operation)?,
                    confidence: 1.0,
                })
            })
            .collect::<Result<_, FieldError>>()?;
    }
    let lines = |name: &str, values: &[String]| -> Result<Vec<String>, FieldError> {
        values
            .iter()
            .enumerate()
            .map(|(i, value)| {
                if value.trim().is_empty() {
                    Err(FieldError::new(
                        format!("fields.{name}[{i}]"),
                        "must not be empty",
                    ))
                } else {
                    Ok(value.clone())
                }
            })
            .collect()
    };
    if take("acceptance_criteria") {
        base.acceptance_criteria = lines("acceptance_criteria", &fields.acceptance_criteria)?;
    }
    if take("codebase_tests") {
        base.codebase_tests = lines("codebase_tests", &fields.codebase_tests)?;
    }
    if take("api_tests") {
        base.api_tests = lines("api_tests", &fields.api_tests)?;
    }
    if take("ui_tests") {
        base.ui_tests = lines("ui_tests", &fields.ui_tests)?;
    }
    if take("relationships") {
        let mut links: Vec<Link> = Vec::new();
        for (i, relationship) in fields.relationships.iter().enumerate() {
            let field = format!("fields.relationships[{i}]");
            let kind = parse_relationship(&format!("{field}.kind"), &relationship.kind)?;
            if relationship.target == 0 {
                return Err(FieldError::new(
                    format!("{field}.target"),
                    "names no task (expected a task number, such as 12 for T-12)",
                ));
            }
            if relationship.target == base.number {
                return Err(FieldError::new(
                    format!("{field}.target"),
                    format!("a task cannot be related to itself ({})", base.display_id()),
                ));
            }
            let link = Link {
                kind,
                target: relationship.target,
            };
            if !links.contains(&link) {
                links.push(link);
            }
        }
        base.links = links;
    }
    Ok(base)
}

/// A new task's defaults: category `task`, priority `p3`, effort `medium`, phase 3.
pub fn new_task(placement: Placement) -> BacklogTask {
    let status = match placement {
        Placement::Evaluation => TaskStatus::Evaluating,
        Placement::List(_) => TaskStatus::Pending,
    };
    BacklogTask {
        number: 0,
        title: String::new(),
        description: String::new(),
        category: Category::Task,
        priority: Priority::P3,
        effort: Effort::Medium,
        phase: 3,
        status,
        placement,
        files: Vec::new(),
        acceptance_criteria: Vec::new(),
        codebase_tests: Vec::new(),
        api_tests: Vec::new(),
        ui_tests: Vec::new(),
        links: Vec::new(),
        blocks: Vec::new(),
    }
}

/// Reads grouping weights (absent = the defaults) and checks them.
pub fn weights(weights: Option<&v1::GroupingWeights>) -> Result<Weights, FieldError> {
    let Some(w) = weights else {
        return Ok(Weights::default());
    };
    let weights = Weights {
        file_overlap: w.file_overlap,
        dependency: w.dependency,
        category: w.category,
        description: w.description,
        component: w.component,
    };
    weights.check()?;
    Ok(weights)
}

/// Writes grouping weights.
pub fn weights_to_proto(weights: &Weights) -> v1::GroupingWeights {
    v1::GroupingWeights {
        file_overlap: weights.file_overlap,
        dependency: weights.dependency,
        category: weights.category,
        description: weights.description,
        component: weights.component,
    }
}

/// Writes a project.
pub fn project_to_proto(project: &ProjectRow) -> v1::BacklogProject {
    v1::BacklogProject {
        project: project.project.clone(),
        name: project.name.clone(),
        description: project.description.clone(),
        weights: Some(weights_to_proto(&project.weights)),
        created_at_unix_ms: project.created_at_unix_ms,
    }
}

/// Writes a task's fields.
pub fn fields_to_proto(task: &BacklogTask) -> v1::BacklogTaskFields {
    v1::BacklogTaskFields {
        title: task.title.clone(),
        description: task.description.clone(),
        category: task.category.as_str().to_owned(),
        priority: task.priority.as_str().to_owned(),
        effort: task.effort.as_str().to_owned(),
        phase: u32::from(task.phase),
        files: task
            .files
            .iter()
            .map(|file| v1::BacklogFile {
                path: file.path.clone(),
                operation: file_op_name(file.op).to_owned(),
            })
            .collect(),
        acceptance_criteria: task.acceptance_criteria.clone(),
        codebase_tests: task.codebase_tests.clone(),
        api_tests: task.api_tests.clone(),
        ui_tests: task.ui_tests.clone(),
        relationships: task
            .links
            .iter()
            .map(|link| v1::BacklogRelationship {
                kind: link.kind.as_str().to_owned(),
                target: link.target,
            })
            .collect(),
    }
}

/// Writes a stored task; `waiting` is how many tasks of the project depend on it.
pub fn task_to_proto(row: &TaskRow, waiting: usize) -> v1::BacklogTaskView {
    let task = &row.task;
    v1::BacklogTaskView {
        project: row.project.clone(),
        number: task.number,
        display_id: task.display_id(),
        fields: Some(fields_to_proto(task)),
        status: task.status.as_str().to_owned(),
        queue: match task.placement {
            Placement::Evaluation => model::EVALUATION_QUEUE.to_owned(),
            Placement::List(_) => String::new(),
        },
        list: task.placement.list().unwrap_or_default().to_owned(),
        position: row.position.unwrap_or(0),
        item_status: row
            .item_status
            .map(|status| status.as_str().to_owned())
            .unwrap_or_default(),
        priority_score: task.priority_score(waiting),
        quick_win: task.is_quick_win(),
        blocks_count: u32::try_from(waiting).unwrap_or(u32::MAX),
        blocks: task
            .blocks
            .iter()
            .map(|block| v1::BacklogBlock {
                kind: block.kind.as_str().to_owned(),
                reason: block.reason.clone(),
                blocking_task: block.blocking_task.unwrap_or(0),
            })
            .collect(),
        created_at_unix_ms: row.created_at_unix_ms,
        updated_at_unix_ms: row.updated_at_unix_ms,
    }
}

/// Writes a list.
pub fn list_to_proto(list: &ListRow) -> v1::TaskListView {
    v1::TaskListView {
        project: list.project.clone(),
        name: list.name.clone(),
        description: list.description.clone(),
        status: list.status.as_str().to_owned(),
        max_parallel_agents: list.max_parallel_agents,
        auto_execute: list.auto_execute,
        runs: list.runs,
        total_tasks: list.total_tasks,
        completed_tasks: list.completed_tasks,
        failed_tasks: list.failed_tasks,
        created_at_unix_ms: list.created_at_unix_ms,
    }
}

/// Writes a suggestion.
pub fn suggestion_to_proto(row: &SuggestionRow) -> v1::GroupingSuggestion {
    v1::GroupingSuggestion {
        id: row.suggestion_id.to_string(),
        status: row.status.clone(),
        name: row.suggestion.name.clone(),
        tasks: row.suggestion.tasks.clone(),
        score: row.suggestion.score,
        reason: row.suggestion.reason.clone(),
        triggered_by: row.triggered_by.clone(),
        created_list: row.created_list.clone().unwrap_or_default(),
        created_at_unix_ms: row.created_at_unix_ms,
    }
}

/// Writes a finding.
pub fn finding_to_proto(finding: &Finding) -> v1::RuleFinding {
    v1::RuleFinding {
        rule: finding.rule.clone(),
        severity: match finding.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
        .to_owned(),
        message: finding.message.clone(),
    }
}

/// Reads a rule as sent (checked by `Rule::parse` before it is stored).
pub fn rule_spec(rule: &v1::ValidationRuleSpec) -> RuleSpec {
    RuleSpec {
        name: rule.name.clone(),
        description: rule.description.clone(),
        kind: rule.kind.clone(),
        categories: rule.categories.clone(),
        field: rule.field.clone(),
        pattern: rule.pattern.clone(),
        levels: rule.levels.clone(),
        command: rule.command.clone(),
        severity: rule.severity.clone(),
        enabled: rule.enabled,
    }
}

/// Writes a rule.
pub fn rule_to_proto(rule: &RuleSpec) -> v1::ValidationRuleSpec {
    v1::ValidationRuleSpec {
        name: rule.name.clone(),
        description: rule.description.clone(),
        kind: rule.kind.clone(),
        categories: rule.categories.clone(),
        field: rule.field.clone(),
        pattern: rule.pattern.clone(),
        levels: rule.levels.clone(),
        command: rule.command.clone(),
        severity: rule.severity.clone(),
        enabled: rule.enabled,
    }
}
