// Task templates' SQL, compiled once per backend like `backlog_sql.rs`: `postgres.rs` and
// `sqlite.rs` include it after `sql.rs` and `backlog_sql.rs`.
//
// (A plain `//` header: an included file cannot carry inner doc comments.)

mod templates_sql {
    use async_trait::async_trait;

    use super::backlog_sql::failed;
    use super::{DbRow, StoreImpl, column};
    use crate::store::templates::{TemplateRow, Templates};
    use crate::store::{Error, ErrorKind};

    const COLUMNS: &str =
        "project, name, description, defaults, usage_count, created_at_unix_ms, updated_at_unix_ms";

    fn template_from_row(row: &DbRow) -> Result<TemplateRow, Error> {
        let defaults: String = column(row, "defaults")?;
        Ok(TemplateRow {
            project: column(row, "project")?,
            name: column(row, "name")?,
            description: column(row, "description")?,
            defaults: serde_json::from_str(&defaults).map_err(|err| {
                Error::new(
                    ErrorKind::Internal,
                    format!("stored template defaults are not valid: {err}"),
                )
            })?,
            usage_count: u32::try_from(column::<i32>(row, "usage_count")?).unwrap_or(0),
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
            updated_at_unix_ms: column(row, "updated_at_unix_ms")?,
        })
    }

    #[async_trait]
    impl Templates for StoreImpl {
        async fn put_template(&self, template: &TemplateRow) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let defaults = serde_json::to_string(&template.defaults).map_err(|err| {
                Error::new(
                    ErrorKind::Internal,
                    format!("cannot write template {}: {err}", template.name),
                )
            })?;
            sqlx::query(&format!(
                "INSERT INTO backlog_templates ({COLUMNS}) VALUES ($1, $2, $3, $4, 0, $5, $5) \
                 ON CONFLICT (project, name) DO UPDATE SET description = excluded.description, \
                 defaults = excluded.defaults, updated_at_unix_ms = excluded.updated_at_unix_ms"
            ))
            .bind(&template.project)
            .bind(&template.name)
            .bind(&template.description)
            .bind(defaults)
            .bind(template.updated_at_unix_ms)
            .execute(self.pool())
            .await
            .map_err(failed(format!(
                "cannot store template {} of project {}",
                template.name, template.project
            )))?;
            Ok(())
        }

        async fn template(&self, project: &str, name: &str) -> Result<Option<TemplateRow>, Error> {
            sqlx::query(&format!(
                "SELECT {COLUMNS} FROM backlog_templates WHERE project = $1 AND name = $2"
            ))
            .bind(project)
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(failed(format!("failed to read template {name} of {project}")))?
            .as_ref()
            .map(template_from_row)
            .transpose()
        }

        async fn templates(&self, project: &str) -> Result<Vec<TemplateRow>, Error> {
            sqlx::query(&format!(
                "SELECT {COLUMNS} FROM backlog_templates WHERE project = $1 ORDER BY name"
            ))
            .bind(project)
            .fetch_all(self.pool())
            .await
            .map_err(failed(format!("failed to read the templates of {project}")))?
            .iter()
            .map(template_from_row)
            .collect()
        }

        async fn delete_template(&self, project: &str, name: &str) -> Result<bool, Error> {
            let _writes = self.lock_writes().await;
            let deleted =
                sqlx::query("DELETE FROM backlog_templates WHERE project = $1 AND name = $2")
                    .bind(project)
                    .bind(name)
                    .execute(self.pool())
                    .await
                    .map_err(failed(format!("cannot delete template {name}")))?;
            Ok(deleted.rows_affected() > 0)
        }

        async fn template_used(&self, project: &str, name: &str, now_ms: i64) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            sqlx::query(
                "UPDATE backlog_templates SET usage_count = usage_count + 1, \
                 updated_at_unix_ms = $1 WHERE project = $2 AND name = $3",
            )
            .bind(now_ms)
            .bind(project)
            .bind(name)
            .execute(self.pool())
            .await
            .map_err(failed(format!("cannot count a use of template {name}")))?;
            Ok(())
        }
    }
}
