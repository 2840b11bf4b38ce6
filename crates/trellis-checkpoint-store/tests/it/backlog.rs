//! The backlog's tables, against SQLite (a temporary file) and PostgreSQL (a fresh database): the
//! queue-or-list rule held by the store itself, numbering, lists and positions, blocks,
//! relationships, rules and suggestions.

use std::sync::Arc;

use trellis_checkpoint_store::store::backlog::{
    Backlog, ListRow, ProjectRow, SuggestionRow, TaskFilter, TaskRow,
};
use trellis_checkpoint_store::store::{ErrorKind, connect_backlog};
use trellis_core::backlog::grouping::{Suggestion, Weights};
use trellis_core::backlog::rules::RuleSpec;
use trellis_core::backlog::{
    BacklogTask, Block, BlockKind, Category, Effort, ItemStatus, Link, ListStatus, Placement,
    Priority, TaskStatus,
};
use trellis_core::plan::{FileImpact, FileOp, RelationshipKind};
use uuid::Uuid;

use crate::support::{TestStore, store_suite};

store_suite!(
    the_store_refuses_a_task_in_both_the_queue_and_a_list,
    tasks_are_numbered_and_moved_between_the_queue_and_lists,
    blocks_hold_a_task_until_resolved,
    a_relationship_to_a_missing_task_changes_nothing,
    rules_are_stored_replaced_and_deleted,
    a_suggestion_is_accepted_once_into_a_new_list,
);

const NOW: i64 = 1_780_000_000_000;

/// The project every test works in.
pub(crate) fn web_project() -> ProjectRow {
    ProjectRow {
        project: "web".into(),
        name: "Web".into(),
        description: String::new(),
        weights: Weights::default(),
        created_at_unix_ms: NOW,
    }
}

async fn open(store: &TestStore) -> anyhow::Result<Arc<dyn Backlog>> {
    let backlog = connect_backlog(&store.url).await?;
    backlog.create_project(&web_project()).await?;
    Ok(backlog)
}

/// The tasks of list `name` of project web.
async fn in_list(backlog: &dyn Backlog, name: &str) -> anyhow::Result<Vec<TaskRow>> {
    let filter = TaskFilter {
        placement: Some(Placement::List(name.into())),
        status: None,
    };
    Ok(backlog.tasks("web", &filter).await?)
}

fn list(name: &str) -> ListRow {
    ListRow {
        project: "web".into(),
        name: name.into(),
        description: format!("the {name} list"),
        status: ListStatus::Draft,
        max_parallel_agents: 3,
        auto_execute: false,
        runs: 0,
        total_tasks: 0,
        completed_tasks: 0,
        failed_tasks: 0,
        created_at_unix_ms: NOW,
        updated_at_unix_ms: NOW,
    }
}

fn task(title: &str, placement: Placement) -> BacklogTask {
    let status = match placement {
        Placement::Evaluation => TaskStatus::Evaluating,
        Placement::List(_) => TaskStatus::Pending,
    };
    BacklogTask {
        number: 0,
        title: title.into(),
        description: format!("{title}, described"),
        category: Category::Feature,
        priority: Priority::P2,
        effort: Effort::Small,
        phase: 3,
        status,
        placement,
        files: vec![FileImpact {
            path: "src/auth.rs".into(),
            op: FileOp::Update,
            confidence: 1.0,
        }],
        acceptance_criteria: vec!["logs in".into()],
        codebase_tests: vec!["cargo test auth".into()],
        api_tests: Vec::new(),
        ui_tests: Vec::new(),
        links: Vec::new(),
        blocks: Vec::new(),
    }
}

async fn the_store_refuses_a_task_in_both_the_queue_and_a_list(
    store: TestStore,
) -> anyhow::Result<()> {
    let backlog = open(&store).await?;
    backlog.create_list(&list("auth")).await?;
    let columns = "project, number, queue, list_name, position, item_status, title, description, \
                   category, priority, effort, phase, status, files, acceptance_criteria, \
                   codebase_tests, api_tests, ui_tests, created_at_unix_ms, updated_at_unix_ms";
    let values = |queue: &str, list: &str, position: &str, item: &str| {
        format!(
            "INSERT INTO backlog_tasks ({columns}) VALUES ('web', 7, {queue}, {list}, {position}, \
             {item}, 't', '', 'feature', 'p2', 'small', 1, 'pending', '[]', '[]', '[]', '[]', \
             '[]', 0, 0)"
        )
    };
    // Both the queue and a list, neither, or a queue other than `evaluation`: each refused by the
    // database itself, whatever the client.
    for (queue, list, position, item) in [
        ("'evaluation'", "'auth'", "1", "'pending'"),
        ("NULL", "NULL", "NULL", "NULL"),
        ("'triage'", "NULL", "NULL", "NULL"),
        ("NULL", "'auth'", "NULL", "'pending'"),
    ] {
        let refused = store.execute(&values(queue, list, position, item)).await;
        assert!(
            refused.is_err(),
            "queue {queue}, list {list}, position {position}: stored"
        );
    }
    assert_eq!(store.count("backlog_tasks").await?, 0);
    // The same through the store: moving a listed task's row into the queue without leaving the
    // list is refused too.
    let number = backlog
        .add_task("web", &task("login", Placement::List("auth".into())), NOW)
        .await?;
    let refused = store
        .execute(&format!(
            "UPDATE backlog_tasks SET queue = 'evaluation' WHERE number = {number}"
        ))
        .await;
    assert!(refused.is_err(), "a listed task was put in the queue too");
    let stored = backlog.task("web", number).await?.expect("the task");
    assert_eq!(stored.task.placement, Placement::List("auth".into()));
    Ok(())
}

