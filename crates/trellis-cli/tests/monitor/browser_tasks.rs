//! The UI in real headless Chromium, as `browser`: a task's log lines live, the task drawer from
//! each of the four places it opens from, a 2,000-member group paged to member 1,200, the tree
//! and events filtered to a failure, and an unknown execution's page.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::json;
use trellis_proto::v1;

use crate::page::{
    browser_with_token, choose, click, screenshot, start_driver, tab, text, type_into, wait_page,
};
use crate::start_dev;

/// A `shell` task that prints a line every 100 ms for three seconds, then `done`.
const TICKING_PLAN: &str = "name: monitor-live-logs\ntasks:\n\
    - {id: tick, type: shell, input: {command: [sh, -c, 'i=0; while [ $i -lt 30 ]; do echo tick $i; \
      i=$((i+1)); sleep 0.1; done; echo done']}}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_reads_a_task_in_full_and_finds_things_in_big_runs() {
    let driver = start_driver();
    let dev = start_dev();
    let client = browser_with_token(&driver, &dev.monitor).await;

    // A task's log lines arrive in the page while it runs, each once and in order.
    let ticking = dev.start(TICKING_PLAN).await;
    client
        .goto(&format!("{}/#/executions/{ticking}", dev.monitor))
        .await
        .expect("the third execution's page opens");
    let log_texts = || async {
        let texts = client
            .execute(
                "return [...document.querySelectorAll('#task-logs .log-line .text')]\
                 .map((line) => line.textContent)",
                vec![],
            )
            .await
            .expect("the page answers");
        serde_json::from_value::<Vec<String>>(texts).expect("a list of texts")
    };
    wait_page(
        &client,
        "a first log line",
        Duration::from_secs(30),
        || async { !log_texts().await.is_empty() },
    )
    .await;
    assert_eq!(
        dev.execution(&ticking).await.state,
        v1::ExecutionState::Running as i32,
        "the first line is shown while the task runs"
    );
    wait_page(
        &client,
        "the execution completes with its last line shown",
        Duration::from_secs(60),
        || async {
            text(&client, "#execution-state").await == "completed"
                && log_texts().await.last().is_some_and(|last| last == "done")
        },
    )
    .await;
    let mut expected: Vec<String> = (0..30).map(|n| format!("tick {n}")).collect();
    expected.push("done".to_owned());
    assert_eq!(log_texts().await, expected);
    screenshot(&client, "8-task-logs").await;

    // The task drawer, from each of the four places: a DAG node, a tree line, an event row and a
    // timeline bar. It shows the input, the attempt with its worker and times, and the log.
    let drawer_title = || async { text(&client, "#task-drawer:not([hidden]) #drawer-title").await };
    let close_drawer = || async { click(&client, "#task-drawer .drawer-close").await };
    tab(&client, "graph").await;
    click(&client, "#dag g.node[data-task-id=\"tick\"]").await;
    wait_page(
        &client,
        "the drawer shows the task's input, attempt and log",
        Duration::from_secs(10),
        || async {
            drawer_title().await == "tick"
                && text(&client, "#drawer-input").await.contains("tick $i")
                && text(&client, "#drawer-attempts")
                    .await
                    .contains("attempt 1 on ")
                && text(&client, "#drawer-logs").await.contains("tick 29")
                && !text(&client, "#task-drawer").await.contains("null")
        },
    )
    .await;
    screenshot(&client, "9-drawer").await;
    close_drawer().await;
    wait_page(
        &client,
        "the drawer closes",
        Duration::from_secs(5),
        || async { drawer_title().await.is_empty() },
    )
    .await;
    tab(&client, "overview").await;
    let tree_line = client
        .find_all(Locator::Css(".tree-line"))
        .await
        .expect("tree lines");
    let mut opened = false;
    for line in tree_line {
        if line.text().await.unwrap_or_default().contains("tick") {
            line.click().await.expect("the tree line is clicked");
            opened = true;
            break;
        }
    }
    assert!(opened, "a tree line for tick");
    wait_page(
        &client,
        "the drawer from the tree",
        Duration::from_secs(10),
        || async { drawer_title().await == "tick" },
    )
    .await;
    close_drawer().await;
    click(&client, "#event-list .event[data-kind=task_completed]").await;
    wait_page(
        &client,
        "the drawer from the event log",
        Duration::from_secs(10),
        || async { drawer_title().await == "tick" },
    )
    .await;
    close_drawer().await;
    tab(&client, "timeline").await;
    // The chart is painted on the frame after the tab shows: until then the canvas has its
    // default size and rows sit elsewhere, so wait for the painted, laid-out chart.
    wait_page(
        &client,
        "the timeline is painted with its rows",
        Duration::from_secs(10),
        || async {
            let painted = client
                .execute(
                    "const c = document.getElementById('timeline-canvas');\
                     return c != null && c.style.height !== '' \
                     && c.getBoundingClientRect().height === c.parentElement.clientHeight;",
                    vec![],
                )
                .await
                .ok()
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            painted && text(&client, "#timeline-info").await.ends_with("instances")
        },
    )
    .await;
    let canvas = client
        .find(Locator::Css("#timeline-canvas"))
        .await
        .expect("the timeline");
    let mut from_timeline = String::new();
    for row in 0..3 {
        use fantoccini::actions::{InputSource, MOUSE_BUTTON_LEFT, MouseActions, PointerAction};
        let (_, _, _, height) = canvas.rectangle().await.expect("its size");
        // Rows are 18 px under a 26 px axis; the bar spans the middle of the time axis.
        let y = -height / 2.0 + 26.0 + 18.0 * f64::from(row) + 9.0;
        let press = MouseActions::new("mouse".to_owned())
            .then(PointerAction::MoveToElement {
                element: canvas.clone(),
                duration: None,
                x: 0.0,
                y,
            })
            .then(PointerAction::Down {
                button: MOUSE_BUTTON_LEFT,
            })
            .then(PointerAction::Up {
                button: MOUSE_BUTTON_LEFT,
            });
        client.perform_actions(press).await.expect("a click");
        // The drawer names a known instance as it opens; give the click's events time to land.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            from_timeline = drawer_title().await;
            if !from_timeline.is_empty() || tokio::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if from_timeline == "tick" {
            break;
        }
        if !from_timeline.is_empty() {
            close_drawer().await;
        }
    }
    assert_eq!(from_timeline, "tick", "the drawer from a timeline bar");
    close_drawer().await;

    // A 2,000-member fan-out: the tree pages through the group and jumps to member 1,200.
    let fanout = dev
        .start(
            "name: big-fanout\ntasks:\n- {id: split, type: fanout, \
             input: {count: 2000, child: {type: noop, input: {}}}}\n",
        )
        .await;
    client
        .goto(&format!("{}/#/executions/{fanout}", dev.monitor))
        .await
        .expect("the fan-out's page opens");
    let pager_info = || async { text(&client, ".tree-pager .tree-page-info").await };
    wait_page(
        &client,
        "the group's pager",
        Duration::from_secs(30),
        || async { pager_info().await.starts_with("members 1–50 of 2000") },
    )
    .await;
    let jump = |value: &'static str| {
        let client = &client;
        async move {
            let input = client
                .find(Locator::Css(".tree-pager .tree-jump"))
                .await
                .expect("the jump field");
            input.clear().await.expect("cleared");
            input.send_keys(value).await.expect("typed");
            click(client, ".tree-pager .tree-jump-go").await;
        }
    };
    jump("5000").await;
    wait_page(
        &client,
        "a member past the end is refused",
        Duration::from_secs(5),
        || async {
            text(&client, ".tree-pager .tree-jump-error").await == "enter a member from 1 to 2000"
        },
    )
    .await;
    jump("1200").await;
    wait_page(
        &client,
        "member 1,200 is shown",
        Duration::from_secs(10),
        || async { pager_info().await.starts_with("members 1200–1249 of 2000") },
    )
    .await;
    click(&client, ".tree-pager .tree-page-next").await;
    wait_page(&client, "the next 50", Duration::from_secs(10), || async {
        pager_info().await.starts_with("members 1250–1299 of 2000")
    })
    .await;
    screenshot(&client, "9-fanout-paged").await;

    // Finding the failure: the tree filtered by state and name, the events by "failures only".
    let failing = dev
        .start(
            "name: mixed\ntasks:\n- {id: fine, type: noop}\n\
             - {id: broken, type: fail, input: {times: 99}}\n",
        )
        .await;
    client
        .goto(&format!("{}/#/executions/{failing}", dev.monitor))
        .await
        .expect("the failing execution's page opens");
    wait_page(
        &client,
        "the execution fails",
        Duration::from_secs(60),
        || async { text(&client, "#execution-state").await == "failed" },
    )
    .await;
    choose(&client, "#tree-state-filter", "failed").await;
    type_into(&client, "#tree-name-filter", "BRO").await;
    wait_page(
        &client,
        "only the failed task is listed",
        Duration::from_secs(10),
        || async { text(&client, "#tree .tree-filter-count").await == "1 matching" },
    )
    .await;
    let listed = client
        .execute(
            "return [...document.querySelectorAll('#tree-body .tree-line')]\
             .map((line) => line.querySelector('.task-id').textContent + ':' + line.dataset.state)",
            vec![],
        )
        .await
        .expect("the page answers");
    assert_eq!(listed, json!(["broken:failed"]), "the filtered tree");
    click(&client, "#events-failures-only").await;
    let shown = client
        .execute(
            "return [...document.querySelectorAll('#event-list .event')]\
             .filter((row) => row.offsetParent !== null).map((row) => row.dataset.kind)",
            vec![],
        )
        .await
        .expect("the page answers");
    let kinds: Vec<String> = serde_json::from_value(shown).expect("kinds");
    assert!(
        kinds.contains(&"task_failed".to_owned())
            && kinds.last().map(String::as_str) == Some("execution_finished")
            && kinds
                .iter()
                .all(|k| k == "task_failed" || k == "execution_finished"),
        "failures only, the run's failed end among them: {kinds:?}"
    );
    // The event log by task id, and the timeline by state and task id.
    type_into(&client, "#events-name-filter", "fine").await;
    click(&client, "#events-failures-only").await;
    let about = client
        .execute(
            "return [...document.querySelectorAll('#event-list .event')]             .filter((row) => row.offsetParent !== null)             .map((row) => row.querySelector('.inst').textContent)",
            vec![],
        )
        .await
        .expect("the page answers");
    let about: Vec<String> = serde_json::from_value(about).expect("task ids");
    assert!(
        !about.is_empty() && about.iter().all(|task| task == "fine"),
        "only the events of `fine`: {about:?}"
    );
    screenshot(&client, "9-filtered").await;
    tab(&client, "timeline").await;
    wait_page(
        &client,
        "the timeline lists the run's root and its two tasks",
        Duration::from_secs(10),
        || async { text(&client, "#timeline-info").await == "3 instances" },
    )
    .await;
    choose(&client, "#timeline-state-filter", "failed").await;
    wait_page(
        &client,
        "the timeline keeps the failed instances (the root and `broken`)",
        Duration::from_secs(10),
        || async { text(&client, "#timeline-info").await == "2 of 3 instances match" },
    )
    .await;
    type_into(&client, "#timeline-name-filter", "BRO").await;
    wait_page(
        &client,
        "the failed instance of `broken`",
        Duration::from_secs(10),
        || async { text(&client, "#timeline-info").await == "1 of 3 instances match" },
    )
    .await;

    // An execution that does not exist: one page that says so, no panes, no error banner.
    client
        .goto(&format!(
            "{}/#/executions/0190a5c4-7d1e-7000-8000-0000000000ff",
            dev.monitor
        ))
        .await
        .expect("the unknown execution's page opens");
    wait_page(
        &client,
        "the not-found page",
        Duration::from_secs(10),
        || async { text(&client, "#not-found h2").await == "Execution not found" },
    )
    .await;
    // Give late answers a moment to (wrongly) bring panes or banners back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        client.find(Locator::Css("#execution-state")).await.is_err(),
        "no execution header on the not-found page"
    );
    let banner = client
        .execute("return document.getElementById('banner').hidden", vec![])
        .await
        .expect("the page answers");
    assert_eq!(
        banner,
        json!(true),
        "no error banner beside the not-found page"
    );
    screenshot(&client, "9-not-found").await;
    client.close().await.expect("the browser closes");
}

