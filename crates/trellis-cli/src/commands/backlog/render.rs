//! How the backlog's answers are printed: one line per task, list or run, a task in full, and
//! the JSON of `--json`.

use std::io::{self, Write};

use serde_json::{Value, json};
use trellis_proto::v1;

use super::Failure;

pub(super) fn write_run_line(out: &mut impl Write, run: &v1::ListRunView) -> io::Result<()> {
    write!(
        out,
        "run {:<3} {:<10} {}/{} completed, {} failed  execution {}",
        run.run_number,
        run.status,
        run.tasks_completed,
        run.tasks_total,
        run.tasks_failed,
        if run.execution_id.is_empty() {
            "-"
        } else {
            run.execution_id.as_str()
        }
    )?;
    if !run.reason.is_empty() {
        write!(out, "  ({})", run.reason)?;
    }
    writeln!(out)
}

pub(super) fn run_json(run: &v1::ListRunView) -> Value {
    json!({
        "list": run.list,
        "run": run.run_number,
        "execution_id": run.execution_id,
        "status": run.status,
        "task_type": run.task_type,
        "tasks_total": run.tasks_total,
        "tasks_completed": run.tasks_completed,
        "tasks_failed": run.tasks_failed,
        "reason": run.reason,
    })
}

pub(super) fn write_suggestions(
    out: &mut impl Write,
    suggestions: &[v1::GroupingSuggestion],
    json_output: bool,
) -> Result<(), Failure> {
    if json_output {
        let values: Vec<Value> = suggestions.iter().map(suggestion_json).collect();
        writeln!(out, "{}", json!({ "suggestions": values }))?;
        return Ok(());
    }
    for suggestion in suggestions {
        writeln!(
            out,
            "{}  {:<9} {:.2}  {:<20} {}",
            suggestion.id,
            suggestion.status,
            suggestion.score,
            suggestion.name,
            tasks_text(&suggestion.tasks)
        )?;
        writeln!(out, "    {}", suggestion.reason)?;
    }
    Ok(())
}

pub(super) fn tasks_text(tasks: &[u32]) -> String {
    tasks
        .iter()
        .map(|n| format!("T-{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn print_one(
    verb: &str,
    task: &v1::BacklogTaskView,
    json_output: bool,
) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    if json_output {
        writeln!(out, "{}", task_json(task))?;
    } else {
        write!(out, "{verb} ")?;
        write_task_line(&mut out, task)?;
    }
    Ok(())
}

pub(super) fn print_change(
    verb: &str,
    change: &v1::TaskChange,
    json_output: bool,
) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    let Some(task) = &change.task else {
        return Err(Failure::failed("the planner answered without the task"));
    };
    if json_output {
        let findings: Vec<Value> = change
            .findings
            .iter()
            .map(|f| json!({"rule": f.rule, "severity": f.severity, "message": f.message}))
            .collect();
        let suggestions: Vec<Value> = change.suggestions.iter().map(suggestion_json).collect();
        writeln!(
            out,
            "{}",
            json!({"task": task_json(task), "findings": findings, "suggestions": suggestions})
        )?;
        return Ok(());
    }
    write!(out, "{verb} ")?;
    write_task_line(&mut out, task)?;
    for finding in &change.findings {
        writeln!(
            out,
            "  {}: {} ({})",
            finding.severity, finding.message, finding.rule
        )?;
    }
    for suggestion in &change.suggestions {
        writeln!(
            out,
            "  suggested list {} ({:.2}): {} — {}\n    accept with: trellis suggestions accept {}",
            suggestion.name,
            suggestion.score,
            tasks_text(&suggestion.tasks),
            suggestion.reason,
            suggestion.id
        )?;
    }
    Ok(())
}

pub(super) fn print_tasks(tasks: &[v1::BacklogTaskView], json_output: bool) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    if json_output {
        let tasks: Vec<Value> = tasks.iter().map(task_json).collect();
        writeln!(out, "{}", json!({ "tasks": tasks }))?;
        return Ok(());
    }
    if tasks.is_empty() {
        writeln!(out, "no tasks: trellis tasks add TITLE")?;
    }
    for task in tasks {
        write_task_line(&mut out, task)?;
    }
    Ok(())
}

/// One line: id, priority, category, status, place, title, blocks.
pub(super) fn write_task_line(out: &mut impl Write, task: &v1::BacklogTaskView) -> io::Result<()> {
    let fields = task.fields.clone().unwrap_or_default();
    let place = if task.list.is_empty() {
        "queue".to_owned()
    } else {
        format!("{}#{}", task.list, task.position)
    };
    write!(
        out,
        "{:<6} {:<3} {:<11} {:<11} {:<14} {}",
        task.display_id, fields.priority, fields.category, task.status, place, fields.title
    )?;
    for block in &task.blocks {
        write!(out, "  [blocked, {}: {}]", block.kind, block.reason)?;
    }
    writeln!(out)
}

