//! Pauses that live outside any one execution: of a worker queue, a namespace or the whole fleet
//! (`PauseFleet`). They are kept in the NATS KV bucket `trellis_pauses` (`crate::pauses`), which
//! every coordinator watches and hands to its turn as [`Input::Pauses`](super::Input::Pauses).
//!
//! While one is in force, no instance it covers is dispatched ([`FleetPauses::holds`], read by
//! every decision); a pause in `preempt` mode also asks the attempts it covers that are running
//! when it arrives to stop at their next durable step. Nothing of this is in the executions' logs:
//! a pause of a namespace applies to executions started after it too, and lifting it writes
//! nothing either.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use trellis_core::machine::PauseMode;
use trellis_proto::v1;
use trellis_wire::log::pause_mode_to_proto;

use super::Coordinator;

/// What a fleet pause covers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// Every task published on this worker queue.
    Queue(String),
    /// Every execution of this namespace.
    Namespace(String),
    /// Everything.
    All,
}

impl Target {
    /// Returns the target's key in the bucket: `queue.<name>`, `namespace.<name>` or `all`.
    pub fn key(&self) -> String {
        match self {
            Self::Queue(queue) => format!("queue.{queue}"),
            Self::Namespace(namespace) => format!("namespace.{namespace}"),
            Self::All => "all".to_owned(),
        }
    }

    /// Reads a key of the bucket back; `None` for a key this version does not know.
    pub fn from_key(key: &str) -> Option<Self> {
        if key == "all" {
            return Some(Self::All);
        }
        let (kind, name) = key.split_once('.')?;
        match kind {
            "queue" => Some(Self::Queue(name.to_owned())),
            "namespace" => Some(Self::Namespace(name.to_owned())),
            _ => None,
        }
    }

    /// Checks a target named by a caller: a name that is empty, or that a bucket key cannot
    /// hold (letters, digits, `-`, `_`, `=`, `/` and `.`), is refused with why.
    pub fn check(&self) -> Result<(), String> {
        let (what, name) = match self {
            Self::All => return Ok(()),
            Self::Queue(name) => ("queue", name),
            Self::Namespace(name) => ("namespace", name),
        };
        if name.is_empty() {
            return Err(format!("target.{what}: empty; name the {what} to pause"));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "-_=/.".contains(*c)))
        {
            return Err(format!(
                "target.{what}: {name:?} holds {bad:?}; a {what} name is letters, digits, '-', '_', '=', '/' and '.'"
            ));
        }
        Ok(())
    }

    /// Returns true when the pause covers a task of `queue` in an execution of `namespace`.
    pub fn covers(&self, namespace: &str, queue: &str) -> bool {
        match self {
            Self::Queue(q) => q == queue,
            Self::Namespace(ns) => ns == namespace,
            Self::All => true,
        }
    }

    /// Returns the wire form.
    pub fn to_proto(&self) -> v1::PauseTarget {
        use v1::pause_target::Target as T;
        let target = match self {
            Self::Queue(queue) => T::Queue(queue.clone()),
            Self::Namespace(namespace) => T::Namespace(namespace.clone()),
            Self::All => T::All(true),
        };
        v1::PauseTarget {
            target: Some(target),
        }
    }

    /// Reads the wire form: exactly one of queue, namespace and `all: true`.
    pub fn from_proto(target: Option<&v1::PauseTarget>) -> Result<Self, String> {
        use v1::pause_target::Target as T;
        let target = match target.and_then(|t| t.target.as_ref()) {
            Some(T::Queue(queue)) => Self::Queue(queue.clone()),
            Some(T::Namespace(namespace)) => Self::Namespace(namespace.clone()),
            Some(T::All(true)) => Self::All,
            Some(T::All(false)) | None => {
                return Err(
                    "target: missing; set one of target.queue, target.namespace or target.all = true"
                        .to_owned(),
                );
            }
        };
        target.check()?;
        Ok(target)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Queue(queue) => write!(f, "queue {queue}"),
            Self::Namespace(namespace) => write!(f, "namespace {namespace}"),
            Self::All => f.write_str("the whole fleet"),
        }
    }
}

/// One pause as the bucket holds it (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub mode: PauseMode,
    pub reason: String,
    pub since_ms: u64,
    /// Who asked (the token's name).
    pub by: String,
}

/// The fleet pauses in force, as one coordinator last read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetPauses {
    pauses: BTreeMap<Target, Record>,
}

impl FleetPauses {
    /// Returns the pauses of `entries`, read from the bucket.
    pub fn new(entries: impl IntoIterator<Item = (Target, Record)>) -> Self {
        Self {
            pauses: entries.into_iter().collect(),
        }
    }

    /// Records what the bucket now holds for `target`: a pause, or none.
    pub fn set(&mut self, target: Target, record: Option<Record>) {
        match record {
            Some(record) => self.pauses.insert(target, record),
            None => self.pauses.remove(&target),
        };
    }