/// A plan's history grid: from the plan name in the list to the grid, where the failed run's cell
/// of the flaky task is red and opens that run; the list marks an execution waiting for an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_finds_the_failed_run_in_a_plans_history() {
    let driver = start_driver();
    let dev = start_dev();
    let runs = crate::history::three_nightly_runs(&dev).await;
    let asking = dev
        .start(
            "name: needs-an-answer\ntasks:\n\
             - {id: ask, type: question, input: {text: Go?, options: [yes, no]}}\n",
        )
        .await;
    let client = browser_with_token(&driver, &dev.monitor).await;

    let badge = format!("tr[data-execution-id=\"{asking}\"] .qbadge");
    wait_page(
        &client,
        "the asking execution has a question badge",
        Duration::from_secs(30),
        || async { text(&client, &badge).await == "question" },
    )
    .await;
    let quiet = format!("tr[data-execution-id=\"{}\"] .qbadge", runs[0]);
    assert_eq!(
        text(&client, &quiet).await,
        "",
        "no badge on a finished run"
    );
    screenshot(&client, "12-list-with-question-badge").await;

    click(
        &client,
        &format!("tr[data-execution-id=\"{}\"] a.plan-link", runs[0]),
    )
    .await;
    let failed_cell = format!(
        "#history-table tr[data-task-id=\"flaky\"] a.cell[data-state=\"failed\"][data-execution-id=\"{}\"]",
        runs[1]
    );
    wait_page(
        &client,
        "the failed run's flaky cell is red",
        Duration::from_secs(30),
        || async { client.find(Locator::Css(&failed_cell)).await.is_ok() },
    )
    .await;
    let states = client
        .execute(
            "return [...document.querySelectorAll('#history-table tr[data-task-id=\"flaky\"] a.cell')]\
             .map((cell) => cell.dataset.state)",
            vec![],
        )
        .await
        .expect("the page answers");
    assert_eq!(
        states,
        json!(["completed", "failed", "completed"]),
        "newest first, the middle run failed"
    );
    assert_eq!(text(&client, "#history-plan").await, "Nightly-Build");
    screenshot(&client, "12-plan-history").await;

    click(&client, &failed_cell).await;
    wait_page(
        &client,
        "the failed run opens",
        Duration::from_secs(20),
        || async { text(&client, "#execution-state").await == "failed" },
    )
    .await;
    let hash = client
        .execute("return location.hash", vec![])
        .await
        .expect("the page answers");
    assert_eq!(hash, json!(format!("#/executions/{}", runs[1])));
    client.close().await.expect("the browser closes");
}
