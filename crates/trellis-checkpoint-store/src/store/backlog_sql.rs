// The backlog's SQL, compiled once per backend like `sql.rs` (which defines `Db`, `StoreImpl`,
// `column`, `now_ms` and the rest this file uses): `postgres.rs` and `sqlite.rs` include it after
// `sql.rs`.
//
// (A plain `//` header: an included file cannot carry inner doc comments.)

mod backlog_sql {
    use async_trait::async_trait;
    use trellis_core::backlog::grouping::{Suggestion, Weights};
    use trellis_core::backlog::rules::RuleSpec;
    use trellis_core::backlog::model::EVALUATION_QUEUE;
    use trellis_core::backlog::{
        BacklogTask, Block, BlockKind, Category, Effort, ItemStatus, Link, ListStatus, Placement,
        Priority, TaskStatus,
    };
    use trellis_core::plan::FileImpact;
    use uuid::Uuid;

    use super::{Db, DbRow, StoreImpl, column, text, to_i32};
    use crate::store::backlog::{
        Backlog, BlockRow, ListRow, ProjectRow, RunProgress, RunRow, SuggestionRow, TaskFilter,
        TaskRow,
    };
    use crate::store::{Error, ErrorKind};

    type Tx<'c> = sqlx::Transaction<'c, Db>;

    /// Wraps a database error of a backlog statement: a refused constraint is the caller's
    /// mistake (`InvalidArgument`, or `AlreadyExists` for a taken key), a missing reference is
    /// `NotFound`.
    pub(super) fn failed(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
        let what = what.into();
        move |source| {
            let kind = match &source {
                sqlx::Error::Database(db) => match db.kind() {
                    sqlx::error::ErrorKind::UniqueViolation => Some(ErrorKind::AlreadyExists),
                    sqlx::error::ErrorKind::CheckViolation => Some(ErrorKind::InvalidArgument),
                    sqlx::error::ErrorKind::ForeignKeyViolation => Some(ErrorKind::NotFound),
                    _ => None,
                },
                _ => None,
            };
            let error = Error::database(what, source);
            match kind {
                Some(kind) => error.with_kind(kind),
                None => error,
            }
        }
    }

    fn corrupt(what: &str, detail: impl std::fmt::Display) -> Error {
        Error::new(
            ErrorKind::Internal,
            format!("stored {what} is not valid: {detail}"),
        )
    }

    fn from_json<T: serde::de::DeserializeOwned>(what: &str, json: &str) -> Result<T, Error> {
        serde_json::from_str(json).map_err(|err| corrupt(what, err))
    }

    fn to_json<T: serde::Serialize>(value: &T) -> String {
        // Serialising plain data (strings, numbers, vectors, derived structs) cannot fail.
        serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
    }

    fn to_u32(value: i32) -> u32 {
        u32::try_from(value).unwrap_or(0)
    }

    fn number(value: u32) -> i32 {
        to_i32(value)
    }

    fn not_found(what: String) -> Error {
        Error::not_found(what)
    }

    // --------------------------------------------------------------------------------------------
    // Rows
    // --------------------------------------------------------------------------------------------

    fn project_from_row(row: &DbRow) -> Result<ProjectRow, Error> {
        let weights: String = column(row, "weights")?;
        Ok(ProjectRow {
            project: column(row, "project")?,
            name: column(row, "name")?,
            description: column(row, "description")?,
            weights: from_json::<Weights>("grouping weights", &weights)?,
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
        })
    }

    const LIST_COLUMNS: &str = "l.project, l.name, l.description, l.status, \
        l.max_parallel_agents, l.auto_execute, l.runs, l.created_at_unix_ms, \
        l.updated_at_unix_ms, \
        (SELECT COUNT(*) FROM backlog_tasks t WHERE t.project = l.project \
            AND t.list_name = l.name) AS total_tasks, \
        (SELECT COUNT(*) FROM backlog_tasks t WHERE t.project = l.project \
            AND t.list_name = l.name AND t.item_status = 'completed') AS completed_tasks, \
        (SELECT COUNT(*) FROM backlog_tasks t WHERE t.project = l.project \
            AND t.list_name = l.name AND t.item_status = 'failed') AS failed_tasks";

    fn list_from_row(row: &DbRow) -> Result<ListRow, Error> {
        let status: String = column(row, "status")?;
        let count = |name: &str| -> Result<u32, Error> {
            let value: i64 = column(row, name)?;
            Ok(u32::try_from(value).unwrap_or(u32::MAX))
        };
        Ok(ListRow {
            project: column(row, "project")?,
            name: column(row, "name")?,
            description: column(row, "description")?,
            status: ListStatus::parse("status", &status).map_err(|e| corrupt("list", e))?,
            max_parallel_agents: to_u32(column(row, "max_parallel_agents")?),
            auto_execute: column(row, "auto_execute")?,
            runs: to_u32(column(row, "runs")?),
            total_tasks: count("total_tasks")?,
            completed_tasks: count("completed_tasks")?,
            failed_tasks: count("failed_tasks")?,
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
            updated_at_unix_ms: column(row, "updated_at_unix_ms")?,
        })
    }

    const TASK_COLUMNS: &str = "project, number, queue, list_name, position, item_status, title, \
        description, category, priority, effort, phase, status, files, acceptance_criteria, \
        codebase_tests, api_tests, ui_tests, created_at_unix_ms, updated_at_unix_ms";