async fn tasks_are_numbered_and_moved_between_the_queue_and_lists(
    store: TestStore,
) -> anyhow::Result<()> {
    let backlog = open(&store).await?;
    backlog.create_list(&list("auth")).await?;
    let refused = backlog.create_list(&list("auth")).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::AlreadyExists, "{refused}");
    let one = backlog
        .add_task("web", &task("one", Placement::Evaluation), NOW)
        .await?;
    let two = backlog
        .add_task("web", &task("two", Placement::List("auth".into())), NOW)
        .await?;
    let three = backlog
        .add_task("web", &task("three", Placement::List("auth".into())), NOW)
        .await?;
    assert_eq!((one, two, three), (1, 2, 3));
    let missing = backlog
        .add_task("web", &task("x", Placement::List("nope".into())), NOW)
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");

    // Into the list at the front: the others move down, and it now waits as `pending`.
    backlog
        .place_task(
            "web",
            one,
            &Placement::List("auth".into()),
            Some(1),
            NOW + 1,
        )
        .await?;
    let listed = in_list(backlog.as_ref(), "auth").await?;
    let order: Vec<(u32, Option<u32>)> = listed
        .iter()
        .map(|row| (row.task.number, row.position))
        .collect();
    assert_eq!(order, [(1, Some(1)), (2, Some(2)), (3, Some(3))]);
    assert_eq!(listed[0].task.status, TaskStatus::Pending);
    assert_eq!(listed[0].item_status, Some(ItemStatus::Pending));

    // Within the list, then back to the queue: positions close up.
    backlog
        .place_task(
            "web",
            three,
            &Placement::List("auth".into()),
            Some(1),
            NOW + 2,
        )
        .await?;
    backlog
        .place_task("web", one, &Placement::Evaluation, None, NOW + 3)
        .await?;
    let all = backlog.tasks("web", &TaskFilter::default()).await?;
    let order: Vec<(u32, Option<u32>)> = all
        .iter()
        .map(|row| (row.task.number, row.position))
        .collect();
    assert_eq!(order, [(3, Some(1)), (2, Some(2)), (1, None)]);
    assert_eq!(all[2].task.status, TaskStatus::Evaluating);
    assert_eq!(all[2].item_status, None);

    // Counters come from the tasks' rows.
    backlog
        .set_status(
            "web",
            two,
            TaskStatus::Completed,
            Some(ItemStatus::Completed),
            NOW + 4,
        )
        .await?;
    let auth = backlog.list("web", "auth").await?.expect("the list");
    assert_eq!(
        (auth.total_tasks, auth.completed_tasks, auth.failed_tasks),
        (2, 1, 0)
    );
    Ok(())
}

async fn blocks_hold_a_task_until_resolved(store: TestStore) -> anyhow::Result<()> {
    let backlog = open(&store).await?;
    let number = backlog
        .add_task("web", &task("one", Placement::Evaluation), NOW)
        .await?;
    let block = Block {
        kind: BlockKind::Manual,
        reason: "waiting for the design".into(),
        blocking_task: None,
    };
    backlog.add_block("web", number, &block, NOW + 1).await?;
    let validation = Block {
        kind: BlockKind::Validation,
        reason: "acceptance_criteria is empty".into(),
        blocking_task: None,
    };
    backlog
        .add_block("web", number, &validation, NOW + 2)
        .await?;
    let blocked = backlog.task("web", number).await?.expect("the task");
    assert_eq!(blocked.task.status, TaskStatus::Blocked);
    assert_eq!(blocked.task.blocks, [block.clone(), validation]);

    // One kind resolved: still blocked by the other.
    let resolved = backlog
        .resolve_blocks("web", number, Some(BlockKind::Validation), "fixed", NOW + 3)
        .await?;
    assert_eq!(resolved, 1);
    let still = backlog.task("web", number).await?.expect("the task");
    assert_eq!(still.task.status, TaskStatus::Blocked);
    assert_eq!(still.task.blocks, [block]);

    let resolved = backlog
        .resolve_blocks("web", number, None, "designed", NOW + 4)
        .await?;
    assert_eq!(resolved, 1);
    let free = backlog.task("web", number).await?.expect("the task");
    assert_eq!(free.task.status, TaskStatus::Evaluating);
    assert!(free.task.blocks.is_empty());
    let history = backlog.blocks("web", number).await?;
    assert_eq!(history.len(), 2);
    assert!(history.iter().all(|row| row.resolved_at_unix_ms.is_some()));
    Ok(())
}

