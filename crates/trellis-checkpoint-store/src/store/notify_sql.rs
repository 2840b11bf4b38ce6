// The notifications' SQL, compiled once per backend like `backlog_sql.rs`: `postgres.rs` and
// `sqlite.rs` include it after `sql.rs` and `backlog_sql.rs`.
//
// (A plain `//` header: an included file cannot carry inner doc comments.)

mod notify_sql {
    use async_trait::async_trait;
    use uuid::Uuid;

    use sqlx::QueryBuilder;

    use super::backlog_sql::failed;
    use super::{
        Db, DbRow, QUESTION_STILL_ASKED, StoreImpl, chunks, column, question_from_row, text,
    };
    use crate::store::notify::{
        Attempt, DeliveryRow, Notifications, SinkKind, SinkRow, StoredQuestion,
    };
    use crate::store::{Error, QuestionRow};

    const SINK_COLUMNS: &str = "project, name, list_name, kind, url, chat_id, secret, \
                                callback_secret, events, created_at_unix_ms";

    const DELIVERY_COLUMNS: &str = "delivery_id, project, sink, event_key, event_at_unix_ms, \
        payload, status, attempts, next_attempt_at_unix_ms, last_status, last_error, \
        delivered_at_unix_ms, created_at_unix_ms";

    const QUESTION_COLUMNS: &str = "question_id, execution_id, task_instance_id, task_id, \
        attempt, question_type, text, options, default_answer, timeout_action, \
        expires_at_unix_ms, asked_at_unix_ms, priority";

    fn sink_from_row(row: &DbRow) -> Result<SinkRow, Error> {
        let kind: String = column(row, "kind")?;
        let url: String = column(row, "url")?;
        let secret: String = column(row, "secret")?;
        let kind = match kind.as_str() {
            "telegram" => SinkKind::Telegram {
                base_url: url,
                token: secret,
                chat_id: column(row, "chat_id")?,
                callback_secret: column(row, "callback_secret")?,
            },
            _ => SinkKind::Webhook { url, secret },
        };
        let events: String = column(row, "events")?;
        Ok(SinkRow {
            project: column(row, "project")?,
            name: column(row, "name")?,
            list: column(row, "list_name")?,
            kind,
            events: events
                .split(',')
                .filter(|event| !event.is_empty())
                .map(str::to_owned)
                .collect(),
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
        })
    }

    fn delivery_from_row(row: &DbRow) -> Result<DeliveryRow, Error> {
        Ok(DeliveryRow {
            delivery_id: column(row, "delivery_id")?,
            project: column(row, "project")?,
            sink: column(row, "sink")?,
            event_key: column(row, "event_key")?,
            event_at_unix_ms: column(row, "event_at_unix_ms")?,
            payload: column(row, "payload")?,
            status: column(row, "status")?,
            attempts: u32::try_from(column::<i32>(row, "attempts")?).unwrap_or(0),
            next_attempt_at_unix_ms: column(row, "next_attempt_at_unix_ms")?,
            last_status: column::<Option<i32>>(row, "last_status")?
                .and_then(|status| u16::try_from(status).ok()),
            last_error: column(row, "last_error")?,
            delivered_at_unix_ms: column(row, "delivered_at_unix_ms")?,
            created_at_unix_ms: column(row, "created_at_unix_ms")?,
        })
    }

