//! The UI in real headless Chromium, driven over WebDriver (chromedriver): open an execution,
//! watch its tasks change state live, pause, resume and cancel it; answer another one's question
//! and see it finish; read a third one's task log lines live. Screenshots are written to
//! `<target>/tmp/monitor-screenshots/`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use trellis_proto::v1;

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

/// A `shell` task that prints a line every 100 ms for three seconds, then `done`.
const TICKING_PLAN: &str = "name: monitor-live-logs\ntasks:\n\
    - {id: tick, type: shell, input: {command: [sh, -c, 'i=0; while [ $i -lt 30 ]; do echo tick $i; \
      i=$((i+1)); sleep 0.1; done; echo done']}}\n";

const INSTALL: &str =
    "install Chromium and its driver: apt-get install -y chromium chromium-driver";

/// A chromedriver process on a free port; killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_driver() -> Driver {
    let binary = ["chromedriver", "/usr/bin/chromedriver"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        })
        .unwrap_or_else(|| panic!("no chromedriver found: {INSTALL}"));
    let port = trellis_testkit::free_port().expect("a free port");
    let driver = Driver {
        child: Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("chromedriver does not start ({e}): {INSTALL}")),
        url: format!("http://127.0.0.1:{port}"),
    };
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return driver;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("chromedriver did not listen on port {port}: {INSTALL}");
}

async fn browser(driver: &Driver) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-dev-shm-usage",
                "--window-size=1280,900",
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .unwrap_or_else(|e| panic!("cannot open a Chromium session ({e}): {INSTALL}"))
}

fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("monitor-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).expect("the screenshot is written");
    eprintln!("screenshot: {}", path.display());
}

/// The text of the first element matching `css`, or empty when there is none.
async fn text(client: &Client, css: &str) -> String {
    match client.find(Locator::Css(css)).await {
        Ok(element) => element.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The `data-state` of the DAG node of `task`.
async fn node_state(client: &Client, task: &str) -> String {
    let css = format!("#dag [data-task-id=\"{task}\"]");
    match client.find(Locator::Css(&css)).await {
        Ok(element) => element
            .attr("data-state")
            .await
            .ok()
            .flatten()
            .unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Polls `condition` every 50 ms; after `timeout` saves a screenshot named after `what` and fails
/// with what the page shows.
async fn wait_page<F, Fut>(client: &Client, what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !condition().await {
        if tokio::time::Instant::now() > deadline {
            screenshot(client, &format!("failed-{}", what.replace(' ', "-"))).await;
            panic!(
                "{what}: still not so after {timeout:?}; the page shows state {:?}, control error \
                 {:?}, banner {:?}, live {:?}",
                text(client, "#execution-state").await,
                text(client, "#control-error").await,
                text(client, "#banner").await,
                text(client, "#live-status").await,
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
}

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
    let canvas = client
        .find(Locator::Css("#timeline-canvas"))
        .await
        .expect("the timeline");
    let (_, _, _, height) = canvas.rectangle().await.expect("its size");
    let mut from_timeline = String::new();
    for row in 0..3 {
        use fantoccini::actions::{InputSource, MOUSE_BUTTON_LEFT, MouseActions, PointerAction};
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
        tokio::time::sleep(Duration::from_millis(300)).await;
        from_timeline = drawer_title().await;
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
    client
        .find(Locator::Css("#tree-state-filter"))
        .await
        .expect("the state filter")
        .select_by_value("failed")
        .await
        .expect("failed chosen");
    client
        .find(Locator::Css("#tree-name-filter"))
        .await
        .expect("the name filter")
        .send_keys("BRO")
        .await
        .expect("typed");
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
    screenshot(&client, "9-filtered").await;

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
