//! How many messages a scenario stored in each JetStream stream: the streams' last sequences,
//! read before and after. With `--sync always` every stored message is one of the server's
//! syncs, and so is every removal from a work queue (a task or a result acknowledged), so these
//! counts say where a scenario's disk flushes went: `TRELLIS_TASKS` per task is one over the
//! mean assignments per message, `TRELLIS_RESULTS` the same for results, `TRELLIS_EVENTS` the
//! log appends, `KV_*` the buckets' writes (an execution's index entry and its delete).

use std::collections::BTreeMap;

use futures::TryStreamExt as _;
use serde_json::{Value, json};

use super::round;

/// Each stream's last sequence at one moment.
#[derive(Debug, Default, Clone)]
pub(super) struct Sequences(BTreeMap<String, u64>);

impl Sequences {
    /// Reads every stream's last sequence; a server that cannot be asked gives none.
    pub(super) async fn read(js: &async_nats::jetstream::Context) -> Self {
        let Ok(infos) = js.streams().try_collect::<Vec<_>>().await else {
            return Self::default();
        };
        Self(
            infos
                .into_iter()
                .map(|info| (info.config.name, info.state.last_sequence))
                .collect(),
        )
    }

    /// The field of a scenario's line: the messages each stream stored since `before`, per
    /// one of `n` tasks, for the streams that stored any; `null` when nothing could be read.
    pub(super) fn per_task_since(&self, before: &Self, n: usize) -> Value {
        if self.0.is_empty() || n == 0 {
            return Value::Null;
        }
        let mut field = serde_json::Map::new();
        for (name, last) in &self.0 {
            // A stream made during the scenario started at 0.
            let stored = last.saturating_sub(before.0.get(name).copied().unwrap_or(0));
            if stored > 0 {
                field.insert(name.clone(), json!(round(stored as f64 / n as f64, 4)));
            }
        }
        Value::Object(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequences(pairs: &[(&str, u64)]) -> Sequences {
        Sequences(pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
    }

    #[test]
    fn each_stream_counts_what_it_stored_per_task() {
        let before = sequences(&[("TRELLIS_TASKS", 100), ("TRELLIS_EVENTS", 7), ("IDLE", 3)]);
        let after = sequences(&[
            ("TRELLIS_TASKS", 150),
            ("TRELLIS_EVENTS", 17),
            ("IDLE", 3),
            ("NEW", 4),
        ]);
        assert_eq!(
            after.per_task_since(&before, 200),
            json!({"NEW": 0.02, "TRELLIS_EVENTS": 0.05, "TRELLIS_TASKS": 0.25})
        );
    }

    #[test]
    fn nothing_read_is_null() {
        let before = sequences(&[("TRELLIS_TASKS", 1)]);
        assert_eq!(
            Sequences::default().per_task_since(&before, 10),
            Value::Null
        );
        assert_eq!(
            sequences(&[("A", 2)]).per_task_since(&before, 0),
            Value::Null
        );
    }
}