    #[async_trait]
    impl Notifications for StoreImpl {
        async fn create_sink(&self, sink: &SinkRow) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let (url, chat_id, secret, callback_secret) = match &sink.kind {
                SinkKind::Webhook { url, secret } => (url, "", secret, ""),
                SinkKind::Telegram {
                    base_url,
                    token,
                    chat_id,
                    callback_secret,
                } => (base_url, chat_id.as_str(), token, callback_secret.as_str()),
            };
            sqlx::query(&format!(
                "INSERT INTO notify_sinks ({SINK_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ))
            .bind(&sink.project)
            .bind(&sink.name)
            .bind(&sink.list)
            .bind(sink.kind.name())
            .bind(url)
            .bind(chat_id)
            .bind(secret)
            .bind(callback_secret)
            .bind(sink.events.join(","))
            .bind(sink.created_at_unix_ms)
            .execute(self.pool())
            .await
            .map_err(failed(format!(
                "cannot store sink {} of project {}",
                sink.name, sink.project
            )))?;
            Ok(())
        }

        async fn sink(&self, project: &str, name: &str) -> Result<Option<SinkRow>, Error> {
            sqlx::query(&format!(
                "SELECT {SINK_COLUMNS} FROM notify_sinks WHERE project = $1 AND name = $2"
            ))
            .bind(project)
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(failed(format!("failed to read sink {name} of {project}")))?
            .as_ref()
            .map(sink_from_row)
            .transpose()
        }

        async fn sinks(&self, project: Option<&str>) -> Result<Vec<SinkRow>, Error> {
            sqlx::query(&format!(
                "SELECT {SINK_COLUMNS} FROM notify_sinks \
                 WHERE $1 IS NULL OR project = $1 ORDER BY project, name"
            ))
            .bind(project)
            .fetch_all(self.pool())
            .await
            .map_err(failed("failed to read the sinks"))?
            .iter()
            .map(sink_from_row)
            .collect()
        }

        async fn delete_sink(&self, project: &str, name: &str) -> Result<bool, Error> {
            let _writes = self.lock_writes().await;
            // Its deliveries go with it: their foreign key cascades.
            let deleted = sqlx::query("DELETE FROM notify_sinks WHERE project = $1 AND name = $2")
                .bind(project)
                .bind(name)
                .execute(self.pool())
                .await
                .map_err(failed(format!("cannot delete sink {name} of {project}")))?;
            Ok(deleted.rows_affected() > 0)
        }

        async fn enqueue_deliveries(&self, deliveries: &[DeliveryRow]) -> Result<usize, Error> {
            if deliveries.is_empty() {
                return Ok(0);
            }
            let _writes = self.lock_writes().await;
            let what = "cannot enqueue notifications";
            let mut tx = self.begin_write().await.map_err(failed(what))?;
            let mut added = 0;
            for chunk in chunks(deliveries, 13) {
                let mut query = QueryBuilder::<Db>::new(format!(
                    "INSERT INTO notify_deliveries ({DELIVERY_COLUMNS}) "
                ));
                query.push_values(chunk, |mut values, delivery| {
                    values
                        .push_bind(delivery.delivery_id)
                        .push_bind(&delivery.project)
                        .push_bind(&delivery.sink)
                        .push_bind(&delivery.event_key)
                        .push_bind(delivery.event_at_unix_ms)
                        .push_bind(text(&delivery.payload))
                        .push_bind(&delivery.status)
                        .push_bind(i32::try_from(delivery.attempts).unwrap_or(i32::MAX))
                        .push_bind(delivery.next_attempt_at_unix_ms)
                        .push_bind(delivery.last_status.map(i32::from))
                        .push_bind(text(&delivery.last_error))
                        .push_bind(delivery.delivered_at_unix_ms)
                        .push_bind(delivery.created_at_unix_ms);
                });
                query.push(" ON CONFLICT (project, sink, event_key) DO NOTHING");
                let inserted = query
                    .build()
                    .execute(&mut *tx)
                    .await
                    .map_err(failed(what))?;
                added += usize::try_from(inserted.rows_affected()).unwrap_or(0);
            }
            tx.commit().await.map_err(failed(what))?;
            Ok(added)
        }

        async fn claim_deliveries(
            &self,
            now_ms: i64,
            lease_until_ms: i64,
            limit: u32,
        ) -> Result<Vec<DeliveryRow>, Error> {
            let _writes = self.lock_writes().await;
            // One statement claims them: a delivery another notifier claimed meanwhile is no
            // longer due when this UPDATE re-reads it (PostgreSQL re-checks a row it waited
            // for; SQLite writes one at a time), so the lease goes to one notifier.
            let mut claimed = sqlx::query(&format!(
                "UPDATE notify_deliveries SET next_attempt_at_unix_ms = $1 \
                 WHERE status = 'pending' AND next_attempt_at_unix_ms <= $2 \
                 AND delivery_id IN (SELECT delivery_id FROM notify_deliveries \
                 WHERE status = 'pending' AND next_attempt_at_unix_ms <= $2 \
                 ORDER BY next_attempt_at_unix_ms, delivery_id LIMIT $3) \
                 RETURNING {DELIVERY_COLUMNS}"
            ))
            .bind(lease_until_ms)
            .bind(now_ms)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(failed("cannot claim notifications"))?
            .iter()
            .map(delivery_from_row)
            .collect::<Result<Vec<_>, _>>()?;
            claimed.sort_by_key(|delivery| delivery.delivery_id);
            Ok(claimed)
        }

        async fn record_attempt(
            &self,
            delivery_id: Uuid,
            attempt: &Attempt,
            now_ms: i64,
        ) -> Result<(), Error> {
            let _writes = self.lock_writes().await;
            let query = match attempt {
                Attempt::Delivered { status } => sqlx::query(
                    "UPDATE notify_deliveries SET status = 'delivered', attempts = attempts + 1, \
                     last_status = $1, last_error = '', delivered_at_unix_ms = $2 \
                     WHERE delivery_id = $3",
                )
                .bind(i32::from(*status))
                .bind(now_ms)
                .bind(delivery_id),
                Attempt::Failed {
                    status,
                    error,
                    retry_at_unix_ms,
                } => sqlx::query(
                    "UPDATE notify_deliveries SET status = $1, attempts = attempts + 1, \
                     last_status = $2, last_error = $3, next_attempt_at_unix_ms = $4 \
                     WHERE delivery_id = $5",
                )
                .bind(if retry_at_unix_ms.is_some() {
                    "pending"
                } else {
                    "failed"
                })
                .bind(status.map(i32::from))
                .bind(text(error))
                .bind(retry_at_unix_ms.unwrap_or(now_ms))
                .bind(delivery_id),
            };
            query
                .execute(self.pool())
                .await
                .map_err(failed(format!(
                    "cannot record an attempt of notification {delivery_id}"
                )))?;
            Ok(())
        }

        async fn deliveries(
            &self,
            project: &str,
            sink: Option<&str>,
            limit: u32,
        ) -> Result<Vec<DeliveryRow>, Error> {
            sqlx::query(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM notify_deliveries \
                 WHERE project = $1 AND ($2 IS NULL OR sink = $2) \
                 ORDER BY created_at_unix_ms DESC, delivery_id DESC LIMIT $3"
            ))
            .bind(project)
            .bind(sink)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(failed(format!("failed to read the notifications of {project}")))?
            .iter()
            .map(delivery_from_row)
            .collect()
        }