async fn a_relationship_to_a_missing_task_changes_nothing(store: TestStore) -> anyhow::Result<()> {
    let backlog = open(&store).await?;
    let first = backlog
        .add_task("web", &task("one", Placement::Evaluation), NOW)
        .await?;
    let mut dependent = task("two", Placement::Evaluation);
    dependent.links = vec![Link {
        kind: RelationshipKind::DependsOn,
        target: 99,
    }];
    let refused = backlog.add_task("web", &dependent, NOW).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NotFound, "{refused}");
    assert!(refused.to_string().contains("T-99"), "{refused}");
    assert_eq!(store.count("backlog_tasks").await?, 1);
    assert_eq!(store.count("backlog_relationships").await?, 0);

    // The number was not used up: the next task takes it.
    dependent.links[0].target = first;
    let second = backlog.add_task("web", &dependent, NOW).await?;
    assert_eq!(second, first + 1);
    let stored = backlog.task("web", second).await?.expect("the task");
    assert_eq!(stored.task.links, dependent.links);

    // An edit replaces the relationships, and a bad one leaves the old ones.
    let mut edited = stored.task.clone();
    edited.title = "two, renamed".into();
    edited.links[0].target = 42;
    assert!(backlog.update_task("web", &edited, NOW + 1).await.is_err());
    let unchanged = backlog.task("web", second).await?.expect("the task");
    assert_eq!(unchanged.task, stored.task);
    Ok(())
}

async fn rules_are_stored_replaced_and_deleted(store: TestStore) -> anyhow::Result<()> {
    let backlog = open(&store).await?;
    let mut rule = RuleSpec {
        name: "needs-tests".into(),
        kind: "test_required".into(),
        categories: vec!["feature".into()],
        severity: "error".into(),
        enabled: true,
        ..RuleSpec::default()
    };
    backlog.put_rule("web", &rule).await?;
    rule.severity = "warning".into();
    backlog.put_rule("web", &rule).await?;
    assert_eq!(backlog.rules("web").await?, [rule]);
    assert!(backlog.delete_rule("web", "needs-tests").await?);
    assert!(!backlog.delete_rule("web", "needs-tests").await?);
    assert!(backlog.rules("web").await?.is_empty());
    Ok(())
}

async fn a_suggestion_is_accepted_once_into_a_new_list(store: TestStore) -> anyhow::Result<()> {
    let backlog = open(&store).await?;
    for title in ["a", "b", "c"] {
        backlog
            .add_task("web", &task(title, Placement::Evaluation), NOW)
            .await?;
    }
    let row = |tasks: Vec<u32>| SuggestionRow {
        suggestion_id: Uuid::now_v7(),
        project: "web".into(),
        status: "pending".into(),
        suggestion: Suggestion {
            tasks,
            name: "src-auth".into(),
            score: 0.8,
            reason: "share src/auth.rs (UPDATE)".into(),
        },
        triggered_by: "manual".into(),
        trigger_task: None,
        created_list: None,
        created_at_unix_ms: NOW,
        resolved_at_unix_ms: None,
    };
    let accepted = row(vec![1, 2]);
    let rejected = row(vec![2, 3]);
    backlog
        .insert_suggestions(&[accepted.clone(), rejected.clone()])
        .await?;
    assert_eq!(backlog.suggestions("web", Some("pending")).await?.len(), 2);

    backlog
        .accept_suggestion(accepted.suggestion_id, &list("src-auth"), &[1, 2], NOW + 1)
        .await?;
    let again = backlog
        .accept_suggestion(accepted.suggestion_id, &list("other"), &[1, 2], NOW + 2)
        .await
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::FailedPrecondition, "{again}");
    assert!(backlog.list("web", "other").await?.is_none());

    // The second one names T-2, no longer queued: refused, and nothing of it was written.
    let late = backlog
        .accept_suggestion(rejected.suggestion_id, &list("late"), &[2, 3], NOW + 3)
        .await
        .unwrap_err();
    assert_eq!(late.kind(), ErrorKind::FailedPrecondition, "{late}");
    assert!(backlog.list("web", "late").await?.is_none());
    assert_eq!(
        backlog.task("web", 3).await?.expect("T-3").task.placement,
        Placement::Evaluation
    );
    backlog
        .reject_suggestion("web", rejected.suggestion_id, NOW + 4)
        .await?;

    let stored = backlog.suggestions("web", None).await?;
    let statuses: Vec<(&str, Option<&str>)> = stored
        .iter()
        .map(|row| (row.status.as_str(), row.created_list.as_deref()))
        .collect();
    assert!(
        statuses.contains(&("accepted", Some("src-auth"))),
        "{statuses:?}"
    );
    assert!(statuses.contains(&("rejected", None)), "{statuses:?}");
    let auth = backlog.list("web", "src-auth").await?.expect("the list");
    assert_eq!(auth.total_tasks, 2);
    Ok(())
}