pub(super) fn write_task_detail(
    out: &mut impl Write,
    task: &v1::BacklogTaskView,
) -> io::Result<()> {
    let fields = task.fields.clone().unwrap_or_default();
    writeln!(out, "{}  {}", task.display_id, fields.title)?;
    let place = if task.list.is_empty() {
        "the evaluation queue".to_owned()
    } else {
        format!(
            "list {} at #{} ({})",
            task.list, task.position, task.item_status
        )
    };
    writeln!(out, "  status      {} in {place}", task.status)?;
    writeln!(
        out,
        "  kind        {} {}, effort {}, phase {}{}",
        fields.priority,
        fields.category,
        fields.effort,
        fields.phase,
        if task.quick_win { ", quick win" } else { "" }
    )?;
    writeln!(
        out,
        "  score       {} ({} waiting for it)",
        task.priority_score, task.blocks_count
    )?;
    if !fields.description.is_empty() {
        writeln!(out, "  description {}", fields.description)?;
    }
    for file in &fields.files {
        writeln!(out, "  file        {} ({})", file.path, file.operation)?;
    }
    for criterion in &fields.acceptance_criteria {
        writeln!(out, "  criterion   {criterion}")?;
    }
    for (level, tests) in [
        ("codebase", &fields.codebase_tests),
        ("api", &fields.api_tests),
        ("ui", &fields.ui_tests),
    ] {
        for test in tests {
            writeln!(out, "  test        {level}: {test}")?;
        }
    }
    for relationship in &fields.relationships {
        writeln!(
            out,
            "  relation    {} T-{}",
            relationship.kind, relationship.target
        )?;
    }
    for block in &task.blocks {
        writeln!(out, "  blocked     {}: {}", block.kind, block.reason)?;
    }
    Ok(())
}

pub(super) fn write_list_line(out: &mut impl Write, list: &v1::TaskListView) -> io::Result<()> {
    writeln!(
        out,
        "{:<20} {:<11} {} tasks, {} completed, {} failed; at most {} at once; {} runs",
        list.name,
        list.status,
        list.total_tasks,
        list.completed_tasks,
        list.failed_tasks,
        list.max_parallel_agents,
        list.runs
    )
}

pub(super) fn task_json(task: &v1::BacklogTaskView) -> Value {
    let fields = task.fields.clone().unwrap_or_default();
    json!({
        "id": task.display_id,
        "number": task.number,
        "project": task.project,
        "title": fields.title,
        "description": fields.description,
        "category": fields.category,
        "priority": fields.priority,
        "priority_score": task.priority_score,
        "effort": fields.effort,
        "phase": fields.phase,
        "status": task.status,
        "queue": task.queue,
        "list": task.list,
        "position": task.position,
        "item_status": task.item_status,
        "files": fields.files.iter().map(|f| json!({"path": f.path, "operation": f.operation})).collect::<Vec<_>>(),
        "acceptance_criteria": fields.acceptance_criteria,
        "codebase_tests": fields.codebase_tests,
        "api_tests": fields.api_tests,
        "ui_tests": fields.ui_tests,
        "relationships": fields.relationships.iter().map(|r| json!({"kind": r.kind, "target": r.target})).collect::<Vec<_>>(),
        "blocks": task.blocks.iter().map(|b| json!({"kind": b.kind, "reason": b.reason, "blocking_task": b.blocking_task})).collect::<Vec<_>>(),
    })
}

pub(super) fn list_json(list: &v1::TaskListView) -> Value {
    json!({
        "name": list.name,
        "description": list.description,
        "status": list.status,
        "max_parallel_agents": list.max_parallel_agents,
        "auto_execute": list.auto_execute,
        "runs": list.runs,
        "total_tasks": list.total_tasks,
        "completed_tasks": list.completed_tasks,
        "failed_tasks": list.failed_tasks,
    })
}

pub(super) fn suggestion_json(suggestion: &v1::GroupingSuggestion) -> Value {
    json!({
        "id": suggestion.id,
        "status": suggestion.status,
        "name": suggestion.name,
        "tasks": suggestion.tasks,
        "score": suggestion.score,
        "reason": suggestion.reason,
        "triggered_by": suggestion.triggered_by,
        "created_list": suggestion.created_list,
    })
}
