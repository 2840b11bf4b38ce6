//! Task templates' storage seam (seed 001 `task_templates`): per project, the defaults a new task
//! takes for the fields it leaves empty. The SQL is in `templates_sql.rs`.

use async_trait::async_trait;
use trellis_core::backlog::BacklogTask;

use super::Error;

/// A stored template.
#[derive(Clone, Debug, PartialEq)]
pub struct TemplateRow {
    pub project: String,
    /// Its slug, unique in its project.
    pub name: String,
    /// What it is for, for people.
    pub description: String,
    /// The defaults: every field but the title, the number, the placement, the relationships and
    /// the blocks.
    pub defaults: BacklogTask,
    /// How many tasks were made from it.
    pub usage_count: u32,
    pub created_at_unix_ms: i64,
    pub updated_at_unix_ms: i64,
}

/// The templates' table. Every method is one transaction: on an error nothing was changed.
#[async_trait]
pub trait Templates: Send + Sync {
    /// Stores a template, replacing one of the same name (keeping its usage count and creation
    /// time); `NotFound` without its project.
    async fn put_template(&self, template: &TemplateRow) -> Result<(), Error>;

    /// Returns one template.
    async fn template(&self, project: &str, name: &str) -> Result<Option<TemplateRow>, Error>;

    /// Returns a project's templates by name.
    async fn templates(&self, project: &str) -> Result<Vec<TemplateRow>, Error>;

    /// Deletes a template; false when there was none.
    async fn delete_template(&self, project: &str, name: &str) -> Result<bool, Error>;

    /// Counts one more task made from a template.
    async fn template_used(&self, project: &str, name: &str, now_ms: i64) -> Result<(), Error>;
}