/// `trellis dev` opens one new SQLite file twice at once (its checkpoint-store and its planner)
/// and writes through both: both open, every write is taken, none fails as `database is locked`.
#[tokio::test]
async fn two_stores_of_one_process_open_and_write_one_new_sqlite_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for round in 0..20 {
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("{round}.db")).display()
        );
        let (first, second) = tokio::join!(connect_backlog(&url), connect_backlog(&url));
        let (first, second) = (first?, second?);
        first.create_project(&web_project()).await?;
        first.create_list(&list("auth")).await?;
        let adds = (0..10).flat_map(|i| {
            [&first, &second].map(|backlog| {
                let backlog = Arc::clone(backlog);
                async move {
                    backlog
                        .add_task(
                            "web",
                            &task(&format!("task {i}"), Placement::Evaluation),
                            NOW,
                        )
                        .await
                }
            })
        });
        let mut numbers = futures::future::try_join_all(adds).await?;
        numbers.sort_unstable();
        assert_eq!(numbers, (1..=20).collect::<Vec<u32>>(), "round {round}");
        // Moving a task reads where it is, then writes: transactions that read before they
        // write, from both stores at once.
        let moves = numbers.iter().map(|&number| {
            let backlog = Arc::clone(if number % 2 == 0 { &first } else { &second });
            async move {
                backlog
                    .place_task("web", number, &Placement::List("auth".into()), None, NOW)
                    .await
            }
        });
        futures::future::try_join_all(moves).await?;
        let listed = in_list(second.as_ref(), "auth").await?;
        assert_eq!(listed.len(), 20, "round {round}: every task moved");
    }
    Ok(())
}

/// Another process (the SQLite shell, a second `trellis dev`, a backup) opening the file takes
/// its locks at moments the store does not choose: a transaction that reads before it writes
/// (moving a task) waits for them instead of failing as `database is locked`.
#[tokio::test]
async fn a_read_then_write_waits_for_another_connection_s_locks() -> anyhow::Result<()> {
    use std::str::FromStr as _;
    use std::time::Duration;

    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let backlog = connect_backlog(&url).await?;
    backlog.create_project(&web_project()).await?;
    backlog.create_list(&list("auth")).await?;
    let mut numbers = Vec::new();
    for i in 0..4 {
        let placement = Placement::List("auth".into());
        numbers.push(
            backlog
                .add_task("web", &task(&format!("t{i}"), placement), NOW)
                .await?,
        );
    }
    // An outside connection of its own, as a second process's would be: it switches the file to
    // WAL on opening, then writes a row of its own, again and again.
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)?
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let stop = tokio_util::sync::CancellationToken::new();
    let outsider = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut opened = 0u32;
            while !stop.is_cancelled() {
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(options.clone())
                    .await?;
                sqlx::query("CREATE TABLE IF NOT EXISTS outsider (n INTEGER)")
                    .execute(&pool)
                    .await?;
                sqlx::query("INSERT INTO outsider (n) VALUES ($1)")
                    .bind(opened)
                    .execute(&pool)
                    .await?;
                pool.close().await;
                opened += 1;
            }
            Ok::<_, sqlx::Error>(opened)
        }
    });
    let mut moves = 0u32;
    let moved = async {
        for round in 0..300u32 {
            let number = numbers[(round as usize) % numbers.len()];
            let position = Some(1 + round % 4);
            backlog
                .place_task(
                    "web",
                    number,
                    &Placement::List("auth".into()),
                    position,
                    NOW,
                )
                .await
                .map_err(|err| anyhow::anyhow!("move {round} of T-{number}: {err}"))?;
            moves += 1;
        }
        anyhow::Ok(())
    }
    .await;
    stop.cancel();
    let opened = outsider.await??;
    moved?;
    assert_eq!(moves, 300);
    assert!(opened > 0, "the outside connection never opened the file");
    let listed = in_list(backlog.as_ref(), "auth").await?;
    assert_eq!(listed.len(), 4, "every task is still in the list once");
    Ok(())
}
