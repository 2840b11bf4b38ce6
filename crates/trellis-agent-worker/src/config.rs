//! The worker's configuration.

use serde::Deserialize;
use trellis_bus::NatsOptions;
use trellis_telemetry::Telemetry;

/// Configuration of one worker process.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The NATS server, its credentials and TLS.
    #[serde(skip)]
    pub nats: NatsOptions,
    /// The queues to consume (`trellis.tasks.<queue>`).
    pub queues: Vec<String>,
    /// Handlers run at the same time, over all queues.
    pub slots: usize,
    /// The worker's id in heartbeats and results; `None` means `<host>-<pid>`.
    pub worker_id: Option<String>,
    /// Number of coordinator shards results are spread over.
    pub shards: u32,
    /// On shutdown, how long running handlers may take to finish before their tasks are handed back.
    pub shutdown_grace_ms: u64,
    /// A task message delivered more often than this without a result (each worker that took
    /// it died: a poison task) is not run again: its attempt fails with "worker lost <n> times"
    /// and the plan's failure policy decides. Deliveries handed back (shutdown, `avoid`) count.
    pub max_deliveries: u32,
    /// Outputs larger than this many bytes (UTF-8 JSON) are stored in the Object Store bucket
    /// `trellis_outputs` and reported by reference; a task whose output decides a `route:` keeps
    /// its output inline whatever its size.
    pub output_inline_limit: usize,
    /// Hand final results to the coordinator holding their shard directly (a core NATS request
    /// on `trellis.handoff.<shard>`) before the results stream: one message instead of a stored
    /// write and its delivery. A hand-off the coordinator does not confirm stored goes to the
    /// stream, so turning it off changes only the path, never what is stored.
    pub handoff: bool,
    /// Take assignments offered directly (a core NATS request on `trellis.offer.<queue>`) when
    /// a slot is free: the coordinator offers a small execution's tasks to an idle worker before
    /// the tasks stream. Off, the worker takes every task from the stream.
    pub offers: bool,
    /// Metrics and readiness ("worker": ready while it consumes its queues).
    #[serde(skip)]
    pub telemetry: Telemetry,
}

/// The queues of the built-in handlers.
pub const DEFAULT_QUEUES: [&str; 9] = [
    "noop", "sleep", "log", "fail", "fanout", "steps", "shell", "http", "question",
];

impl Default for Config {
    fn default() -> Config {
        Config {
            nats: NatsOptions::default(),
            queues: DEFAULT_QUEUES
                .iter()
                .map(|queue| (*queue).to_owned())
                .collect(),
            slots: 16,
            worker_id: None,
            shards: 1,
            shutdown_grace_ms: 10_000,
            max_deliveries: 10,
            output_inline_limit: trellis_bus::DEFAULT_INLINE_LIMIT,
            handoff: true,
            offers: true,
            telemetry: Telemetry::default(),
        }
    }
}

impl Config {
    /// Returns the default configuration for the NATS server at `nats_url`.
    pub fn new(nats_url: impl Into<String>) -> Config {
        Config {
            nats: NatsOptions::new(nats_url),
            ..Config::default()
        }
    }

    /// Checks the values, naming the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.slots == 0 {
            return Err("slots must be at least 1".to_owned());
        }
        if self.shards == 0 {
            return Err("shards must be at least 1".to_owned());
        }
        if self.max_deliveries == 0 {
            return Err("max_deliveries must be at least 1".to_owned());
        }
        if self.queues.is_empty() {
            return Err("queues must name at least one queue".to_owned());
        }
        for queue in &self.queues {
            if !is_subject_token(queue) {
                return Err(format!(
                    "queue {queue:?} is not a valid subject token (no empty name, `.`, `*`, `>` or whitespace)"
                ));
            }
        }
        if let Some(worker_id) = &self.worker_id
            && !is_subject_token(worker_id)
        {
            return Err(format!(
                "worker_id {worker_id:?} is not a valid subject token (no empty name, `.`, `*`, `>` or whitespace)"
            ));
        }
        Ok(())
    }

    /// Returns the configured worker id, or `<host>-<pid>`.
    pub fn resolved_worker_id(&self) -> String {
        match &self.worker_id {
            Some(worker_id) => worker_id.clone(),
            None => {
                let host: String = crate::sysinfo::host_name()
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                format!("{host}-{}", std::process::id())
            }
        }
    }
}

fn is_subject_token(token: &str) -> bool {
    !token.is_empty()
        && !token
            .chars()
            .any(|c| c == '.' || c == '*' || c == '>' || c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let config: Config = match serde_json::from_str(r#"{"slots": 4}"#) {
            Ok(config) => config,
            Err(error) => panic!("config should parse: {error}"),
        };
        assert_eq!(config.slots, 4);
        assert_eq!(config.queues.len(), DEFAULT_QUEUES.len());
        assert_eq!(config.shards, 1);
        assert!(config.validate().is_ok());
        assert!(serde_json::from_str::<Config>(r#"{"slot": 4}"#).is_err());
        for bad in [
            Config {
                slots: 0,
                ..Config::default()
            },
            Config {
                shards: 0,
                ..Config::default()
            },
            Config {
                queues: vec![],
                ..Config::default()
            },
            Config {
                queues: vec!["a.b".to_owned()],
                ..Config::default()
            },
            Config {
                worker_id: Some("w 1".to_owned()),
                ..Config::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert!(
            Config::default()
                .resolved_worker_id()
                .ends_with(&std::process::id().to_string())
        );
    }
}
