//! Where the coordinator's loop spent its time during a scenario: the mean of each phase of a
//! turn (`trellis_coordinator_turn_seconds`: decide, append, effects) and how many turns decided
//! for long, read from the cluster's own registry before and after it, since the bench hosts the
//! coordinator in its process.

use serde_json::{Value, json};
use trellis_telemetry::Registry;

use super::round;

/// The histogram every turn reports its phases to.
const METRIC: &str = "trellis_coordinator_turn_seconds";
/// The phases, in the order a turn runs them.
const PHASES: [&str; 3] = ["decide", "append", "effects"];
/// A decide longer than this holds every other execution of the loop up noticeably (one of the
/// histogram's bucket bounds, in seconds, as the exposition writes it).
const LONG_DECIDE: &str = "0.004";

/// The seconds and the number of turns each phase has counted so far, and how many decides
/// took at most [`LONG_DECIDE`].
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Phases {
    seconds: [f64; 3],
    turns: [f64; 3],
    short_decides: f64,
}

impl Phases {
    /// Reads the phases' running totals from `registry`.
    pub(super) fn read(registry: &Registry) -> Self {
        Self::parse(&registry.encode())
    }

    /// Reads the totals from the Prometheus text exposition; a series it lacks counts as 0.
    fn parse(text: &str) -> Self {
        let series_of =
            |kind: &str| PHASES.map(|phase| format!("{METRIC}_{kind}{{phase=\"{phase}\"}}"));
        let (sums, counts) = (series_of("sum"), series_of("count"));
        let short_decides = format!("{METRIC}_bucket{{le=\"{LONG_DECIDE}\",phase=\"decide\"}}");
        let mut phases = Self::default();
        for line in text.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if series == short_decides {
                phases.short_decides = value;
            }
            for i in 0..PHASES.len() {
                if series == sums[i] {
                    phases.seconds[i] = value;
                } else if series == counts[i] {
                    phases.turns[i] = value;
                }
            }
        }
        phases
    }

    /// The field of a scenario's line: how many turns ran since `before`, the mean
    /// milliseconds of each phase over the turns that ran it, and how many turns decided for
    /// longer than [`LONG_DECIDE`] (`long_decides`).
    pub(super) fn since(&self, before: &Self) -> Value {
        let mut field = serde_json::Map::new();
        let turns = self.turns[0] - before.turns[0];
        field.insert("turns".to_owned(), json!(turns));
        let short = self.short_decides - before.short_decides;
        field.insert("long_decides".to_owned(), json!(turns - short));
        for (i, phase) in PHASES.iter().enumerate() {
            let turns = self.turns[i] - before.turns[i];
            let seconds = self.seconds[i] - before.seconds[i];
            let mean = if turns > 0.0 {
                round(seconds / turns * 1000.0, 3)
            } else {
                0.0
            };
            field.insert(format!("{phase}_ms"), json!(mean));
        }
        Value::Object(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_means_are_of_the_turns_between_two_readings() {
        let before = Phases::parse(
            "# HELP trellis_coordinator_turn_seconds ...\n\
             trellis_coordinator_turn_seconds_sum{phase=\"decide\"} 1.0\n\
             trellis_coordinator_turn_seconds_count{phase=\"decide\"} 10\n\
             trellis_coordinator_turn_seconds_bucket{le=\"0.001\",phase=\"decide\"} 4\n\
             trellis_coordinator_turn_seconds_bucket{le=\"0.004\",phase=\"decide\"} 9\n",
        );
        let after = Phases::parse(
            "trellis_coordinator_turn_seconds_sum{phase=\"decide\"} 1.5\n\
             trellis_coordinator_turn_seconds_count{phase=\"decide\"} 110\n\
             trellis_coordinator_turn_seconds_bucket{le=\"0.004\",phase=\"decide\"} 106\n\
             trellis_coordinator_turn_seconds_bucket{le=\"0.004\",phase=\"append\"} 1\n\
             trellis_coordinator_turn_seconds_sum{phase=\"append\"} 0.2\n\
             trellis_coordinator_turn_seconds_count{phase=\"append\"} 50\n\
             trellis_event_append_seconds_sum 9\n",
        );
        assert_eq!(
            after.since(&before),
            json!({
                "turns": 100.0,
                "long_decides": 3.0,
                "decide_ms": 5.0,
                "append_ms": 4.0,
                "effects_ms": 0.0
            })
        );
    }

    /// Read from a registry as the coordinator fills it: the bucket series is found in the
    /// exposition the registry writes, and the decide over the bound is counted.
    #[test]
    fn long_decides_are_read_from_the_registry_s_own_exposition() {
        use trellis_telemetry::metrics::{HistogramFamily, Labels1, latency_family};
        let registry = Registry::default();
        let family: HistogramFamily<Labels1> = registry.metric(METRIC, "turns", latency_family);
        let before = Phases::read(&registry);
        let decide = family.get_or_create(&[("phase", "decide".to_owned())]);
        for seconds in [0.0001, 0.003, 0.0041, 0.02] {
            decide.observe(seconds);
        }
        let field = Phases::read(&registry).since(&before);
        assert_eq!(field["turns"], json!(4.0), "{}", registry.encode());
        assert_eq!(field["long_decides"], json!(2.0), "{}", registry.encode());
    }
}
