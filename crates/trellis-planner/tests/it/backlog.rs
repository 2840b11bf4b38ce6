//! The `Backlog` API over real gRPC, on SQLite (a temporary file) and on PostgreSQL (a private
//! server): bad input refused with the field's path and nothing changed, rules that block and
//! unblock, suggestions accepted once, lists in order.

use tonic::Code;
use tonic::transport::Channel;
use trellis_proto::v1;
use trellis_proto::v1::backlog_client::BacklogClient;

use crate::{Served, serve_config};

/// Runs each named test against both databases.
macro_rules! backlog_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() -> anyhow::Result<()> {
                    let dir = tempfile::tempdir()?;
                    let url = format!("sqlite://{}?mode=rwc", dir.path().join("backlog.db").display());
                    super::$name(super::Backlog::start(url).await).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() -> anyhow::Result<()> {
                    let server = trellis_testkit::Postgres::start()?;
                    let url = server.create_database("backlog")?;
                    super::$name(super::Backlog::start(url).await).await
                }
            )*
        }
    };
}

backlog_suite!(
    a_task_in_both_the_queue_and_a_list_is_refused,
    an_unknown_category_in_a_rule_is_refused,
    a_cyclic_dependency_is_refused_and_nothing_changes,
    rules_block_a_task_until_it_is_complete,
    custom_rules_run_on_check,
    a_queued_task_leads_to_a_suggestion_accepted_once,
    lists_keep_their_tasks_in_order,
);

/// A planner with a backlog, and a client of it.
struct Backlog {
    client: BacklogClient<Channel>,
    _served: Served,
}

impl Backlog {
    async fn start(database_url: String) -> Self {
        let served = serve_config(trellis_planner::Config {
            database_url: Some(database_url),
            ..trellis_planner::Config::default()
        })
        .await;
        Self {
            client: BacklogClient::new(served.channel.clone()),
            _served: served,
        }
    }

