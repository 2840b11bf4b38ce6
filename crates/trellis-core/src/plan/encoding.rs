//! The canonical encoding of a compiled [`Plan`]: a plan compiled once (at admission) is recorded
//! as these bytes and read back without compiling again.
//!
//! [`encode`] writes MessagePack (`rmp-serde`, structs as arrays) from the private structs of
//! `encoded.rs`, leaving out what [`decode`] derives. It is deterministic: the same plan always
//! gives the same bytes. [`decode`] never panics: it refuses bytes of another format, malformed or
//! truncated bytes, bytes after the plan, JSON nested deeper than [`MAX_DEPTH`], and any plan that
//! would break what the state machine relies on (`verify.rs`: every task index in range, unique
//! ids, symmetric conflicts, acyclic dependencies and subtask links), naming the task and field.
//!
//! # Evolving the format
//!
//! The bytes are one array whose first element is the format version; the field order of the
//! structs in `encoded.rs` is the format.
//! - To add something, append a field at the end of the struct that holds it, marked
//!   `#[serde(default)]`, with a default that means what bytes without it meant. Bytes written
//!   before still decode: a shorter array leaves the trailing fields at their default. Bump
//!   [`PLAN_FORMAT_VERSION`] all the same, so that an older build refuses the new bytes with a
//!   [`PlanDecodeError::Format`] naming the version rather than a length mismatch; this build
//!   keeps reading every version from [`OLDEST_READABLE_FORMAT`] on.
//! - To remove, reorder or retype a field, or change what a value means (including what an
//!   omitted value is derived from: a task's queue from its type, its failure chain from the
//!   plan's policy), bump the version and either read the older layout by its version or raise
//!   [`OLDEST_READABLE_FORMAT`], which refuses older logs.
//!
//! `tests/plan/encoding.rs` pins the bytes of a fixture plan: a change that alters them is a
//! format change.

use serde::Deserialize;

use super::encoded::EncodedPlan;
use super::errors::PlanDecodeError;
use super::model::Plan;
use super::verify;

/// Version of the plan encoding [`encode`] writes.
pub const PLAN_FORMAT_VERSION: u32 = 2;

/// The oldest version [`decode`] reads.
const OLDEST_READABLE_FORMAT: u32 = 1;

/// Deepest nesting of arrays and maps [`decode`] accepts, plan structure included (a task's input
/// sits 4 levels down). The plan parsers stop at 128 levels, so compiled plans stay well within
/// it; the limit keeps hostile bytes from exhausting the stack.
const MAX_DEPTH: usize = 256;

/// Returns the canonical bytes of a compiled plan (see the module docs).
pub fn encode(plan: &Plan) -> Vec<u8> {
    let encoded = EncodedPlan::of(plan, PLAN_FORMAT_VERSION);
    // Encoding into a Vec cannot fail: every field is a plain value with a known length, and the
    // only maps are JSON objects, whose keys are strings.
    rmp_serde::to_vec(&encoded).unwrap_or_default()
}

/// Reads back a plan [`encode`] wrote, deriving what it left out, and checks it (see the module
/// docs). Never panics.
pub fn decode(bytes: &[u8]) -> Result<Plan, PlanDecodeError> {
    let format = read_format(bytes)?;
    if !(u64::from(OLDEST_READABLE_FORMAT)..=u64::from(PLAN_FORMAT_VERSION)).contains(&format) {
        return Err(PlanDecodeError::Format {
            found: format,
            oldest: OLDEST_READABLE_FORMAT,
            newest: PLAN_FORMAT_VERSION,
        });
    }
    let mut rest = bytes;
    let mut de = rmp_serde::Deserializer::new(&mut rest);
    de.set_max_depth(MAX_DEPTH);
    let encoded = EncodedPlan::deserialize(&mut de)
        .map_err(|err| PlanDecodeError::Malformed(err.to_string()))?;
    if !rest.is_empty() {
        return Err(PlanDecodeError::Malformed(format!(
            "{} bytes after the plan",
            rest.len()
        )));
    }
    verify::finish(encoded.into_plan()?)
}

/// Reads the format, the first element of the encoded array, before decoding the rest.
fn read_format(bytes: &[u8]) -> Result<u64, PlanDecodeError> {
    let mut rd = bytes;
    let len = rmp::decode::read_array_len(&mut rd)
        .map_err(|err| PlanDecodeError::Malformed(format!("plan header: {err}")))?;
    if len == 0 {
        return Err(PlanDecodeError::Malformed(
            "plan is an empty array".to_owned(),
        ));
    }
    rmp::decode::read_int(&mut rd)
        .map_err(|err| PlanDecodeError::Malformed(format!("plan format: {err}")))
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    /// What the evolution rule relies on: bytes of a struct decode into the same struct with a
    /// field appended under `#[serde(default)]`, and a struct refuses bytes with a field more.
    #[test]
    fn appended_default_fields_read_older_bytes() {
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Before {
            a: u32,
            b: String,
        }
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct After {
            a: u32,
            b: String,
            #[serde(default)]
            c: Option<u32>,
        }
        let old = rmp_serde::to_vec(&Before {
            a: 1,
            b: "x".to_owned(),
        })
        .expect("encodes");
        let read: After = rmp_serde::from_slice(&old).expect("older bytes decode");
        assert_eq!(
            read,
            After {
                a: 1,
                b: "x".to_owned(),
                c: None
            }
        );
        let new = rmp_serde::to_vec(&After {
            a: 1,
            b: "x".to_owned(),
            c: Some(2),
        })
        .expect("encodes");
        assert!(rmp_serde::from_slice::<Before>(&new).is_err());
    }
}