    /// Returns true when a pause holds back the tasks of `queue` in executions of `namespace`.
    pub fn holds(&self, namespace: &str, queue: &str) -> bool {
        self.pauses.keys().any(|t| t.covers(namespace, queue))
    }

    /// Returns the pauses in `preempt` mode that are new in `self` (or changed), compared with
    /// `before`: the ones whose running attempts are to be asked to stop.
    pub fn new_preemptions(&self, before: &FleetPauses) -> Vec<(Target, String)> {
        self.pauses
            .iter()
            .filter(|(target, record)| {
                record.mode == PauseMode::Preempt && before.pauses.get(*target) != Some(*record)
            })
            .map(|(target, record)| (target.clone(), record.reason.clone()))
            .collect()
    }

    /// Returns the pauses in their wire form.
    pub fn to_proto(&self) -> Vec<v1::FleetPause> {
        self.pauses
            .iter()
            .map(|(target, record)| record_to_proto(target, record))
            .collect()
    }
}

/// Returns the wire form of one pause.
pub fn record_to_proto(target: &Target, record: &Record) -> v1::FleetPause {
    v1::FleetPause {
        target: Some(target.to_proto()),
        mode: pause_mode_to_proto(record.mode) as i32,
        reason: record.reason.clone(),
        since_unix_ms: record.since_ms as i64,
        by: record.by.clone(),
    }
}

impl Coordinator {
    /// Takes the fleet pauses as last read: what they hold back is no longer dispatched from this
    /// turn on; the running attempts a new pause in `preempt` mode covers are asked to stop.
    pub(super) fn set_pauses(&mut self, pauses: Arc<FleetPauses>) {
        let preempt = pauses.new_preemptions(&self.pauses);
        self.pauses = pauses;
        let ids: Vec<_> = self.executions.keys().copied().collect();
        for id in ids {
            let Some(live) = self.executions.get_mut(&id) else {
                continue;
            };
            if live.machine.state().is_terminal() {
                continue;
            }
            for (target, reason) in &preempt {
                let running = live
                    .machine
                    .running_on(&|queue| target.covers(&live.namespace, queue));
                let reason = format!("{target} paused (preempt): {reason}");
                live.preempt
                    .extend(running.into_iter().map(|(i, a)| (i, a, reason.clone())));
            }
            // Decide again at once: a lifted pause dispatches what it held back.
            self.mark(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(mode: PauseMode) -> Record {
        Record {
            mode,
            reason: "maintenance".to_owned(),
            since_ms: 1,
            by: "ops".to_owned(),
        }
    }

    #[test]
    fn keys_round_trip_and_unknown_keys_are_skipped() {
        for target in [
            Target::Queue("gpu".into()),
            Target::Namespace("team-a".into()),
            Target::All,
        ] {
            assert_eq!(Target::from_key(&target.key()), Some(target));
        }
        assert_eq!(Target::from_key("worker.x"), None);
        assert_eq!(Target::from_key("queue"), None);
    }

    #[test]
    fn a_name_a_key_cannot_hold_is_refused_with_why() {
        let err = Target::Queue("gpu jobs".into()).check().unwrap_err();
        assert!(err.contains("target.queue") && err.contains("' '"), "{err}");
        let err = Target::Namespace(String::new()).check().unwrap_err();
        assert!(err.contains("empty"), "{err}");
        assert!(Target::from_proto(None).is_err());
        assert!(Target::Queue("build.linux".into()).check().is_ok());
    }

    #[test]
    fn holds_covers_queue_namespace_and_all() {
        let pauses = FleetPauses::new([
            (Target::Queue("gpu".into()), record(PauseMode::Drain)),
            (Target::Namespace("team-a".into()), record(PauseMode::Drain)),
        ]);
        assert!(pauses.holds("default", "gpu"));
        assert!(pauses.holds("team-a", "cpu"));
        assert!(!pauses.holds("default", "cpu"));
        let all = FleetPauses::new([(Target::All, record(PauseMode::Drain))]);
        assert!(all.holds("default", "cpu"));
        assert!(!FleetPauses::default().holds("default", "cpu"));
    }

    #[test]
    fn only_new_or_changed_preempting_pauses_preempt() {
        let before = FleetPauses::new([(Target::Queue("gpu".into()), record(PauseMode::Preempt))]);
        let after = FleetPauses::new([
            (Target::Queue("gpu".into()), record(PauseMode::Preempt)),
            (Target::Queue("cpu".into()), record(PauseMode::Drain)),
            (Target::All, record(PauseMode::Preempt)),
        ]);
        let fresh: Vec<Target> = after
            .new_preemptions(&before)
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(fresh, vec![Target::All]);
    }
}
