//! Driving the monitor in headless Chromium over WebDriver (chromedriver), for the browser tests:
//! a driver and a session, screenshots (written to `<target>/tmp/monitor-screenshots/`), and the
//! steps a test takes on a page — read, wait, click, choose, type, switch tabs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use crate::TOKEN;

const INSTALL: &str =
    "install Chromium and its driver: apt-get install -y chromium chromium-driver";

/// A chromedriver process on a free port; killed on drop.
pub(crate) struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start_driver() -> Driver {
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

pub(crate) async fn browser(driver: &Driver) -> Client {
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

pub(crate) async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).expect("the screenshot is written");
    eprintln!("screenshot: {}", path.display());
}

/// The text of the first element matching `css`, or empty when there is none.
pub(crate) async fn text(client: &Client, css: &str) -> String {
    match client.find(Locator::Css(css)).await {
        Ok(element) => element.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The `data-state` of the DAG node of `task`.
pub(crate) async fn node_state(client: &Client, task: &str) -> String {
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
pub(crate) async fn wait_page<F, Fut>(
    client: &Client,
    what: &str,
    timeout: Duration,
    mut condition: F,
) where
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

/// Shows the execution page's tab `name` (`overview`, `graph`, `timeline`, `logs`,
/// `checkpoints`) and waits for its pane.
pub(crate) async fn tab(client: &Client, name: &str) {
    click(client, &format!("#tab-{name}")).await;
    let pane = format!("#pane-{name}:not([hidden])");
    wait_page(
        client,
        &format!("the {name} tab"),
        Duration::from_secs(5),
        || async { client.find(Locator::Css(&pane)).await.is_ok() },
    )
    .await;
}

/// Chooses `value` in the select `css`.
pub(crate) async fn choose(client: &Client, css: &str, value: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
        .select_by_value(value)
        .await
        .unwrap_or_else(|e| panic!("cannot choose {value} in {css}: {e}"));
}

/// Types `keys` into the field `css`.
pub(crate) async fn type_into(client: &Client, css: &str, keys: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
        .send_keys(keys)
        .await
        .unwrap_or_else(|e| panic!("cannot type into {css}: {e}"));
}

/// A browser session on the monitor with its control token saved, on the executions list.
pub(crate) async fn browser_with_token(driver: &Driver, monitor: &str) -> Client {
    let client = browser(driver).await;
    // With the token in the address, as `trellis dev` prints it.
    client
        .goto(&format!("{monitor}/?token={TOKEN}#/"))
        .await
        .expect("the monitor opens with the token");
    client
}

pub(crate) async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
}
