//! Identifiers: UUIDv7 newtypes, so an execution id can never be passed where a task instance id is
//! expected, and ids sort by creation time.
//!
//! The core never reads a clock or a random source; `v7` builds an id from parts the caller
//! supplies (the shells use the wall clock and a RNG, tests use counters), which keeps the state
//! machine deterministic.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! uuid_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// Builds a UUIDv7 from a Unix timestamp in milliseconds and 10 bytes of entropy.
            pub fn v7(unix_ms: u64, entropy: [u8; 10]) -> Self {
                Self(uuid::Builder::from_unix_timestamp_millis(unix_ms, &entropy).into_uuid())
            }

            /// Builds a UUIDv7 deterministically from a timestamp and a 128-bit seed (for example a
            /// hash of the parent id and a counter), used where replay must yield the same id.
            /// Every bit of the seed influences the 74 bits a UUIDv7 leaves for entropy.
            pub fn derived(unix_ms: u64, seed: u128) -> Self {
                let bytes = mix(seed, &[]).to_le_bytes();
                let mut entropy = [0u8; 10];
                entropy.copy_from_slice(&bytes[..10]);
                Self::v7(unix_ms, entropy)
            }

            /// Returns the nil id, used only as a placeholder in tests and benchmarks.
            pub const fn nil() -> Self {
                Self(Uuid::nil())
            }

            /// Returns the underlying UUID.
            pub const fn as_uuid(&self) -> &Uuid {
                &self.0
            }

            /// Returns the next UUIDv7 above this one, for ids that must rise: the same
            /// millisecond with its random bits plus one, or the next millisecond when those are
            /// all ones (or this is no UUIDv7).
            pub fn successor(&self) -> Self {
                const RAND_B: u128 = (1 << 62) - 1;
                let value = self.0.as_u128();
                if self.0.get_version_num() == 7 && value & RAND_B != RAND_B {
                    return Self(Uuid::from_u128(value + 1));
                }
                Self::v7(self.unix_ms().map_or(0, |ms| ms + 1), [0; 10])
            }

            /// Returns the Unix time in milliseconds a UUIDv7 was made at; `None` for any
            /// other kind of UUID.
            pub fn unix_ms(&self) -> Option<u64> {
                if self.0.get_version_num() != 7 {
                    return None;
                }
                let (secs, nanos) = self.0.get_timestamp()?.to_unix();
                Some(secs * 1000 + u64::from(nanos) / 1_000_000)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }

        impl From<Uuid> for $name {
            fn from(uuid: Uuid) -> Self {
                Self(uuid)
            }
        }
    };
}

/// A stable 128-bit mix (splitmix64 over the words), used to derive ids that a replay reproduces
/// exactly. Stable across releases by construction, unlike `std`'s hashers.
pub fn mix(seed: u128, words: &[u64]) -> u128 {
    fn splitmix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let mut hi = splitmix(seed as u64 ^ 0x7472_656c_6c69_7321);
    let mut lo = splitmix((seed >> 64) as u64 ^ hi);
    for &word in words {
        hi = splitmix(hi ^ word);
        lo = splitmix(lo.rotate_left(17) ^ word ^ hi);
    }
    (u128::from(hi) << 64) | u128::from(lo)
}

uuid_newtype!(
    /// One execution of a plan; also the correlation id of all its task instances.
    ExecutionId
);
uuid_newtype!(
    /// One task instance (the seed's `TaskStatusRecord.taskInstanceId`).
    TaskInstanceId
);
uuid_newtype!(
    /// A group of subtasks spawned by one task instance.
    GroupId
);
uuid_newtype!(
    /// A human question asked by a task instance.
    QuestionId
);

/// A worker (agent) id. Workers choose their own (`host-pid-slot` by default), so it is a string.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub String);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerId({})", self.0)
    }
}

impl From<&str> for WorkerId {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_v7_and_deterministic() {
        let a = TaskInstanceId::derived(1_700_000_000_000, 42);
        let b = TaskInstanceId::derived(1_700_000_000_000, 42);
        assert_eq!(a, b);
        assert_eq!(a.0.get_version_num(), 7);
        assert_ne!(a, TaskInstanceId::derived(1_700_000_000_000, 43));
        // Seeds differing only in bits a UUIDv7 overwrites still give different ids.
        assert_ne!(
            TaskInstanceId::derived(7, 10),
            TaskInstanceId::derived(7, 42)
        );
    }

    #[test]
    fn ids_sort_by_time() {
        let early = ExecutionId::v7(1_000, [9; 10]);
        let late = ExecutionId::v7(2_000, [0; 10]);
        assert!(early < late);
    }

    #[test]
    fn a_v7_id_says_when_it_was_made() {
        let id = ExecutionId::derived(1_700_000_123_456, 7);
        assert_eq!(id.unix_ms(), Some(1_700_000_123_456));
        assert_eq!(ExecutionId::from(Uuid::from_u128(0x1234)).unix_ms(), None);
        assert_eq!(ExecutionId::nil().unix_ms(), None);
    }

    #[test]
    fn a_successor_is_the_next_v7_id_above() {
        let id = ExecutionId::derived(1_700_000_000_000, 7);
        let next = id.successor();
        assert!(next > id);
        assert_eq!(next.0.get_version_num(), 7);
        assert_eq!(next.unix_ms(), id.unix_ms());
        // Random bits all ones: the next millisecond.
        let full = ExecutionId(Uuid::from_u128(id.0.as_u128() | ((1 << 62) - 1)));
        let carried = full.successor();
        assert!(carried > full);
        assert_eq!(carried.unix_ms(), Some(1_700_000_000_001));
    }

    #[test]
    fn ids_round_trip_through_strings() {
        let id = GroupId::v7(5, [1; 10]);
        assert_eq!(id.to_string().parse::<GroupId>().ok(), Some(id));
    }
}
