//! `trellis dev` for the end-to-end tests: its own NATS server, coordinator, workers,
//! checkpoint-store and planner on SQLite, stopped on drop; and the `trellis` binary run against
//! it.

#![allow(dead_code)] // Each test crate uses its own part.

use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

pub const TRELLIS: &str = env!("CARGO_BIN_EXE_trellis");

/// `trellis dev`, stopped on drop, and its addresses.
pub struct Dev {
    pub child: Child,
    pub coordinator: String,
    pub planner: String,
    /// Where the planner takes answers from notification sinks (`http://host:port`).
    pub hooks: String,
    /// What `trellis dev` has written to its stderr since its banner, for failure messages.
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SIGTERM: it stops its nats-server and removes its stores.
        trellis_testkit::terminate(&mut self.child);
    }
}

/// The text after `marker` in `line`, up to the first `,` or space.
fn after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = line.split(marker).nth(1)?;
    rest.split([',', ' ']).next()
}

impl Dev {
    pub fn start() -> Dev {
        let mut child = Command::new(TRELLIS)
            .args([
                "dev",
                "--listen",
                "127.0.0.1:0",
                "--monitor",
                "127.0.0.1:0",
                "--workers",
                "1",
                "--admin-addr",
                "off",
            ])
            .env_remove("NATS_URL")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("trellis dev starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (lines, received) = std::sync::mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut started = false;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                // Until the banner the lines go to `start`; after it, to the log a failed
                // command shows (the planner or a worker stopping says why there).
                if started {
                    if let Ok(mut log) = keep.lock() {
                        log.push(line);
                    }
                } else {
                    started = line.contains("hooks: ");
                    let _ = lines.send(line);
                }
            }
        });
        let mut seen = Vec::new();
        let (mut coordinator, mut planner) = (None, None);
        let hooks = loop {
            let Ok(line) = received.recv_timeout(Duration::from_secs(60)) else {
                let _ = child.kill();
                panic!(
                    "trellis dev did not start within 60 s:\n{}",
                    seen.join("\n")
                );
            };
            if let Some(url) = after(&line, "coordinator at ") {
                coordinator = Some(url.to_owned());
            }
            if let Some(url) = after(&line, "planner at ") {
                planner = Some(url.to_owned());
            }
            if let Some(url) = after(&line, "hooks: ") {
                break url.to_owned();
            }
            seen.push(line);
        };
        Dev {
            child,
            coordinator: coordinator.expect("the banner names the coordinator"),
            planner: planner.expect("the banner names the planner"),
            hooks,
            log,
        }
    }

    /// Runs `trellis ARGS` against this cluster; returns the exit code, stdout and stderr.
    pub fn trellis(&self, args: &[&str]) -> (i32, String, String) {
        let output = Command::new(TRELLIS)
            .args(args)
            .env("TRELLIS_PLANNER", &self.planner)
            .env("TRELLIS_COORDINATOR", &self.coordinator)
            .env_remove("TRELLIS_PROJECT")
            .output()
            .expect("trellis runs");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Runs `trellis ARGS`, which must succeed, and returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.trellis(args);
        assert_eq!(
            code,
            0,
            "trellis {args:?} failed:\n{stdout}\n{stderr}\ntrellis dev's log:\n{}",
            self.log()
        );
        stdout
    }

    /// What `trellis dev` has written to its stderr since its banner.
    pub fn log(&self) -> String {
        self.log
            .lock()
            .map(|lines| lines.join("\n"))
            .unwrap_or_default()
    }

    /// Runs `trellis ARGS --json`, which must succeed, and parses its output.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let stdout = self.ok(&args);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }
}