    async fn add(
        &mut self,
        title: &str,
        list: &str,
        edit: impl FnOnce(&mut v1::BacklogTaskFields),
    ) -> Result<v1::TaskChange, tonic::Status> {
        let mut fields = v1::BacklogTaskFields {
            title: title.to_owned(),
            ..Default::default()
        };
        edit(&mut fields);
        self.client
            .add_task(v1::AddTaskRequest {
                project: "default".into(),
                fields: Some(fields),
                queue: String::new(),
                list: list.to_owned(),
                template: String::new(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn tasks(&mut self) -> anyhow::Result<Vec<v1::BacklogTaskView>> {
        Ok(self
            .client
            .list_tasks(v1::ListTasksRequest {
                project: "default".into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .tasks)
    }

    async fn create_list(&mut self, name: &str) -> anyhow::Result<()> {
        self.client
            .create_list(v1::CreateListRequest {
                project: "default".into(),
                name: name.into(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }
}

fn file(path: &str, operation: &str) -> v1::BacklogFile {
    v1::BacklogFile {
        path: path.into(),
        operation: operation.into(),
    }
}

fn depends_on(target: u32) -> v1::BacklogRelationship {
    v1::BacklogRelationship {
        kind: "depends_on".into(),
        target,
    }
}

async fn a_task_in_both_the_queue_and_a_list_is_refused(mut b: Backlog) -> anyhow::Result<()> {
    b.create_list("auth").await?;
    let refused = b
        .client
        .add_task(v1::AddTaskRequest {
            project: "default".into(),
            fields: Some(v1::BacklogTaskFields {
                title: "both".into(),
                ..Default::default()
            }),
            queue: "evaluation".into(),
            list: "auth".into(),
            template: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("queue: ") && refused.message().contains("never both"),
        "{}",
        refused.message()
    );
    assert!(b.tasks().await?.is_empty(), "a refused task was stored");

    // Other bad fields name their path, and store nothing either.
    let bad_op = b
        .add("x", "", |f| f.files = vec![file("src/a.rs", "rename")])
        .await
        .unwrap_err();
    assert!(
        bad_op.message().starts_with("fields.files[0].operation: "),
        "{}",
        bad_op.message()
    );
    let bad_category = b
        .add("x", "", |f| f.category = "feture".into())
        .await
        .unwrap_err();
    assert!(
        bad_category.message().contains("fields.category")
            && bad_category.message().contains("feature"),
        "{}",
        bad_category.message()
    );
    assert!(b.tasks().await?.is_empty());
    Ok(())
}

async fn an_unknown_category_in_a_rule_is_refused(mut b: Backlog) -> anyhow::Result<()> {
    let refused = b
        .client
        .put_rule(v1::PutRuleRequest {
            project: "default".into(),
            rule: Some(v1::ValidationRuleSpec {
                name: "needs-tests".into(),
                kind: "test_required".into(),
                categories: vec!["feature".into(), "feture".into()],
                severity: "error".into(),
                enabled: true,
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().starts_with("rule.categories[1]: ")
            && refused.message().contains("\"feture\""),
        "{}",
        refused.message()
    );
    let rules = b
        .client
        .list_rules(v1::ListRulesRequest {
            project: "default".into(),
        })
        .await?
        .into_inner()
        .rules;
    assert!(rules.is_empty(), "a refused rule was stored: {rules:?}");
    Ok(())
}

async fn a_cyclic_dependency_is_refused_and_nothing_changes(mut b: Backlog) -> anyhow::Result<()> {
    b.create_list("release").await?;
    b.add("schema", "release", |_| {}).await?;
    b.add("api", "release", |f| f.relationships = vec![depends_on(1)])
        .await?;
    b.add("ui", "release", |f| f.relationships = vec![depends_on(2)])
        .await?;
    let before = b.tasks().await?;
    let refused = b
        .client
        .edit_task(v1::EditTaskRequest {
            project: "default".into(),
            number: 1,
            fields: Some(v1::BacklogTaskFields {
                relationships: vec![depends_on(3)],
                ..Default::default()
            }),
            update_mask: vec!["relationships".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("T-1 → T-3 → T-2 → T-1"),
        "{}",
        refused.message()
    );
    assert_eq!(
        b.tasks().await?,
        before,
        "a refused edit changed the backlog"
    );

    // A dependency on a task that does not exist is refused the same way.
    let missing = b
        .add("docs", "release", |f| f.relationships = vec![depends_on(9)])
        .await
        .unwrap_err();
    assert!(
        missing
            .message()
            .starts_with("fields.relationships[0].target: "),
        "{}",
        missing.message()
    );
    assert_eq!(b.tasks().await?.len(), 3);
    Ok(())
}

async fn rules_block_a_task_until_it_is_complete(mut b: Backlog) -> anyhow::Result<()> {
    b.client
        .put_rule(v1::PutRuleRequest {
            project: "default".into(),
            rule: Some(v1::ValidationRuleSpec {
                name: "needs-criteria".into(),
                kind: "required_field".into(),
                field: "acceptance_criteria".into(),
                categories: vec!["feature".into()],
                severity: "error".into(),
                enabled: true,
                ..Default::default()
            }),
        })
        .await?;
    // A bug is not a feature: the rule does not apply.
    let bug = b.add("crash", "", |f| f.category = "bug".into()).await?;
    assert!(bug.findings.is_empty(), "{:?}", bug.findings);
    let added = b
        .add("login", "", |f| f.category = "feature".into())
        .await?;
    let task = added.task.expect("the task");
    assert_eq!(added.findings.len(), 1, "{:?}", added.findings);
    assert_eq!(added.findings[0].severity, "error");
    assert_eq!(task.status, "blocked");
    assert_eq!(task.blocks.len(), 1);
    assert_eq!(task.blocks[0].kind, "validation");

    let edited = b
        .client
        .edit_task(v1::EditTaskRequest {
            project: "default".into(),
            number: task.number,
            fields: Some(v1::BacklogTaskFields {
                acceptance_criteria: vec!["a user can log in".into()],
                ..Default::default()
            }),
            update_mask: vec!["acceptance_criteria".into()],
        })
        .await?
        .into_inner();
    let task = edited.task.expect("the task");
    assert!(edited.findings.is_empty(), "{:?}", edited.findings);
    assert_eq!(task.status, "evaluating");
    assert!(task.blocks.is_empty());
    Ok(())
}

async fn custom_rules_run_on_check(mut b: Backlog) -> anyhow::Result<()> {
    // Fails unless the task (JSON on stdin) names a file.
    let command = r#"grep -q '"files":\[{' || { echo "name the files it touches"; exit 3; }"#;
    b.client
        .put_rule(v1::PutRuleRequest {
            project: "default".into(),
            rule: Some(v1::ValidationRuleSpec {
                name: "files-named".into(),
                kind: "custom".into(),
                command: command.into(),
                severity: "error".into(),
                enabled: true,
                ..Default::default()
            }),
        })
        .await?;
    let added = b.add("refactor", "", |_| {}).await?;
    let number = added.task.expect("the task").number;
    // Custom commands run on an explicit check only.
    assert!(added.findings.is_empty());
    let checked = b
        .client
        .check_task(v1::CheckTaskRequest {
            project: "default".into(),
            number,
        })
        .await?
        .into_inner();
    assert_eq!(checked.findings.len(), 1, "{:?}", checked.findings);
    assert!(
        checked.findings[0]
            .message
            .starts_with("name the files it touches (rule files-named, status 3)"),
        "{}",
        checked.findings[0].message
    );
    assert_eq!(checked.task.expect("the task").status, "blocked");

    b.client
        .edit_task(v1::EditTaskRequest {
            project: "default".into(),
            number,
            fields: Some(v1::BacklogTaskFields {
                files: vec![file("src/lib.rs", "UPDATE")],
                ..Default::default()
            }),
            update_mask: vec!["files".into()],
        })
        .await?;
    let checked = b
        .client
        .check_task(v1::CheckTaskRequest {
            project: "default".into(),
            number,
        })
        .await?
        .into_inner();
    assert!(checked.findings.is_empty(), "{:?}", checked.findings);
    assert_eq!(checked.task.expect("the task").status, "evaluating");
    Ok(())
}

async fn a_queued_task_leads_to_a_suggestion_accepted_once(mut b: Backlog) -> anyhow::Result<()> {
    let auth = |f: &mut v1::BacklogTaskFields, description: &str| {
        f.category = "bug".into();
        f.description = description.into();
        f.files = vec![
            file("src/auth/login.rs", "UPDATE"),
            file("src/auth/session.rs", "READ"),
        ];
    };
    let first = b
        .add("Fix login redirect", "", |f| {
            auth(f, "login redirects to the wrong page")
        })
        .await?;
    assert!(first.suggestions.is_empty(), "{:?}", first.suggestions);
    let second = b
        .add("Fix login timeout", "", |f| {
            auth(f, "login times out on the wrong page");
            f.relationships = vec![depends_on(1)];
        })
        .await?;
    assert_eq!(second.suggestions.len(), 1, "{:?}", second.suggestions);
    let suggestion = &second.suggestions[0];
    assert_eq!(suggestion.tasks, [1, 2]);
    assert!(
        suggestion.reason.contains("src/auth/login.rs (UPDATE)"),
        "{}",
        suggestion.reason
    );

    let accepted = b
        .client
        .resolve_suggestion(v1::ResolveSuggestionRequest {
            project: "default".into(),
            id: suggestion.id.clone(),
            action: "accept".into(),
            list: "login-fixes".into(),
            tasks: Vec::new(),
        })
        .await?
        .into_inner();
    assert_eq!(accepted.list.expect("the list").total_tasks, 2);
    assert_eq!(
        accepted.suggestion.expect("the suggestion").status,
        "accepted"
    );
    let tasks = b.tasks().await?;
    assert!(
        tasks.iter().all(|task| task.list == "login-fixes"),
        "{tasks:?}"
    );

    let again = b
        .client
        .resolve_suggestion(v1::ResolveSuggestionRequest {
            project: "default".into(),
            id: suggestion.id.clone(),
            action: "accept".into(),
            list: "twice".into(),
            tasks: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    Ok(())
}

async fn lists_keep_their_tasks_in_order(mut b: Backlog) -> anyhow::Result<()> {
    b.create_list("sprint").await?;
    for title in ["one", "two", "three"] {
        b.add(title, "", |_| {}).await?;
    }
    for number in [1, 2, 3] {
        b.client
            .move_task(v1::MoveTaskRequest {
                project: "default".into(),
                number,
                list: "sprint".into(),
                position: 0,
            })
            .await?;
    }
    let moved = b
        .client
        .move_task(v1::MoveTaskRequest {
            project: "default".into(),
            number: 3,
            list: "sprint".into(),
            position: 1,
        })
        .await?
        .into_inner();
    assert_eq!(moved.position, 1);
    let shown = b
        .client
        .get_list(v1::GetListRequest {
            project: "default".into(),
            name: "sprint".into(),
        })
        .await?
        .into_inner();
    let order: Vec<(u32, u32)> = shown.tasks.iter().map(|t| (t.number, t.position)).collect();
    assert_eq!(order, [(3, 1), (1, 2), (2, 3)]);
    assert!(shown.tasks.iter().all(|t| t.status == "pending"));
    assert_eq!(shown.list.expect("the list").total_tasks, 3);

    let nowhere = b
        .client
        .move_task(v1::MoveTaskRequest {
            project: "default".into(),
            number: 1,
            list: "nope".into(),
            position: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(nowhere.code(), Code::NotFound);
    Ok(())
}
