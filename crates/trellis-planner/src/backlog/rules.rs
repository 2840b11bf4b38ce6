//! Validation rules on a stored task: the built-in kinds on every change, custom commands on an
//! explicit check; an error-level finding blocks the task (`validation`), a clean check lifts it.

use tonic::Status;
use trellis_core::backlog::rules::{self, Finding, Rule, Severity};
use trellis_core::backlog::{BacklogTask, Block, BlockKind};

use super::{BacklogService, custom, now_ms, status};

impl BacklogService {
    /// Checks a stored task against the project's rules (custom commands only when asked) and
    /// blocks or unblocks it accordingly; returns the findings.
    pub(super) async fn apply_rules(
        &self,
        project: &str,
        task: &BacklogTask,
        run_custom: bool,
    ) -> Result<Vec<Finding>, Status> {
        let specs = self.store.rules(project).await.map_err(status)?;
        let rules: Vec<Rule> = specs
            .iter()
            .map(|spec| {
                Rule::parse(spec).map_err(|err| {
                    Status::internal(format!("stored rule {} is not valid: {err}", spec.name))
                })
            })
            .collect::<Result<_, _>>()?;
        let mut findings = rules::check(task, &rules);
        if run_custom {
            for rule in rules::custom_rules(task, &rules) {
                if let Some(finding) = custom::run(rule, task).await {
                    findings.push(finding);
                }
            }
        }
        let errors: Vec<&str> = findings
            .iter()
            .filter(|finding| finding.severity == Severity::Error)
            .map(|finding| finding.message.as_str())
            .collect();
        let reason = errors.join("; ");
        let open = task
            .blocks
            .iter()
            .find(|block| block.kind == BlockKind::Validation);
        let now = now_ms();
        match (errors.is_empty(), open) {
            (true, Some(_)) => {
                self.store
                    .resolve_blocks(
                        project,
                        task.number,
                        Some(BlockKind::Validation),
                        "the validation rules pass",
                        now,
                    )
                    .await
                    .map_err(status)?;
            }
            (false, Some(block)) if block.reason == reason => {}
            (false, open) => {
                if open.is_some() {
                    self.store
                        .resolve_blocks(
                            project,
                            task.number,
                            Some(BlockKind::Validation),
                            "checked again",
                            now,
                        )
                        .await
                        .map_err(status)?;
                }
                let block = Block {
                    kind: BlockKind::Validation,
                    reason,
                    blocking_task: None,
                };
                self.store
                    .add_block(project, task.number, &block, now)
                    .await
                    .map_err(status)?;
            }
            (true, None) => {}
        }
        Ok(findings)
    }
}
