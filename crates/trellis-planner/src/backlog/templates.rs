//! Task templates (seed 001 `task_templates`): a template's defaults are checked like a task's
//! fields; a new task made from one takes each field it leaves empty from it.

use tonic::{Request, Response, Status};
use trellis_checkpoint_store::store::templates::TemplateRow;
use trellis_core::backlog::model::{check_description, check_slug};
use trellis_core::backlog::{BacklogTask, FieldError, Placement};
use trellis_proto::v1;

use super::{BacklogService, invalid, now_ms, status, wire};

/// Reads a template's defaults: every field but the title and the relationships, checked as a
/// task's (errors name `template.defaults.<field>`).
fn defaults(fields: &v1::BacklogTaskFields) -> Result<BacklogTask, FieldError> {
    if !fields.title.is_empty() {
        return Err(FieldError::new(
            "template.defaults.title",
            "a template gives no title: each task has its own",
        ));
    }
    if !fields.relationships.is_empty() {
        return Err(FieldError::new(
            "template.defaults.relationships",
            "a template gives no relationships: they name tasks of their own",
        ));
    }
    let named = v1::BacklogTaskFields {
        // A stand-in the check passes; the stored defaults keep no title.
        title: "template".to_owned(),
        ..fields.clone()
    };
    let mut task =
        wire::task_fields(&named, wire::new_task(Placement::Evaluation), None).map_err(|err| {
            let field = err.field.replacen("fields.", "template.defaults.", 1);
            FieldError::new(field, err.message)
        })?;
    task.title = String::new();
    Ok(task)
}

fn template_to_proto(row: &TemplateRow) -> v1::TaskTemplate {
    v1::TaskTemplate {
        name: row.name.clone(),
        description: row.description.clone(),
        defaults: Some(wire::fields_to_proto(&row.defaults)),
        usage_count: row.usage_count,
        created_at_unix_ms: row.created_at_unix_ms,
        updated_at_unix_ms: row.updated_at_unix_ms,
    }
}

/// The fields a task given `fields` takes from itself rather than from its template: the title,
/// and each field it does not leave empty.
pub(super) fn given_fields(fields: &v1::BacklogTaskFields) -> Vec<String> {
    let given = [
        ("title", true),
        ("description", !fields.description.is_empty()),
        ("category", !fields.category.is_empty()),
        ("priority", !fields.priority.is_empty()),
        ("effort", !fields.effort.is_empty()),
        ("phase", fields.phase != 0),
        ("files", !fields.files.is_empty()),
        (
            "acceptance_criteria",
            !fields.acceptance_criteria.is_empty(),
        ),
        ("codebase_tests", !fields.codebase_tests.is_empty()),
        ("api_tests", !fields.api_tests.is_empty()),
        ("ui_tests", !fields.ui_tests.is_empty()),
        ("relationships", !fields.relationships.is_empty()),
    ];
    given
        .into_iter()
        .filter(|(_, given)| *given)
        .map(|(name, _)| name.to_owned())
        .collect()
}

impl BacklogService {
    /// The base a new task in `placement` starts from: the template's defaults (when one is
    /// named), else the plain defaults.
    pub(super) async fn task_base(
        &self,
        project: &str,
        template: &str,
        placement: Placement,
    ) -> Result<BacklogTask, Status> {
        let base = wire::new_task(placement);
        if template.is_empty() {
            return Ok(base);
        }
        let row = self
            .store
            .template(project, template)
            .await
            .map_err(status)?
            .ok_or_else(|| {
                Status::not_found(format!(
                    "template: project {project} has no template {template} (trellis templates \
                     list)"
                ))
            })?;
        Ok(BacklogTask {
            status: base.status,
            placement: base.placement,
            links: Vec::new(),
            blocks: Vec::new(),
            ..row.defaults
        })
    }

    pub(super) async fn put_template_now(
        &self,
        request: Request<v1::PutTemplateRequest>,
    ) -> Result<Response<v1::TaskTemplate>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let template = request
            .template
            .ok_or_else(|| Status::invalid_argument("template: missing"))?;
        check_slug("template.name", &template.name).map_err(invalid)?;
        check_description(&template.description)
            .map_err(|err| invalid(FieldError::new("template.description", err.message)))?;
        let defaults = defaults(&template.defaults.unwrap_or_default()).map_err(invalid)?;
        let now = now_ms();
        let row = TemplateRow {
            project: project.project.clone(),
            name: template.name.clone(),
            description: template.description,
            defaults,
            usage_count: 0,
            created_at_unix_ms: now,
            updated_at_unix_ms: now,
        };
        self.store.put_template(&row).await.map_err(status)?;
        let stored = self
            .store
            .template(&project.project, &template.name)
            .await
            .map_err(status)?
            .ok_or_else(|| Status::internal("the template was not stored"))?;
        Ok(Response::new(template_to_proto(&stored)))
    }

    pub(super) async fn list_templates_now(
        &self,
        request: Request<v1::ListTemplatesRequest>,
    ) -> Result<Response<v1::ListTemplatesResponse>, Status> {
        let project = self.project(&request.into_inner().project).await?;
        let templates = self
            .store
            .templates(&project.project)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::ListTemplatesResponse {
            templates: templates.iter().map(template_to_proto).collect(),
        }))
    }

    pub(super) async fn delete_template_now(
        &self,
        request: Request<v1::DeleteTemplateRequest>,
    ) -> Result<Response<v1::DeleteTemplateResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        check_slug("name", &request.name).map_err(invalid)?;
        let deleted = self
            .store
            .delete_template(&project.project, &request.name)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::DeleteTemplateResponse { deleted }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_gives_no_title_nor_relationships_and_its_errors_name_the_template() {
        let bad =
            |fields: v1::BacklogTaskFields| defaults(&fields).expect_err("refused").to_string();
        assert!(
            bad(v1::BacklogTaskFields {
                title: "x".into(),
                ..Default::default()
            })
            .starts_with("template.defaults.title: a template gives no title"),
        );
        assert!(
            bad(v1::BacklogTaskFields {
                category: "chore".into(),
                ..Default::default()
            })
            .starts_with("template.defaults.category: unknown category \"chore\""),
        );
        let ok = defaults(&v1::BacklogTaskFields {
            category: "bug".into(),
            codebase_tests: vec!["cargo test".into()],
            ..Default::default()
        })
        .expect("valid defaults");
        assert_eq!(ok.title, "");
        assert_eq!(ok.codebase_tests, ["cargo test"]);
    }

    #[test]
    fn only_the_fields_a_task_gives_override_its_template() {
        let fields = v1::BacklogTaskFields {
            title: "Fix it".into(),
            priority: "p1".into(),
            ui_tests: vec!["npm test".into()],
            ..Default::default()
        };
        assert_eq!(given_fields(&fields), ["title", "priority", "ui_tests"]);
    }
}
