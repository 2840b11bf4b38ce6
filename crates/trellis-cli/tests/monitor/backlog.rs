//! The backlog page: `/api/backlog` reads the planner's queue, lists and pending suggestions; a
//! suggestion is accepted with the token (refused without, and once only), in the API and by a
//! click in headless Chromium.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::{Value, json};
use tonic::transport::Channel;
use trellis_proto::v1;
use trellis_proto::v1::backlog_client::BacklogClient;

use crate::api::{get, post};
use crate::page::{browser_with_token, click, screenshot, start_driver, wait_page};
use crate::{Dev, TOKEN, start_dev};

/// Adds two queued tasks that belong together, and returns the suggestion they lead to.
async fn two_related_tasks(dev: &Dev) -> String {
    let channel = Channel::from_shared(dev.planner.clone())
        .expect("a planner URL")
        .connect()
        .await
        .expect("the planner answers");
    let mut client = BacklogClient::new(channel);
    let mut suggestions = Vec::new();
    for title in ["Fix the login redirect", "Fix the login timeout"] {
        let added = client
            .add_task(v1::AddTaskRequest {
                project: "default".into(),
                fields: Some(v1::BacklogTaskFields {
                    title: title.into(),
                    category: "bug".into(),
                    files: vec![v1::BacklogFile {
                        path: "src/auth/login.rs".into(),
                        operation: "UPDATE".into(),
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("the task is added")
            .into_inner();
        suggestions.extend(added.suggestions);
    }
    assert_eq!(suggestions.len(), 1, "{suggestions:?}");
    suggestions[0].id.clone()
}

#[tokio::test]
async fn the_backlog_is_read_and_a_suggestion_accepted_once_with_the_token() {
    let dev = start_dev();
    let id = two_related_tasks(&dev).await;
    let (status, backlog) = get(&format!("{}/api/backlog", dev.monitor)).await;
    assert_eq!(status, 200, "{backlog}");
    assert_eq!(backlog["tasks"].as_array().map(Vec::len), Some(2));
    assert_eq!(backlog["suggestions"][0]["id"], id.as_str());
    assert_eq!(backlog["suggestions"][0]["tasks"], json!([1, 2]));

    let accept = format!("{}/api/backlog/suggestions/{id}/accept", dev.monitor);
    let (status, refused) = post(&accept, None, json!({})).await;
    assert_eq!(status, 401, "{refused}");
    let (_, unchanged) = get(&format!("{}/api/backlog", dev.monitor)).await;
    assert_eq!(unchanged["suggestions"].as_array().map(Vec::len), Some(1));

    let (status, accepted) = post(&accept, Some(TOKEN), json!({"list": "login"})).await;
    assert_eq!(status, 200, "{accepted}");
    assert_eq!(accepted["list"]["name"], "login");
    assert_eq!(accepted["list"]["total_tasks"], 2);
    let (status, again) = post(&accept, Some(TOKEN), json!({})).await;
    assert_eq!(status, 409, "{again}");
    let (_, after) = get(&format!("{}/api/backlog", dev.monitor)).await;
    assert_eq!(after["suggestions"], Value::Array(Vec::new()));
    assert!(
        after["tasks"]
            .as_array()
            .is_some_and(|tasks| tasks.iter().all(|t| t["list"] == "login")),
        "{after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_accepts_a_suggestion_from_the_backlog_page() {
    let driver = start_driver();
    let dev = start_dev();
    let id = two_related_tasks(&dev).await;
    let client = browser_with_token(&driver, &dev.monitor).await;
    client
        .goto(&format!("{}/#/backlog", dev.monitor))
        .await
        .expect("the backlog page opens");
    let suggestion = format!("[data-suggestion=\"{id}\"]");
    wait_page(
        &client,
        "the suggestion is shown",
        Duration::from_secs(20),
        || async { client.find(Locator::Css(&suggestion)).await.is_ok() },
    )
    .await;
    let queued = client
        .execute(
            "return document.querySelectorAll('#queue-table [data-task]').length",
            vec![],
        )
        .await
        .expect("the page answers");
    assert_eq!(queued, json!(2), "both tasks wait in the evaluation queue");
    screenshot(&client, "backlog").await;
    click(&client, &format!("{suggestion} [data-action=accept]")).await;
    wait_page(
        &client,
        "the accepted suggestion's list is shown",
        Duration::from_secs(20),
        || async {
            client
                .find(Locator::Css("#lists-table [data-list]"))
                .await
                .is_ok()
                && client.find(Locator::Css(&suggestion)).await.is_err()
        },
    )
    .await;
    let queued = client
        .execute(
            "return document.querySelectorAll('#queue-table [data-task]').length",
            vec![],
        )
        .await
        .expect("the page answers");
    assert_eq!(queued, json!(0), "the tasks left the queue for the list");
}
