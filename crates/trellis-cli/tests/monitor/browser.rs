//! The UI in real headless Chromium, driven over WebDriver (chromedriver): open an execution,
//! watch its tasks change state live, pause it, answer its question, and see it finish.
//! Screenshots are written to `<target>/tmp/monitor-screenshots/`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use trellis_proto::v1;

use crate::{TOKEN, eventually, start_dev};

/// Four one-second tasks side by side, then a question, then one last task.
const PLAN: &str = "name: monitor-browser\ntasks:\n\
    - {id: build-a, type: sleep, input: {ms: 1500}}\n\
    - {id: build-b, type: sleep, input: {ms: 1500}}\n\
    - {id: build-c, type: sleep, input: {ms: 1500}}\n\
    - {id: build-d, type: sleep, input: {ms: 1500}}\n\
    - {id: approve, type: question, depends_on: [build-a, build-b, build-c, build-d], \
       input: {text: Release the build?, options: [release, hold]}}\n\
    - {id: publish, type: sleep, depends_on: [approve], input: {ms: 300}}\n";

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
async fn browser_watches_pauses_and_answers() {
    let driver = start_driver();
    let dev = start_dev();
    let id = dev.start(PLAN).await;
    let client = browser(&driver).await;
    let page = format!("{}/#/executions/{id}", dev.monitor);

    // Without the token the page shows the execution, but pausing is refused and changes nothing.
    client.goto(&page).await.expect("the page opens");
    client
        .execute("localStorage.removeItem('trellis.token')", vec![])
        .await
        .expect("the token is forgotten");
    client.goto(&page).await.expect("the page opens again");
    eventually(
        "a build task runs, live",
        Duration::from_secs(20),
        || async { node_state(&client, "build-a").await == "running" },
    )
    .await;
    screenshot(&client, "1-running").await;
    let before = dev.execution(&id).await;
    click(&client, "#btn-pause").await;
    eventually("the refusal is shown", Duration::from_secs(10), || async {
        text(&client, "#control-error").await.contains("token")
    })
    .await;
    screenshot(&client, "2-refused-without-token").await;
    let after = dev.execution(&id).await;
    assert_ne!(after.state, v1::ExecutionState::Paused as i32);
    assert!(
        after.reason.is_empty() && before.reason.is_empty(),
        "a refused pause left a reason: {}",
        after.reason
    );

    // With the token (from the address, as `trellis dev` prints it): pause, then resume.
    client
        .goto(&format!("{}/?token={TOKEN}#/executions/{id}", dev.monitor))
        .await
        .expect("the page opens with the token");
    eventually(
        "the controls are ready",
        Duration::from_secs(10),
        || async { text(&client, "#execution-state").await == "running" },
    )
    .await;
    click(&client, "#btn-pause").await;
    eventually(
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

    // The question appears; answering it resumes the task and the execution completes.
    let form = "#questions form.answer";
    eventually("the question is shown", Duration::from_secs(30), || async {
        client.find(Locator::Css(form)).await.is_ok()
    })
    .await;
    assert_eq!(node_state(&client, "build-d").await, "completed");
    screenshot(&client, "4-question").await;
    let select = client
        .find(Locator::Css(&format!("{form} select[name=answer]")))
        .await
        .expect("a select of the options");
    select
        .select_by_value("release")
        .await
        .expect("the option is chosen");
    click(&client, &format!("{form} button[type=submit]")).await;
    eventually(
        "the task resumes and the execution completes",
        Duration::from_secs(30),
        || async {
            text(&client, "#execution-state").await == "completed"
                && node_state(&client, "publish").await == "completed"
        },
    )
    .await;
    assert_eq!(node_state(&client, "approve").await, "completed");
    screenshot(&client, "5-completed").await;
    // The whole page: timeline, tree, event log and checkpoints below the fold.
    client
        .set_window_size(1280, 3200)
        .await
        .expect("the window grows");
    screenshot(&client, "6-whole-page").await;
    client
        .goto(&format!("{}/#/workers", dev.monitor))
        .await
        .expect("the workers page opens");
    eventually("the worker is listed", Duration::from_secs(10), || async {
        client
            .find(Locator::Css("tr[data-worker-id]"))
            .await
            .is_ok()
    })
    .await;
    screenshot(&client, "7-workers").await;
    client
        .goto(&format!("{}/#/", dev.monitor))
        .await
        .expect("the executions list opens");
    let row = format!("tr[data-execution-id=\"{id}\"]");
    eventually(
        "the execution is listed",
        Duration::from_secs(10),
        || async { client.find(Locator::Css(&row)).await.is_ok() },
    )
    .await;
    screenshot(&client, "8-executions").await;
    assert_eq!(
        dev.execution(&id).await.state,
        v1::ExecutionState::Completed as i32
    );
    client.close().await.expect("the browser closes");
}