        async fn newest_enqueued_event(&self) -> Result<Option<i64>, Error> {
            let row = sqlx::query("SELECT MAX(event_at_unix_ms) AS newest FROM notify_deliveries")
                .fetch_one(self.pool())
                .await
                .map_err(failed("failed to read the newest notification"))?;
            column(&row, "newest")
        }

        async fn questions_asked_between(
            &self,
            after_ms: i64,
            until_ms: i64,
            limit: u32,
        ) -> Result<Vec<QuestionRow>, Error> {
            sqlx::query(&format!(
                "SELECT {QUESTION_COLUMNS} FROM questions q WHERE {QUESTION_STILL_ASKED} \
                 AND asked_at_unix_ms > $1 AND asked_at_unix_ms <= $2 \
                 ORDER BY asked_at_unix_ms, question_id LIMIT $3"
            ))
            .bind(after_ms)
            .bind(until_ms)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(failed("failed to read the questions asked"))?
            .iter()
            .map(question_from_row)
            .collect()
        }

        async fn question(&self, question_id: Uuid) -> Result<Option<StoredQuestion>, Error> {
            let Some(row) = sqlx::query(&format!(
                "SELECT {QUESTION_COLUMNS}, status, answer FROM questions WHERE question_id = $1"
            ))
            .bind(question_id)
            .fetch_optional(self.pool())
            .await
            .map_err(failed(format!("failed to read question {question_id}")))?
            else {
                return Ok(None);
            };
            Ok(Some(StoredQuestion {
                row: question_from_row(&row)?,
                status: column(&row, "status")?,
                answer: column(&row, "answer")?,
            }))
        }
    }
}
