//! The monitor end to end: `trellis dev` as a child process (coordinator, checkpoint-store,
//! workers and the monitor) on a private nats-server; its JSON API and live stream read over HTTP,
//! its UI driven in headless Chromium.

mod api;
mod backlog;
mod browser;
mod browser_dag;
mod browser_tasks;
mod history;
mod outputs;
mod page;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tonic::transport::Channel;
use trellis_proto::v1;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_testkit::NatsServer;

const TRELLIS: &str = env!("CARGO_BIN_EXE_trellis");

/// The token the monitor of [`Dev`] requires.
pub const TOKEN: &str = "test-token-7f3a";

/// A `trellis dev` process and the addresses it printed; stopped on drop.
#[derive(Debug)]
pub struct Dev {
    child: Child,
    pub coordinator: String,
    pub monitor: String,
    pub planner: String,
    pub nats: NatsServer,
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: it removes its SQLite store from the temporary directory, where
        // a later `trellis dev` of the same process number would otherwise find it.
        trellis_testkit::terminate(&mut self.child);
    }
}

/// Starts `trellis dev` on free ports with its own nats-server and waits for its addresses.
pub fn start_dev() -> Dev {
    start_dev_with(&[])
}

/// [`start_dev`] with more flags of `trellis dev`.
pub fn start_dev_with(flags: &[&str]) -> Dev {
    let nats =
        NatsServer::start().expect("a nats-server for the test (apt-get install nats-server)");
    let mut child = Command::new(TRELLIS)
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--monitor",
            "127.0.0.1:0",
            "--monitor-token",
            TOKEN,
            "--workers",
            "1",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .args(flags)
        .env("NATS_URL", nats.url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trellis dev starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let (lines, received) = mpsc::channel();
    // Reads stderr to its end, so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut coordinator = None;
    let mut monitor = None;
    let mut planner = None;
    let mut seen = Vec::new();
    while coordinator.is_none() || monitor.is_none() {
        let Ok(line) = received.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!(
                "trellis dev printed no addresses within 60 s; it said:\n{}",
                seen.join("\n")
            );
        };
        if let Some(rest) = line.split("coordinator at ").nth(1) {
            coordinator = rest.split(',').next().map(str::to_owned);
        }
        if let Some(rest) = line.split("planner at ").nth(1) {
            planner = rest.split(',').next().map(str::to_owned);
        }
        if let Some(rest) = line.trim().strip_prefix("monitor: ") {
            monitor = rest.split("/?").next().map(str::to_owned);
        }
        seen.push(line);
    }
    Dev {
        child,
        coordinator: coordinator.unwrap_or_default(),
        monitor: monitor.unwrap_or_default(),
        planner: planner.unwrap_or_default(),
        nats,
    }
}

impl Dev {
    pub async fn client(&self) -> CoordinatorClient<Channel> {
        CoordinatorClient::connect(self.coordinator.clone())
            .await
            .expect("the coordinator of trellis dev answers")
    }

    /// Starts the YAML plan `text` and returns the execution id.
    pub async fn start(&self, text: &str) -> String {
        self.client()
            .await
            .start_execution(v1::StartExecutionRequest {
                plan_source: Some(v1::start_execution_request::PlanSource::Spec(
                    v1::PlanSpec {
                        text: text.to_owned(),
                        format: v1::PlanFormat::Yaml as i32,
                        source_name: "monitor-test".to_owned(),
                        params: Default::default(),
                    },
                )),
                options: None,
            })
            .await
            .expect("the plan starts")
            .into_inner()
            .execution_id
    }

    /// The coordinator's view of an execution.
    pub async fn execution(&self, id: &str) -> v1::Execution {
        self.client()
            .await
            .get_execution(v1::GetExecutionRequest {
                execution_id: id.to_owned(),
            })
            .await
            .expect("the execution exists")
            .into_inner()
            .execution
            .expect("an execution in the answer")
    }
}
