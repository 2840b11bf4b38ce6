//! The `validate:` checks of an execution, summed up for `trellis status`.

/// The `validate:` checks of an execution's current attempts: how many passed, and which failed.
#[derive(Debug, Default, PartialEq)]
pub struct ChecksSummary {
    pub passed: usize,
    /// (task id, check name, level) of each failed check.
    pub failed: Vec<(String, String, String)>,
}

impl ChecksSummary {
    /// `checks     4 passed, 1 failed: build lint (codebase)`; `None` when no check ran.
    pub fn line(&self) -> Option<String> {
        if self.passed == 0 && self.failed.is_empty() {
            return None;
        }
        let mut line = format!("{:<10} {} passed", "checks", self.passed);
        if !self.failed.is_empty() {
            let names: Vec<String> = self
                .failed
                .iter()
                .map(|(task, check, level)| format!("{task} {check} ({level})"))
                .collect();
            line.push_str(&format!(
                ", {} failed: {}",
                self.failed.len(),
                names.join(", ")
            ));
        }
        line.push('\n');
        Some(line)
    }
}

/// Counts the checks of every instance's current attempt in `graph`.
pub fn summary(graph: &trellis_proto::v1::ExecutionGraph) -> ChecksSummary {
    let mut summary = ChecksSummary::default();
    for record in graph.nodes.iter().filter_map(|node| node.record.as_ref()) {
        for check in &record.validation {
            if check.passed {
                summary.passed += 1;
            } else {
                let level = trellis_proto::v1::CheckLevel::label_of(check.level).to_owned();
                summary
                    .failed
                    .push((record.task_id.clone(), check.name.clone(), level));
            }
        }
    }
    summary
}
