//! The notifications' tables, against SQLite and PostgreSQL: a sink per project, a delivery
//! enqueued once per sink and event, claimed by one notifier at a time, its attempts recorded;
//! and the read model's questions as the notifier reads them.

use std::sync::Arc;

use trellis_checkpoint_store::store::backlog::Backlog;
use trellis_checkpoint_store::store::notify::{Attempt, DeliveryRow, SinkKind, SinkRow};
use trellis_checkpoint_store::store::{
    ErrorKind, QuestionResolved, QuestionRow, ReadModelBatch, Resolution, connect_all,
};
use trellis_core::ids::{ExecutionId, QuestionId, TaskInstanceId};
use trellis_core::machine::{Question, TimeoutAction};
use trellis_core::record::TaskState;
use uuid::Uuid;

use crate::support::{TestStore, store_suite};

store_suite!(
    a_sink_belongs_to_an_existing_project_and_is_named_once,
    a_delivery_is_enqueued_once_claimed_once_and_its_attempts_recorded,
    the_notifier_reads_pending_questions_by_when_they_were_asked,
);

const NOW: i64 = 1_780_000_000_000;

async fn open(store: &TestStore) -> anyhow::Result<Arc<dyn Backlog>> {
    let (_, backlog) = connect_all(&store.url).await?;
    backlog
        .create_project(&crate::backlog::web_project())
        .await?;
    Ok(backlog)
}

fn webhook(project: &str, name: &str) -> SinkRow {
    SinkRow {
        project: project.into(),
        name: name.into(),
        list: None,
        kind: SinkKind::Webhook {
            url: "https://ops.example.com/trellis".into(),
            secret: "k3y".into(),
        },
        events: vec!["question".into(), "failed".into()],
        created_at_unix_ms: NOW,
    }
}

fn delivery(sink: &str, key: &str) -> DeliveryRow {
    DeliveryRow {
        delivery_id: Uuid::now_v7(),
        project: "web".into(),
        sink: sink.into(),
        event_key: key.into(),
        event_at_unix_ms: NOW + 5,
        payload: "{\"event\":\"question\"}".into(),
        status: "pending".into(),
        attempts: 0,
        next_attempt_at_unix_ms: NOW,
        last_status: None,
        last_error: String::new(),
        delivered_at_unix_ms: None,
        created_at_unix_ms: NOW,
    }
}

async fn a_sink_belongs_to_an_existing_project_and_is_named_once(
    store: TestStore,
) -> anyhow::Result<()> {
    let backlog = open(&store).await?;
    let bot = SinkRow {
        kind: SinkKind::Telegram {
            base_url: "https://api.telegram.org".into(),
            token: "T0K".into(),
            chat_id: "-100".into(),
            callback_secret: "s".into(),
        },
        list: None,
        ..webhook("web", "team")
    };
    backlog.create_sink(&webhook("web", "ops")).await?;
    backlog.create_sink(&bot).await?;
    let taken = backlog.create_sink(&webhook("web", "ops")).await;
    assert_eq!(taken.map_err(|e| e.kind()), Err(ErrorKind::AlreadyExists));
    let orphan = backlog.create_sink(&webhook("nowhere", "ops")).await;
    assert_eq!(orphan.map_err(|e| e.kind()), Err(ErrorKind::NotFound));
    assert_eq!(
        backlog.sinks(Some("web")).await?,
        [webhook("web", "ops"), bot.clone()]
    );
    assert_eq!(backlog.sink("web", "team").await?, Some(bot));
    assert!(backlog.delete_sink("web", "team").await?);
    assert!(!backlog.delete_sink("web", "team").await?);
    assert_eq!(backlog.sinks(None).await?.len(), 1);
    Ok(())
}