    /// Reads a task row; its links and blocks are filled in by [`with_links_and_blocks`].
    fn task_from_row(row: &DbRow) -> Result<TaskRow, Error> {
        let number = to_u32(column(row, "number")?);
        let what = format!("task T-{number}");
        let bad = |err: trellis_core::backlog::FieldError| corrupt(&what, err);
        let queue: Option<String> = column(row, "queue")?;
        let list: Option<String> = column(row, "list_name")?;
        let placement = Placement::from_parts(queue.as_deref(), list.as_deref()).map_err(bad)?;
        let item_status: Option<String> = column(row, "item_status")?;
        let item_status = item_status
            .map(|status| ItemStatus::parse("item_status", &status))
            .transpose()
            .map_err(bad)?;
        let position: Option<i32> = column(row, "position")?;
        let category: String = column(row, "category")?;
        let priority: String = column(row, "priority")?;
        let effort: String = column(row, "effort")?;
        let status: String = column(row, "status")?;
        let phase: i32 = column(row, "phase")?;
        let files: String = column(row, "files")?;
        let acceptance: String = column(row, "acceptance_criteria")?;
        let codebase: String = column(row, "codebase_tests")?;
        let api: String = column(row, "api_tests")?;
        let ui: String = column(row, "ui_tests")?;
        Ok(TaskRow {
            project: column(row, "project")?,
            task: BacklogTask {
                number,
                title: column(row, "title")?,
                description: column(row, "description")?,
                category: Category::parse("category", &category).map_err(bad)?,
                priority: Priority::parse("priority", &priority).map_err(bad)?,
                effort: Effort::parse("effort", &effort).map_err(bad)?,
                phase: u8::try_from(phase).unwrap_or(0),
                status: TaskStatus::parse("status", &status).map_err(bad)?,
                placement,
                files: from_json::<Vec<FileImpact>>(&what, &files)?,
                acceptance_criteria: from_json(&what, &acceptance)?,
                codebase_tests: from_json(&what, &codebase)?,
                api_tests: from_json(&what, &api)?,
                ui_tests: from_json(&what, &ui)?,
                links: Vec::new(),
                blocks: Vec::new(),
            },
            position: position.map(to_u32),
            item_status,
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
            updated_at_unix_ms: column(row, "updated_at_unix_ms")?,
        })
    }

    fn block_from_row(row: &DbRow) -> Result<BlockRow, Error> {
        let kind: String = column(row, "kind")?;
        let blocking: Option<i32> = column(row, "blocking_task")?;
        Ok(BlockRow {
            block_id: column(row, "block_id")?,
            task: to_u32(column(row, "task")?),
            block: Block {
                kind: BlockKind::parse("kind", &kind).map_err(|e| corrupt("block", e))?,
                reason: column(row, "reason")?,
                blocking_task: blocking.map(to_u32),
            },
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
            resolved_at_unix_ms: column(row, "resolved_at_unix_ms")?,
            resolution: column(row, "resolution")?,
        })
    }

    fn suggestion_from_row(row: &DbRow) -> Result<SuggestionRow, Error> {
        let tasks: String = column(row, "tasks")?;
        let trigger: Option<i32> = column(row, "trigger_task")?;
        Ok(SuggestionRow {
            suggestion_id: column(row, "suggestion_id")?,
            project: column(row, "project")?,
            status: column(row, "status")?,
            suggestion: Suggestion {
                tasks: from_json("suggestion", &tasks)?,
                name: column(row, "name")?,
                score: column(row, "score")?,
                reason: column(row, "reason")?,
            },
            triggered_by: column(row, "triggered_by")?,
            trigger_task: trigger.map(to_u32),
            created_list: column(row, "created_list")?,
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
            resolved_at_unix_ms: column(row, "resolved_at_unix_ms")?,
        })
    }

    const RUN_COLUMNS: &str = "project, list_name, run_number, execution_id, status, task_type, \
        queue, tasks_total, tasks_completed, tasks_failed, reason, created_at_unix_ms, ended_at_unix_ms";

    fn run_from_row(row: &DbRow) -> Result<RunRow, Error> {
        Ok(RunRow {
            project: column(row, "project")?,
            list: column(row, "list_name")?,
            run_number: to_u32(column(row, "run_number")?),
            execution_id: column(row, "execution_id")?,
            status: column(row, "status")?,
            task_type: column(row, "task_type")?,
            queue: column(row, "queue")?,
            tasks_total: to_u32(column(row, "tasks_total")?),
            tasks_completed: to_u32(column(row, "tasks_completed")?),
            tasks_failed: to_u32(column(row, "tasks_failed")?),
            reason: column(row, "reason")?,
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
            ended_at_unix_ms: column(row, "ended_at_unix_ms")?,
        })
    }

