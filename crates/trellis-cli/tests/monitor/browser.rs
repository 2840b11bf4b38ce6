//! The UI in real headless Chromium (see `page`): open an execution, watch its tasks change state
//! live, pause, resume and cancel it; answer another one's question and see it finish.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::json;
use trellis_proto::v1;

use crate::page::{browser, click, node_state, screenshot, start_driver, tab, text, wait_page};
use crate::{TOKEN, start_dev};

/// Four tasks side by side that run far longer than the test needs, so the execution is still
/// running whenever the test presses a control; the test cancels it at the end.
const LONG_PLAN: &str = "name: monitor-controls\ntasks:\n\
    - {id: build-a, type: sleep, input: {ms: 60000}}\n\
    - {id: build-b, type: sleep, input: {ms: 60000}}\n\
    - {id: build-c, type: sleep, input: {ms: 60000}}\n\
    - {id: build-d, type: sleep, input: {ms: 60000}}\n\
    - {id: publish, type: noop, depends_on: [build-a, build-b, build-c, build-d]}\n";

/// A short build, a question, and one last task.
const QUESTION_PLAN: &str = "name: monitor-question\ntasks:\n\
    - {id: build, type: sleep, input: {ms: 300}}\n\
    - {id: approve, type: question, depends_on: [build], \
       input: {text: Release the build?, options: [release, hold]}}\n\
    - {id: publish, type: sleep, depends_on: [approve], input: {ms: 300}}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_watches_controls_and_answers() {
    let driver = start_driver();
    let dev = start_dev();
    let id = dev.start(LONG_PLAN).await;
    let client = browser(&driver).await;
    let page = format!("{}/#/executions/{id}", dev.monitor);

    // Without the token the page shows the execution, but pausing is refused and changes nothing.
    client.goto(&page).await.expect("the page opens");
    client
        .execute("localStorage.removeItem('trellis.token')", vec![])
        .await
        .expect("the token is forgotten");
    client.goto(&page).await.expect("the page opens again");
    wait_page(
        &client,
        "the build tasks run, live",
        Duration::from_secs(20),
        || async {
            node_state(&client, "build-a").await == "running"
                && node_state(&client, "build-d").await == "running"
        },
    )
    .await;
    assert_eq!(node_state(&client, "publish").await, "pending");
    let questions_hidden = client
        .execute("return document.getElementById('questions').hidden", vec![])
        .await
        .expect("the page answers");
    assert_eq!(
        questions_hidden,
        json!(true),
        "no questions card while nothing was asked"
    );
    let legend = text(&client, "#legend").await;
    assert!(
        legend.contains("waiting for subtasks") && !legend.contains('_'),
        "state names are written for people: {legend}"
    );
    wait_page(
        &client,
        "the event log names tasks, not instance ids",
        Duration::from_secs(10),
        || async {
            text(
                &client,
                "#event-list .event[data-kind=task_dispatched] .inst",
            )
            .await
            .starts_with("build-")
        },
    )
    .await;
    screenshot(&client, "1-running").await;
    // A heartbeat records each build's start (one `task_started` each, within 2 s): let them land
    // first, so the log stands still unless the pause writes to it.
    let started_by = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let graph = dev
            .client()
            .await
            .get_execution_graph(v1::GetExecutionGraphRequest {
                execution_id: id.clone(),
                run_number: 0,
            })
            .await
            .expect("the graph")
            .into_inner()
            .graph
            .unwrap_or_default();
        let started = graph
            .nodes
            .iter()
            .filter_map(|node| node.record.as_ref())
            .filter(|r| r.task_id.starts_with("build-") && r.worker_id.is_some())
            .count();
        if started == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < started_by,
            "only {started} of the 4 builds have a recorded start after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Without a token the controls are off and say why.
    let disabled = |css: &'static str| {
        let client = &client;
        async move {
            client
                .find(Locator::Css(css))
                .await
                .expect("the control is there")
                .attr("disabled")
                .await
                .expect("the page answers")
                .is_some()
        }
    };
    assert!(disabled("#btn-pause").await, "pause is off without a token");
    assert!(
        text(&client, "#controls-disabled-hint")
            .await
            .contains("token"),
        "the hint says to enter the token"
    );
    // A wrong token: the controls try, the refusal says so in plain words, once, and changes
    // nothing.
    let save_token = |value: &'static str| {
        let client = &client;
        async move {
            let input = client
                .find(Locator::Css("#token-input"))
                .await
                .expect("the token field");
            input.clear().await.expect("cleared");
            input.send_keys(value).await.expect("typed");
            click(client, "#token-form button").await;
        }
    };
    save_token("wrong-token").await;
    wait_page(
        &client,
        "pause is on with a token",
        Duration::from_secs(10),
        || async { !disabled("#btn-pause").await },
    )
    .await;
    let before = dev.execution(&id).await;
    click(&client, "#btn-pause").await;
    wait_page(
        &client,
        "the refusal is shown",
        Duration::from_secs(10),
        || async {
            text(&client, "#control-error")
                .await
                .contains("token was refused")
        },
    )
    .await;
    let banner = client
        .execute(
            "return document.getElementById('banner').textContent",
            vec![],
        )
        .await
        .expect("the page answers");
    assert!(
        !banner.as_str().unwrap_or_default().contains("refused"),
        "the refusal is not repeated in the banner: {banner}"
    );
    screenshot(&client, "2-refused-with-a-wrong-token").await;
    let after = dev.execution(&id).await;
    assert_eq!(after.state, v1::ExecutionState::Running as i32);
    assert_eq!(
        after.last_sequence, before.last_sequence,
        "a refused pause appended events"
    );
    // The right token: the refusal goes.
    save_token(TOKEN).await;
    wait_page(
        &client,
        "the refusal is cleared",
        Duration::from_secs(10),
        || async { text(&client, "#control-error").await.is_empty() },
    )
    .await;

    // With the token (from the address, as `trellis dev` prints it): pause, resume, cancel.
    client
        .goto(&format!("{}/?token={TOKEN}#/executions/{id}", dev.monitor))
        .await
        .expect("the page opens with the token");
    wait_page(
        &client,
        "the controls are ready",
        Duration::from_secs(10),
        || async { text(&client, "#execution-state").await == "running" },
    )
    .await;
    click(&client, "#btn-pause").await;
    wait_page(
        &client,
        "the page shows the pause",
        Duration::from_secs(10),
        || async { text(&client, "#execution-state").await == "paused" },
    )
    .await;
    assert_eq!(
        dev.execution(&id).await.state,
        v1::ExecutionState::Paused as i32,
        "the coordinator paused the execution"
    );
    screenshot(&client, "3-paused").await;
    click(&client, "#btn-resume").await;
    wait_page(
        &client,
        "the page shows the resume",
        Duration::from_secs(10),
        || async { text(&client, "#execution-state").await == "running" },
    )
    .await;
    click(&client, "#btn-cancel").await;
    wait_page(
        &client,
        "the page shows the cancel",
        Duration::from_secs(10),
        || async {
            text(&client, "#execution-state").await == "cancelled"
                && node_state(&client, "build-a").await == "cancelled"
        },
    )
    .await;
    assert_eq!(
        dev.execution(&id).await.state,
        v1::ExecutionState::Cancelled as i32
    );
    screenshot(&client, "4-cancelled").await;

    // Another execution asks a question; answering it in the page resumes the task and the
    // execution completes.
    let id = dev.start(QUESTION_PLAN).await;
    client
        .goto(&format!("{}/#/executions/{id}", dev.monitor))
        .await
        .expect("the second execution's page opens");
    let form = "#questions form.answer";
    wait_page(
        &client,
        "the question is shown",
        Duration::from_secs(30),
        || async { client.find(Locator::Css(form)).await.is_ok() },
    )
    .await;
    wait_page(
        &client,
        "the asking task waits",
        Duration::from_secs(10),
        || async { node_state(&client, "approve").await == "waiting_for_human" },
    )
    .await;
    assert_eq!(node_state(&client, "build").await, "completed");
    screenshot(&client, "5-question").await;
    let select = client
        .find(Locator::Css(&format!("{form} select[name=answer]")))
        .await
        .expect("a select of the options");
    select
        .select_by_value("release")
        .await
        .expect("the option is chosen");
    click(&client, &format!("{form} button[type=submit]")).await;
    wait_page(
        &client,
        "the task resumes and the execution completes",
        Duration::from_secs(30),
        || async {
            text(&client, "#execution-state").await == "completed"
                && node_state(&client, "publish").await == "completed"
        },
    )
    .await;
    assert_eq!(node_state(&client, "approve").await, "completed");
    // The header counts the task states, and nothing on the page threw on the way.
    let counts = text(&client, "#execution-counts").await;
    assert!(
        counts.contains("completed 4"),
        "the header's state counts: {counts:?}"
    );
    assert_eq!(text(&client, "#banner").await, "", "no error on the page");
    assert_eq!(
        text(&client, "#questions form.answer .control-ok").await,
        "answered: release",
        "the answer stays shown"
    );
    assert_eq!(
        dev.execution(&id).await.state,
        v1::ExecutionState::Completed as i32
    );
    screenshot(&client, "6-completed").await;
    // The asking task's drawer keeps the question with the answer given.
    tab(&client, "graph").await;
    click(&client, "#dag g.node[data-task-id=\"approve\"]").await;
    wait_page(
        &client,
        "the drawer shows the question and its answer",
        Duration::from_secs(10),
        || async {
            let questions = text(&client, "#drawer-questions").await;
            questions.contains("Release the build?") && questions.contains("answered: release")
        },
    )
    .await;
    click(&client, "#task-drawer .drawer-close").await;
    tab(&client, "overview").await;
    // The whole page: timeline, tree, event log and checkpoints below the fold.
    client
        .set_window_size(1280, 3200)
        .await
        .expect("the window grows");
    screenshot(&client, "7-whole-page").await;
    client
        .set_window_size(1280, 900)
        .await
        .expect("the window shrinks");

    // A question answered elsewhere (here through the API, as `trellis answer` does) stays in the
    // card with its answer instead of vanishing.
    let id = dev.start(QUESTION_PLAN).await;
    client
        .goto(&format!("{}/#/executions/{id}", dev.monitor))
        .await
        .expect("the third execution's page opens");
    wait_page(
        &client,
        "the question is shown",
        Duration::from_secs(30),
        || async { client.find(Locator::Css(form)).await.is_ok() },
    )
    .await;
    let question = dev
        .execution(&id)
        .await
        .open_questions
        .first()
        .and_then(|open| open.question.as_ref())
        .map(|q| q.question_id.clone())
        .expect("an open question");
    dev.client()
        .await
        .answer_question(v1::AnswerQuestionRequest {
            execution_id: id.clone(),
            question_id: question,
            answer: "hold".to_owned(),
            answered_by: "someone-else".to_owned(),
        })
        .await
        .expect("the question is answered through the API");
    wait_page(
        &client,
        "the answer given elsewhere is shown",
        Duration::from_secs(30),
        || async {
            text(&client, "#questions form.answer .control-ok").await == "answered elsewhere: hold"
                && text(&client, "#execution-state").await == "completed"
        },
    )
    .await;
    let submit_shown = client
        .execute(
            "return !document.querySelector('#questions form.answer button[type=submit]').hidden",
            vec![],
        )
        .await
        .expect("the page answers");
    assert_eq!(submit_shown, json!(false), "nothing left to submit");

    client
        .goto(&format!("{}/#/workers", dev.monitor))
        .await
        .expect("the workers page opens");
    wait_page(
        &client,
        "the worker is listed",
        Duration::from_secs(10),
        || async {
            client
                .find(Locator::Css("tr[data-worker-id]"))
                .await
                .is_ok()
        },
    )
    .await;
    screenshot(&client, "10-workers").await;
    client
        .goto(&format!("{}/#/cluster", dev.monitor))
        .await
        .expect("the cluster page opens");
    wait_page(
        &client,
        "the coordinator is listed with its shards",
        Duration::from_secs(10),
        || async {
            match client
                .find(Locator::Css("#cluster-table tr[data-coordinator-id]"))
                .await
            {
                Ok(row) => row
                    .text()
                    .await
                    .is_ok_and(|text| text.contains("(1)") || text.contains("shards")),
                Err(_) => false,
            }
        },
    )
    .await;
    client
        .goto(&format!("{}/#/", dev.monitor))
        .await
        .expect("the executions list opens");
    let row = format!("tr[data-execution-id=\"{id}\"]");
    wait_page(
        &client,
        "the execution is listed",
        Duration::from_secs(10),
        || async { client.find(Locator::Css(&row)).await.is_ok() },
    )
    .await;
    screenshot(&client, "11-executions").await;
    client.close().await.expect("the browser closes");
}