async fn a_delivery_is_enqueued_once_claimed_once_and_its_attempts_recorded(
    store: TestStore,
) -> anyhow::Result<()> {
    let backlog = open(&store).await?;
    backlog.create_sink(&webhook("web", "ops")).await?;
    assert_eq!(backlog.newest_enqueued_event().await?, None);
    let first = delivery("ops", "question/q-1");
    assert_eq!(
        backlog
            .enqueue_deliveries(std::slice::from_ref(&first))
            .await?,
        1
    );
    // The same event again (a rescan, another planner) is not a second delivery.
    assert_eq!(
        backlog
            .enqueue_deliveries(&[delivery("ops", "question/q-1")])
            .await?,
        0
    );
    assert_eq!(backlog.newest_enqueued_event().await?, Some(NOW + 5));

    let claimed = backlog.claim_deliveries(NOW, NOW + 60_000, 10).await?;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].delivery_id, first.delivery_id);
    // Leased: nobody else claims it before the lease ends.
    assert!(
        backlog
            .claim_deliveries(NOW + 1, NOW + 60_001, 10)
            .await?
            .is_empty()
    );

    let failed = Attempt::Failed {
        status: Some(503),
        error: "answered 503".into(),
        retry_at_unix_ms: Some(NOW + 1_000),
    };
    backlog
        .record_attempt(first.delivery_id, &failed, NOW + 2)
        .await?;
    assert!(
        backlog
            .claim_deliveries(NOW + 999, NOW + 2_000, 10)
            .await?
            .is_empty()
    );
    let again = backlog
        .claim_deliveries(NOW + 1_000, NOW + 61_000, 10)
        .await?;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].attempts, again[0].last_status), (1, Some(503)));
    backlog
        .record_attempt(
            first.delivery_id,
            &Attempt::Delivered { status: 200 },
            NOW + 1_001,
        )
        .await?;
    let listed = backlog.deliveries("web", Some("ops"), 10).await?;
    assert_eq!(listed.len(), 1);
    let done = &listed[0];
    assert_eq!(
        (
            done.status.as_str(),
            done.attempts,
            done.last_status,
            done.delivered_at_unix_ms
        ),
        ("delivered", 2, Some(200), Some(NOW + 1_001))
    );
    assert_eq!(done.last_error, "");
    // Delivered is done: never claimed again.
    assert!(
        backlog
            .claim_deliveries(NOW + 100_000, NOW + 200_000, 10)
            .await?
            .is_empty()
    );

    // Out of attempts: failed, kept with its last error.
    let second = delivery("ops", "execution/e-1/failed");
    backlog
        .enqueue_deliveries(std::slice::from_ref(&second))
        .await?;
    backlog.claim_deliveries(NOW, NOW + 60_000, 10).await?;
    let gave_up = Attempt::Failed {
        status: None,
        error: "cannot reach ops.example.com".into(),
        retry_at_unix_ms: None,
    };
    backlog
        .record_attempt(second.delivery_id, &gave_up, NOW + 3)
        .await?;
    let listed = backlog.deliveries("web", None, 10).await?;
    let failed = listed
        .iter()
        .find(|row| row.delivery_id == second.delivery_id)
        .expect("the second delivery");
    assert_eq!(failed.status, "failed");
    assert_eq!(failed.last_error, "cannot reach ops.example.com");
    assert!(
        backlog
            .claim_deliveries(NOW + 100_000, NOW + 200_000, 10)
            .await?
            .is_empty()
    );

    // A sink's removal takes its deliveries with it.
    backlog.delete_sink("web", "ops").await?;
    assert!(backlog.deliveries("web", None, 10).await?.is_empty());
    Ok(())
}

fn asked(seed: u128, at_ms: u64) -> QuestionRow {
    QuestionRow {
        execution_id: ExecutionId(Uuid::from_u128(1)),
        task_instance_id: TaskInstanceId(Uuid::from_u128(100 + seed)),
        task_id: "ask".into(),
        attempt: 1,
        question: Question {
            id: QuestionId::derived(at_ms, seed),
            question_type: "approval".into(),
            priority: "critical".into(),
            text: format!("question {seed}"),
            options: vec!["yes".into(), "no".into()],
            expires_at_ms: Some(at_ms + 60_000),
            timeout_action: TimeoutAction::Answer("no".into()),
        },
        asked_at_ms: at_ms,
    }
}

async fn the_notifier_reads_pending_questions_by_when_they_were_asked(
    store: TestStore,
) -> anyhow::Result<()> {
    let (read_model, backlog) = connect_all(&store.url).await?;
    let at = 1_780_000_000_000_u64;
    let questions = [asked(1, at), asked(2, at + 10), asked(3, at + 20)];
    read_model
        .write_read_model(&ReadModelBatch {
            questions_asked: questions.to_vec(),
            questions_resolved: vec![QuestionResolved {
                question_id: questions[1].question.id,
                resolution: Resolution::Answered("yes".into()),
                at_ms: at + 15,
            }],
            ..ReadModelBatch::default()
        })
        .await?;
    let now = i64::try_from(at)?;
    // After the first, up to the third: the second was answered, so only the third is pending.
    let pending = backlog.questions_asked_between(now, now + 20, 10).await?;
    assert_eq!(pending, [questions[2].clone()]);
    let all = backlog
        .questions_asked_between(now - 1, now + 100, 10)
        .await?;
    assert_eq!(all, [questions[0].clone(), questions[2].clone()]);
    assert_eq!(
        backlog
            .questions_asked_between(now - 1, now + 100, 1)
            .await?
            .len(),
        1
    );
    // Cancelling the instance that asked the third withdraws it: nothing is sent for it.
    let asker = questions[2].task_instance_id;
    let cancelled = crate::conformance::record(
        questions[2].execution_id,
        asker,
        "ask",
        TaskState::Cancelled,
    );
    read_model
        .write_read_model(&ReadModelBatch {
            instances: vec![cancelled],
            ..ReadModelBatch::default()
        })
        .await?;
    let pending = backlog
        .questions_asked_between(now - 1, now + 100, 10)
        .await?;
    assert_eq!(pending, [questions[0].clone()]);

    let answered = backlog
        .question(questions[1].question.id.0)
        .await?
        .expect("the second question");
    assert_eq!(answered.row, questions[1]);
    assert_eq!(
        (answered.status.as_str(), answered.answer.as_deref()),
        ("answered", Some("yes"))
    );
    assert_eq!(backlog.question(Uuid::now_v7()).await?, None);
    Ok(())
}