    /// Fills in the links and open blocks of `rows` (all of one project; `only` names the one
    /// task they are, so only its relationships and blocks are read).
    async fn with_links_and_blocks(
        pool: &sqlx::Pool<Db>,
        project: &str,
        only: Option<u32>,
        rows: &mut [TaskRow],
    ) -> Result<(), Error> {
        if rows.is_empty() {
            return Ok(());
        }
        let index: std::collections::HashMap<u32, usize> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| (row.task.number, i))
            .collect();
        let links = sqlx::query(
            "SELECT source, kind, target FROM backlog_relationships WHERE project = $1 \
             AND ($2 IS NULL OR source = $2) ORDER BY source, kind, target",
        )
        .bind(project)
        .bind(only.map(number))
        .fetch_all(pool)
        .await
        .map_err(failed(format!("failed to read the relationships of {project}")))?;
        for row in &links {
            let source = to_u32(column(row, "source")?);
            let Some(&i) = index.get(&source) else { continue };
            let kind: String = column(row, "kind")?;
            let kind = trellis_core::backlog::model::parse_relationship("kind", &kind)
                .map_err(|e| corrupt("relationship", e))?;
            rows[i].task.links.push(Link {
                kind,
                target: to_u32(column(row, "target")?),
            });
        }
        let blocks = sqlx::query(
            "SELECT block_id, task, kind, reason, blocking_task, created_at_unix_ms, \
             resolved_at_unix_ms, resolution FROM backlog_blocks \
             WHERE project = $1 AND resolved_at_unix_ms IS NULL \
             AND ($2 IS NULL OR task = $2) ORDER BY created_at_unix_ms, block_id",
        )
        .bind(project)
        .bind(only.map(number))
        .fetch_all(pool)
        .await
        .map_err(failed(format!("failed to read the blocks of {project}")))?;
        for row in &blocks {
            let block = block_from_row(row)?;
            if let Some(&i) = index.get(&block.task) {
                rows[i].task.blocks.push(block.block);
            }
        }
        Ok(())
    }

    async fn insert_links(
        tx: &mut Tx<'_>,
        project: &str,
        source: u32,
        links: &[Link],
    ) -> Result<(), Error> {
        for link in links {
            sqlx::query(
                "INSERT INTO backlog_relationships (project, source, kind, target) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(project)
            .bind(number(source))
            .bind(link.kind.as_str())
            .bind(number(link.target))
            .execute(&mut **tx)
            .await
            .map_err(failed(format!(
                "T-{source} {} T-{}: no such task in {project}",
                link.kind.as_str(),
                link.target
            )))?;
        }
        Ok(())
    }

    /// Rewrites the positions of a list's tasks to 1..n in the given order.
    async fn renumber(
        tx: &mut Tx<'_>,
        project: &str,
        list: &str,
        order: &[u32],
    ) -> Result<(), Error> {
        for (i, task) in order.iter().enumerate() {
            sqlx::query(
                "UPDATE backlog_tasks SET position = $1 \
                 WHERE project = $2 AND list_name = $3 AND number = $4",
            )
            .bind(i32::try_from(i + 1).unwrap_or(i32::MAX))
            .bind(project)
            .bind(list)
            .bind(number(*task))
            .execute(&mut **tx)
            .await
            .map_err(failed(format!("failed to renumber list {list}")))?;
        }
        Ok(())
    }

    async fn list_order(tx: &mut Tx<'_>, project: &str, list: &str) -> Result<Vec<u32>, Error> {
        let rows = sqlx::query(
            "SELECT number FROM backlog_tasks WHERE project = $1 AND list_name = $2 \
             ORDER BY position, number",
        )
        .bind(project)
        .bind(list)
        .fetch_all(&mut **tx)
        .await
        .map_err(failed(format!("failed to read list {list}")))?;
        rows.iter()
            .map(|row| column::<i32>(row, "number").map(to_u32))
            .collect()
    }

    /// Moves one task, inside an open transaction (see [`Backlog::place_task`]).
    async fn place(
        tx: &mut Tx<'_>,
        project: &str,
        task: u32,
        placement: &Placement,
        position: Option<u32>,
        now_ms: i64,
    ) -> Result<(), Error> {
        let row = sqlx::query(
            "SELECT list_name, status FROM backlog_tasks WHERE project = $1 AND number = $2",
        )
        .bind(project)
        .bind(number(task))
        .fetch_optional(&mut **tx)
        .await
        .map_err(failed(format!("failed to read T-{task}")))?
        .ok_or_else(|| not_found(format!("task T-{task} not found in project {project}")))?;
        let from: Option<String> = column(&row, "list_name")?;
        let status: String = column(&row, "status")?;
        // Waiting tasks follow their place (seed 001: evaluating in the queue, pending in a
        // list); a blocked or running task keeps its status.
        let status = match (status.as_str(), placement) {
            ("evaluating" | "pending", Placement::Evaluation) => "evaluating".to_owned(),
            ("evaluating" | "pending", Placement::List(_)) => "pending".to_owned(),
            _ => status,
        };
        let (queue, list, item) = match placement {
            Placement::Evaluation => (Some(EVALUATION_QUEUE), None, None),
            Placement::List(name) => (None, Some(name.as_str()), Some("pending")),
        };
        // A temporary position past any real one; the renumbering below sets the real one.
        sqlx::query(
            "UPDATE backlog_tasks SET queue = $1, list_name = $2, \
             position = CASE WHEN $2 IS NULL THEN NULL ELSE 2147483647 END, \
             item_status = CASE WHEN $2 IS NULL THEN NULL \
                 WHEN list_name IS NOT NULL AND list_name = $2 THEN item_status ELSE $3 END, \
             status = $4, updated_at_unix_ms = $5 WHERE project = $6 AND number = $7",
        )
        .bind(queue)
        .bind(list)
        .bind(item)
        .bind(status)
        .bind(now_ms)
        .bind(project)
        .bind(number(task))
        .execute(&mut **tx)
        .await
        .map_err(failed(format!("failed to move T-{task}")))?;
        if let Some(from) = from.as_deref().filter(|from| Some(*from) != list) {
            let order = list_order(tx, project, from).await?;
            renumber(tx, project, from, &order).await?;
        }
        if let Some(list) = list {
            let mut order = list_order(tx, project, list).await?;
            order.retain(|n| *n != task);
            let at = position
                .map(|p| usize::try_from(p.max(1) - 1).unwrap_or(usize::MAX))
                .unwrap_or(usize::MAX)
                .min(order.len());
            order.insert(at, task);
            renumber(tx, project, list, &order).await?;
        }
        Ok(())
    }

    // --------------------------------------------------------------------------------------------
    // The trait
    // --------------------------------------------------------------------------------------------

    #[async_trait]
    impl Backlog for StoreImpl {
        async fn create_project(&self, project: &ProjectRow) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            sqlx::query(
                "INSERT INTO backlog_projects (project, name, description, weights, \
                 next_task_number, created_at_unix_ms) VALUES ($1, $2, $3, $4, 1, $5)",
            )
            .bind(&project.project)
            .bind(text(&project.name))
            .bind(text(&project.description))
            .bind(to_json(&project.weights))
            .bind(project.created_at_unix_ms)
            .execute(self.pool())
            .await
            .map_err(failed(format!("project {} exists already", project.project)))?;
            Ok(())
        }

        async fn project(&self, project: &str) -> Result<Option<ProjectRow>, Error> {
            sqlx::query(
                "SELECT project, name, description, weights, created_at_unix_ms \
                 FROM backlog_projects WHERE project = $1",
            )
            .bind(project)
            .fetch_optional(self.pool())
            .await
            .map_err(failed(format!("failed to read project {project}")))?
            .as_ref()
            .map(project_from_row)
            .transpose()
        }

        async fn projects(&self) -> Result<Vec<ProjectRow>, Error> {
            sqlx::query(
                "SELECT project, name, description, weights, created_at_unix_ms \
                 FROM backlog_projects ORDER BY project",
            )
            .fetch_all(self.pool())
            .await
            .map_err(failed("failed to read the projects"))?
            .iter()
            .map(project_from_row)
            .collect()
        }

        async fn set_weights(&self, project: &str, weights: &Weights) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let updated = sqlx::query("UPDATE backlog_projects SET weights = $1 WHERE project = $2")
                .bind(to_json(weights))
                .bind(project)
                .execute(self.pool())
                .await
                .map_err(failed(format!("failed to set the weights of {project}")))?;
            if updated.rows_affected() == 0 {
                return Err(not_found(format!("project {project} not found")));
            }
            Ok(())
        }

        async fn create_list(&self, list: &ListRow) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            sqlx::query(
                "INSERT INTO backlog_lists (project, name, description, status, \
                 max_parallel_agents, auto_execute, runs, created_at_unix_ms, \
                 updated_at_unix_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
            )
            .bind(&list.project)
            .bind(&list.name)
            .bind(text(&list.description))
            .bind(list.status.as_str())
            .bind(to_i32(list.max_parallel_agents))
            .bind(list.auto_execute)
            .bind(to_i32(list.runs))
            .bind(list.created_at_unix_ms)
            .execute(self.pool())
            .await
            .map_err(failed(format!(
                "cannot create list {} in project {}",
                list.name, list.project
            )))?;
            Ok(())
        }

        async fn list(&self, project: &str, name: &str) -> Result<Option<ListRow>, Error> {
            sqlx::query(&format!(
                "SELECT {LIST_COLUMNS} FROM backlog_lists l WHERE l.project = $1 AND l.name = $2"
            ))
            .bind(project)
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(failed(format!("failed to read list {name}")))?
            .as_ref()
            .map(list_from_row)
            .transpose()
        }

        async fn lists(&self, project: &str) -> Result<Vec<ListRow>, Error> {
            sqlx::query(&format!(
                "SELECT {LIST_COLUMNS} FROM backlog_lists l WHERE l.project = $1 ORDER BY l.name"
            ))
            .bind(project)
            .fetch_all(self.pool())
            .await
            .map_err(failed(format!("failed to read the lists of {project}")))?
            .iter()
            .map(list_from_row)
            .collect()
        }

        async fn update_list(&self, list: &ListRow, now_ms: i64) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let updated = sqlx::query(
                "UPDATE backlog_lists SET description = $1, status = $2, \
                 max_parallel_agents = $3, auto_execute = $4, runs = $5, \
                 updated_at_unix_ms = $6 WHERE project = $7 AND name = $8",
            )
            .bind(text(&list.description))
            .bind(list.status.as_str())
            .bind(to_i32(list.max_parallel_agents))
            .bind(list.auto_execute)
            .bind(to_i32(list.runs))
            .bind(now_ms)
            .bind(&list.project)
            .bind(&list.name)
            .execute(self.pool())
            .await
            .map_err(failed(format!("failed to update list {}", list.name)))?;
            if updated.rows_affected() == 0 {
                return Err(not_found(format!(
                    "list {} not found in project {}",
                    list.name, list.project
                )));
            }
            Ok(())
        }

        async fn add_task(
            &self,
            project: &str,
            task: &BacklogTask,
            now_ms: i64,
        ) -> Result<u32, Error> {
            let _writes = self.lock_writes().await;
            let mut tx = self
                .begin_write()
                .await
                .map_err(failed("failed to begin adding a task"))?;
            let row = sqlx::query(
                "UPDATE backlog_projects SET next_task_number = next_task_number + 1 \
                 WHERE project = $1 RETURNING next_task_number - 1 AS number",
            )
            .bind(project)
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed(format!("failed to number a task of {project}")))?
            .ok_or_else(|| not_found(format!("project {project} not found")))?;
            let assigned = to_u32(column(&row, "number")?);
            let (queue, list) = match &task.placement {
                Placement::Evaluation => (Some(EVALUATION_QUEUE), None),
                Placement::List(name) => (None, Some(name.as_str())),
            };
            sqlx::query(&format!(
                "INSERT INTO backlog_tasks ({TASK_COLUMNS}) VALUES ($1, $2, $3, $4, \
                 CASE WHEN $4 IS NULL THEN NULL ELSE (SELECT COALESCE(MAX(position), 0) + 1 \
                     FROM backlog_tasks WHERE project = $1 AND list_name = $4) END, \
                 CASE WHEN $4 IS NULL THEN NULL ELSE 'pending' END, \
                 $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
            ))
            .bind(project)
            .bind(number(assigned))
            .bind(queue)
            .bind(list)
            .bind(text(&task.title))
            .bind(text(&task.description))
            .bind(task.category.as_str())
            .bind(task.priority.as_str())
            .bind(task.effort.as_str())
            .bind(i32::from(task.phase))
            .bind(task.status.as_str())
            .bind(to_json(&task.files))
            .bind(to_json(&task.acceptance_criteria))
            .bind(to_json(&task.codebase_tests))
            .bind(to_json(&task.api_tests))
            .bind(to_json(&task.ui_tests))
            .bind(now_ms)
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(failed(match list {
                Some(list) => format!("cannot add the task to list {list} of {project}"),
                None => format!("cannot add the task to {project}"),
            }))?;
            insert_links(&mut tx, project, assigned, &task.links).await?;
            tx.commit()
                .await
                .map_err(failed(format!("failed to add T-{assigned}")))?;
            Ok(assigned)
        }

        async fn task(&self, project: &str, task: u32) -> Result<Option<TaskRow>, Error> {
            let row = sqlx::query(&format!(
                "SELECT {TASK_COLUMNS} FROM backlog_tasks WHERE project = $1 AND number = $2"
            ))
            .bind(project)
            .bind(number(task))
            .fetch_optional(self.pool())
            .await
            .map_err(failed(format!("failed to read T-{task}")))?;
            let Some(row) = row else { return Ok(None) };
            let mut rows = [task_from_row(&row)?];
            with_links_and_blocks(self.pool(), project, Some(task), &mut rows).await?;
            let [row] = rows;
            Ok(Some(row))
        }

        async fn tasks(&self, project: &str, filter: &TaskFilter) -> Result<Vec<TaskRow>, Error> {
            let mut query = sqlx::QueryBuilder::<Db>::new(format!(
                "SELECT {TASK_COLUMNS} FROM backlog_tasks WHERE project = "
            ));
            query.push_bind(project);
            match &filter.placement {
                Some(Placement::Evaluation) => {
                    query.push(" AND queue IS NOT NULL");
                }
                Some(Placement::List(name)) => {
                    query.push(" AND list_name = ").push_bind(name.as_str());
                }
                None => {}
            }
            if let Some(status) = filter.status {
                query.push(" AND status = ").push_bind(status.as_str());
            }
            query.push(" ORDER BY list_name IS NULL, list_name, position, number");
            let mut rows = query
                .build()
                .fetch_all(self.pool())
                .await
                .map_err(failed(format!("failed to read the tasks of {project}")))?
                .iter()
                .map(task_from_row)
                .collect::<Result<Vec<_>, _>>()?;
            with_links_and_blocks(self.pool(), project, None, &mut rows).await?;
            Ok(rows)
        }

        async fn update_task(
            &self,
            project: &str,
            task: &BacklogTask,
            now_ms: i64,
        ) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let n = task.number;
            let mut tx = self
                .begin_write()
                .await
                .map_err(failed(format!("failed to begin editing T-{n}")))?;
            let updated = sqlx::query(
                "UPDATE backlog_tasks SET title = $1, description = $2, category = $3, \
                 priority = $4, effort = $5, phase = $6, files = $7, acceptance_criteria = $8, \
                 codebase_tests = $9, api_tests = $10, ui_tests = $11, updated_at_unix_ms = $12 \
                 WHERE project = $13 AND number = $14",
            )
            .bind(text(&task.title))
            .bind(text(&task.description))
            .bind(task.category.as_str())
            .bind(task.priority.as_str())
            .bind(task.effort.as_str())
            .bind(i32::from(task.phase))
            .bind(to_json(&task.files))
            .bind(to_json(&task.acceptance_criteria))
            .bind(to_json(&task.codebase_tests))
            .bind(to_json(&task.api_tests))
            .bind(to_json(&task.ui_tests))
            .bind(now_ms)
            .bind(project)
            .bind(number(n))
            .execute(&mut *tx)
            .await
            .map_err(failed(format!("cannot edit T-{n}")))?;
            if updated.rows_affected() == 0 {
                return Err(not_found(format!("task T-{n} not found in project {project}")));
            }
            sqlx::query("DELETE FROM backlog_relationships WHERE project = $1 AND source = $2")
                .bind(project)
                .bind(number(n))
                .execute(&mut *tx)
                .await
                .map_err(failed(format!("cannot edit the relationships of T-{n}")))?;
            insert_links(&mut tx, project, n, &task.links).await?;
            tx.commit()
                .await
                .map_err(failed(format!("failed to edit T-{n}")))
        }

        async fn place_task(
            &self,
            project: &str,
            task: u32,
            placement: &Placement,
            position: Option<u32>,
            now_ms: i64,
        ) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let mut tx = self
                .begin_write()
                .await
                .map_err(failed(format!("failed to begin moving T-{task}")))?;
            place(&mut tx, project, task, placement, position, now_ms).await?;
            tx.commit()
                .await
                .map_err(failed(format!("failed to move T-{task}")))
        }

        async fn set_status(
            &self,
            project: &str,
            task: u32,
            status: TaskStatus,
            item: Option<ItemStatus>,
            now_ms: i64,
        ) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let updated = sqlx::query(
                "UPDATE backlog_tasks SET status = $1, \
                 item_status = CASE WHEN list_name IS NULL OR $2 IS NULL THEN item_status \
                     ELSE $2 END, \
                 updated_at_unix_ms = $3 WHERE project = $4 AND number = $5",
            )
            .bind(status.as_str())
            .bind(item.map(ItemStatus::as_str))
            .bind(now_ms)
            .bind(project)
            .bind(number(task))
            .execute(self.pool())
            .await
            .map_err(failed(format!("cannot set the status of T-{task}")))?;
            if updated.rows_affected() == 0 {
                return Err(not_found(format!("task T-{task} not found in project {project}")));
            }
            Ok(())
        }

        async fn add_block(
            &self,
            project: &str,
            task: u32,
            block: &Block,
            now_ms: i64,
        ) -> Result<Uuid, Error> {
            let _writes = self.lock_writes().await;
            let mut tx = self
                .begin_write()
                .await
                .map_err(failed(format!("failed to begin blocking T-{task}")))?;
            let updated = sqlx::query(
                "UPDATE backlog_tasks SET status = 'blocked', updated_at_unix_ms = $1 \
                 WHERE project = $2 AND number = $3",
            )
            .bind(now_ms)
            .bind(project)
            .bind(number(task))
            .execute(&mut *tx)
            .await
            .map_err(failed(format!("cannot block T-{task}")))?;
            if updated.rows_affected() == 0 {
                return Err(not_found(format!("task T-{task} not found in project {project}")));
            }
            let id = Uuid::now_v7();
            sqlx::query(
                "INSERT INTO backlog_blocks (block_id, project, task, kind, reason, \
                 blocking_task, created_at_unix_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id)
            .bind(project)
            .bind(number(task))
            .bind(block.kind.as_str())
            .bind(text(&block.reason))
            .bind(block.blocking_task.map(number))
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(failed(format!("cannot block T-{task}")))?;
            tx.commit()
                .await
                .map_err(failed(format!("failed to block T-{task}")))?;
            Ok(id)
        }

        async fn resolve_blocks(
            &self,
            project: &str,
            task: u32,
            kind: Option<BlockKind>,
            resolution: &str,
            now_ms: i64,
        ) -> Result<usize, Error> {
            let _writes = self.lock_writes().await;
            let mut tx = self
                .begin_write()
                .await
                .map_err(failed(format!("failed to begin unblocking T-{task}")))?;
            let resolved = sqlx::query(
                "UPDATE backlog_blocks SET resolved_at_unix_ms = $1, resolution = $2 \
                 WHERE project = $3 AND task = $4 AND resolved_at_unix_ms IS NULL \
                 AND ($5 IS NULL OR kind = $5)",
            )
            .bind(now_ms)
            .bind(text(resolution))
            .bind(project)
            .bind(number(task))
            .bind(kind.map(BlockKind::as_str))
            .execute(&mut *tx)
            .await
            .map_err(failed(format!("cannot unblock T-{task}")))?
            .rows_affected();
            sqlx::query(
                "UPDATE backlog_tasks SET status = CASE WHEN list_name IS NULL \
                     THEN 'evaluating' ELSE 'pending' END, updated_at_unix_ms = $1 \
                 WHERE project = $2 AND number = $3 AND status = 'blocked' \
                 AND NOT EXISTS (SELECT 1 FROM backlog_blocks b WHERE b.project = $2 \
                     AND b.task = $3 AND b.resolved_at_unix_ms IS NULL)",
            )
            .bind(now_ms)
            .bind(project)
            .bind(number(task))
            .execute(&mut *tx)
            .await
            .map_err(failed(format!("cannot unblock T-{task}")))?;
            tx.commit()
                .await
                .map_err(failed(format!("failed to unblock T-{task}")))?;
            Ok(usize::try_from(resolved).unwrap_or(usize::MAX))
        }

        async fn blocks(&self, project: &str, task: u32) -> Result<Vec<BlockRow>, Error> {
            sqlx::query(
                "SELECT block_id, task, kind, reason, blocking_task, created_at_unix_ms, \
                 resolved_at_unix_ms, resolution FROM backlog_blocks \
                 WHERE project = $1 AND task = $2 ORDER BY created_at_unix_ms, block_id",
            )
            .bind(project)
            .bind(number(task))
            .fetch_all(self.pool())
            .await
            .map_err(failed(format!("failed to read the blocks of T-{task}")))?
            .iter()
            .map(block_from_row)
            .collect()
        }

        async fn put_rule(&self, project: &str, rule: &RuleSpec) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            sqlx::query(
                "INSERT INTO backlog_rules (project, name, spec) VALUES ($1, $2, $3) \
                 ON CONFLICT (project, name) DO UPDATE SET spec = excluded.spec",
            )
            .bind(project)
            .bind(&rule.name)
            .bind(to_json(rule))
            .execute(self.pool())
            .await
            .map_err(failed(format!("cannot store rule {} of {project}", rule.name)))?;
            Ok(())
        }

        async fn rules(&self, project: &str) -> Result<Vec<RuleSpec>, Error> {
            sqlx::query("SELECT spec FROM backlog_rules WHERE project = $1 ORDER BY name")
                .bind(project)
                .fetch_all(self.pool())
                .await
                .map_err(failed(format!("failed to read the rules of {project}")))?
                .iter()
                .map(|row| from_json("rule", &column::<String>(row, "spec")?))
                .collect()
        }

        async fn delete_rule(&self, project: &str, name: &str) -> Result<bool, Error> {
            let _writes = self.lock_writes().await;
            let deleted = sqlx::query("DELETE FROM backlog_rules WHERE project = $1 AND name = $2")
                .bind(project)
                .bind(name)
                .execute(self.pool())
                .await
                .map_err(failed(format!("cannot delete rule {name}")))?;
            Ok(deleted.rows_affected() > 0)
        }

        async fn insert_suggestions(&self, rows: &[SuggestionRow]) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let mut tx = self
                .begin_write()
                .await
                .map_err(failed("failed to begin storing suggestions"))?;
            for row in rows {
                sqlx::query(
                    "INSERT INTO backlog_suggestions (suggestion_id, project, status, name, \
                     tasks, score, reason, triggered_by, trigger_task, created_list, \
                     created_at_unix_ms, resolved_at_unix_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                )
                .bind(row.suggestion_id)
                .bind(&row.project)
                .bind(&row.status)
                .bind(&row.suggestion.name)
                .bind(to_json(&row.suggestion.tasks))
                .bind(row.suggestion.score)
                .bind(text(&row.suggestion.reason))
                .bind(&row.triggered_by)
                .bind(row.trigger_task.map(number))
                .bind(row.created_list.as_deref())
                .bind(row.created_at_unix_ms)
                .bind(row.resolved_at_unix_ms)
                .execute(&mut *tx)
                .await
                .map_err(failed(format!("cannot store suggestion {}", row.suggestion_id)))?;
            }
            tx.commit()
                .await
                .map_err(failed("failed to store suggestions"))
        }

        async fn suggestions(
            &self,
            project: &str,
            status: Option<&str>,
        ) -> Result<Vec<SuggestionRow>, Error> {
            sqlx::query(
                "SELECT suggestion_id, project, status, name, tasks, score, reason, \
                 triggered_by, trigger_task, created_list, created_at_unix_ms, \
                 resolved_at_unix_ms FROM backlog_suggestions \
                 WHERE project = $1 AND ($2 IS NULL OR status = $2) \
                 ORDER BY created_at_unix_ms DESC, suggestion_id DESC",
            )
            .bind(project)
            .bind(status)
            .fetch_all(self.pool())
            .await
            .map_err(failed(format!("failed to read the suggestions of {project}")))?
            .iter()
            .map(suggestion_from_row)
            .collect()
        }

        async fn reject_suggestion(
            &self,
            project: &str,
            id: Uuid,
            now_ms: i64,
        ) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let updated = sqlx::query(
                "UPDATE backlog_suggestions SET status = 'rejected', resolved_at_unix_ms = $1 \
                 WHERE project = $2 AND suggestion_id = $3 AND status = 'pending'",
            )
            .bind(now_ms)
            .bind(project)
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(failed(format!("cannot reject suggestion {id}")))?;
            if updated.rows_affected() == 0 {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!("suggestion {id} of {project} is not pending (or does not exist)"),
                ));
            }
            Ok(())
        }

        async fn start_run(
            &self,
            project: &str,
            list: &str,
            task_type: &str,
            queue: &str,
            now_ms: i64,
        ) -> Result<u32, Error> {
            let _writes = self.lock_writes().await;
            let what = format!("cannot start a run of list {list}");
            let mut tx = self.begin_write().await.map_err(failed(what.clone()))?;
            let row = sqlx::query(
                "UPDATE backlog_lists SET runs = runs + 1, status = 'in_progress', \
                 updated_at_unix_ms = $1 WHERE project = $2 AND name = $3 RETURNING runs",
            )
            .bind(now_ms)
            .bind(project)
            .bind(list)
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed(what.clone()))?
            .ok_or_else(|| not_found(format!("list {list} not found in project {project}")))?;
            let run_number = to_u32(column(&row, "runs")?);
            let items = sqlx::query(
                "UPDATE backlog_tasks SET item_status = 'pending', updated_at_unix_ms = $1 \
                 WHERE project = $2 AND list_name = $3",
            )
            .bind(now_ms)
            .bind(project)
            .bind(list)
            .execute(&mut *tx)
            .await
            .map_err(failed(what.clone()))?
            .rows_affected();
            sqlx::query(&format!(
                "INSERT INTO backlog_runs ({RUN_COLUMNS}) \
                 VALUES ($1, $2, $3, NULL, 'starting', $4, $5, $6, 0, 0, '', $7, NULL)"
            ))
            .bind(project)
            .bind(list)
            .bind(number(run_number))
            .bind(task_type)
            .bind(queue)
            .bind(i32::try_from(items).unwrap_or(i32::MAX))
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(failed(what.clone()))?;
            tx.commit().await.map_err(failed(what))?;
            Ok(run_number)
        }

        async fn run_started(
            &self,
            project: &str,
            list: &str,
            run_number: u32,
            started: Result<Uuid, &str>,
            now_ms: i64,
        ) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let what = format!("cannot record run {run_number} of list {list}");
            let mut tx = self.begin_write().await.map_err(failed(what.clone()))?;
            let (execution_id, status, reason, ended) = match started {
                Ok(id) => (Some(id), "running", "", None),
                Err(reason) => (None, "failed", reason, Some(now_ms)),
            };
            let recorded = sqlx::query(
                "UPDATE backlog_runs SET execution_id = $1, status = $2, reason = $3, \
                 ended_at_unix_ms = $4 WHERE project = $5 AND list_name = $6 AND run_number = $7 \
                 AND status = 'starting'",
            )
            .bind(execution_id)
            .bind(status)
            .bind(text(reason))
            .bind(ended)
            .bind(project)
            .bind(list)
            .bind(number(run_number))
            .execute(&mut *tx)
            .await
            .map_err(failed(what.clone()))?
            .rows_affected();
            if execution_id.is_none() && recorded > 0 {
                sqlx::query(
                    "UPDATE backlog_lists SET status = 'ready', updated_at_unix_ms = $1 \
                     WHERE project = $2 AND name = $3",
                )
                .bind(now_ms)
                .bind(project)
                .bind(list)
                .execute(&mut *tx)
                .await
                .map_err(failed(what.clone()))?;
            }
            tx.commit().await.map_err(failed(what))
        }

        async fn runs(&self, project: &str, list: &str) -> Result<Vec<RunRow>, Error> {
            sqlx::query(&format!(
                "SELECT {RUN_COLUMNS} FROM backlog_runs WHERE project = $1 AND list_name = $2 \
                 ORDER BY run_number DESC"
            ))
            .bind(project)
            .bind(list)
            .fetch_all(self.pool())
            .await
            .map_err(failed(format!("failed to read the runs of list {list}")))?
            .iter()
            .map(run_from_row)
            .collect()
        }

        async fn running_runs(&self) -> Result<Vec<RunRow>, Error> {
            sqlx::query(&format!(
                "SELECT {RUN_COLUMNS} FROM backlog_runs WHERE status = 'running' \
                 ORDER BY project, list_name, run_number"
            ))
            .fetch_all(self.pool())
            .await
            .map_err(failed("failed to read the running runs"))?
            .iter()
            .map(run_from_row)
            .collect()
        }

        async fn starting_runs(&self, before_ms: i64) -> Result<Vec<RunRow>, Error> {
            sqlx::query(&format!(
                "SELECT {RUN_COLUMNS} FROM backlog_runs WHERE status = 'starting' \
                 AND created_at_unix_ms < $1 ORDER BY project, list_name, run_number"
            ))
            .bind(before_ms)
            .fetch_all(self.pool())
            .await
            .map_err(failed("failed to read the starting runs"))?
            .iter()
            .map(run_from_row)
            .collect()
        }

        async fn follow_run(
            &self,
            project: &str,
            list: &str,
            run_number: u32,
            progress: &RunProgress,
            now_ms: i64,
        ) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let what = format!("cannot record the progress of run {run_number} of list {list}");
            let mut tx = self.begin_write().await.map_err(failed(what.clone()))?;
            for (task, item) in &progress.items {
                let status = match item {
                    ItemStatus::Completed => Some("completed"),
                    ItemStatus::Failed => Some("failed"),
                    ItemStatus::InProgress => Some("in_progress"),
                    ItemStatus::Pending | ItemStatus::Skipped => None,
                };
                sqlx::query(
                    "UPDATE backlog_tasks SET item_status = $1, \
                     status = COALESCE($2, status), updated_at_unix_ms = $3 \
                     WHERE project = $4 AND list_name = $5 AND number = $6 \
                     AND (item_status <> $1 OR ($2 IS NOT NULL AND status <> $2))",
                )
                .bind(item.as_str())
                .bind(status)
                .bind(now_ms)
                .bind(project)
                .bind(list)
                .bind(number(*task))
                .execute(&mut *tx)
                .await
                .map_err(failed(what.clone()))?;
            }
            let count = |wanted: ItemStatus| {
                progress.items.iter().filter(|(_, item)| *item == wanted).count()
            };
            let completed = count(ItemStatus::Completed);
            let failed_count = count(ItemStatus::Failed);
            let (status, reason, ended) = match &progress.ended {
                Some((status, reason)) => (status.as_str(), reason.as_str(), Some(now_ms)),
                None => ("running", "", None),
            };
            sqlx::query(
                "UPDATE backlog_runs SET tasks_completed = $1, tasks_failed = $2, status = $3, \
                 reason = $4, ended_at_unix_ms = $5 \
                 WHERE project = $6 AND list_name = $7 AND run_number = $8",
            )
            .bind(i32::try_from(completed).unwrap_or(i32::MAX))
            .bind(i32::try_from(failed_count).unwrap_or(i32::MAX))
            .bind(status)
            .bind(text(reason))
            .bind(ended)
            .bind(project)
            .bind(list)
            .bind(number(run_number))
            .execute(&mut *tx)
            .await
            .map_err(failed(what.clone()))?;
            if progress.ended.is_some() {
                let all_done = completed == progress.items.len();
                sqlx::query(
                    "UPDATE backlog_lists SET status = $1, updated_at_unix_ms = $2 \
                     WHERE project = $3 AND name = $4",
                )
                .bind(if all_done { "completed" } else { "paused" })
                .bind(now_ms)
                .bind(project)
                .bind(list)
                .execute(&mut *tx)
                .await
                .map_err(failed(what.clone()))?;
            }
            tx.commit().await.map_err(failed(what))
        }

        async fn accept_suggestion(
            &self,
            id: Uuid,
            list: &ListRow,
            tasks: &[u32],
            now_ms: i64,
        ) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let project = list.project.as_str();
            let mut tx = self
                .begin_write()
                .await
                .map_err(failed(format!("failed to begin accepting suggestion {id}")))?;
            let row = sqlx::query(
                "SELECT tasks FROM backlog_suggestions \
                 WHERE project = $1 AND suggestion_id = $2 AND status = 'pending'",
            )
            .bind(project)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed(format!("failed to read suggestion {id}")))?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::FailedPrecondition,
                    format!("suggestion {id} of {project} is not pending (or does not exist)"),
                )
            })?;
            let suggested: Vec<u32> = from_json("suggestion", &column::<String>(&row, "tasks")?)?;
            let status = if suggested == tasks { "accepted" } else { "modified" };
            sqlx::query(
                "INSERT INTO backlog_lists (project, name, description, status, \
                 max_parallel_agents, auto_execute, runs, created_at_unix_ms, \
                 updated_at_unix_ms) VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $7)",
            )
            .bind(project)
            .bind(&list.name)
            .bind(text(&list.description))
            .bind(list.status.as_str())
            .bind(to_i32(list.max_parallel_agents))
            .bind(list.auto_execute)
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(failed(format!("cannot create list {} in {project}", list.name)))?;
            for task in tasks {
                let queued = sqlx::query(
                    "SELECT 1 AS queued FROM backlog_tasks \
                     WHERE project = $1 AND number = $2 AND queue IS NOT NULL",
                )
                .bind(project)
                .bind(number(*task))
                .fetch_optional(&mut *tx)
                .await
                .map_err(failed(format!("failed to read T-{task}")))?;
                if queued.is_none() {
                    return Err(Error::new(
                        ErrorKind::FailedPrecondition,
                        format!("T-{task} is not in the evaluation queue of {project}"),
                    ));
                }
                let placement = Placement::List(list.name.clone());
                place(&mut tx, project, *task, &placement, None, now_ms).await?;
            }
            sqlx::query(
                "UPDATE backlog_suggestions SET status = $1, created_list = $2, \
                 resolved_at_unix_ms = $3 WHERE suggestion_id = $4",
            )
            .bind(status)
            .bind(&list.name)
            .bind(now_ms)
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(failed(format!("cannot accept suggestion {id}")))?;
            tx.commit()
                .await
                .map_err(failed(format!("failed to accept suggestion {id}")))
        }
    }
}
