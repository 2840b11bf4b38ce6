//! The ready set: the queued instances, in the order they became ready.
//!
//! An instance becomes ready under the execution's next ready key, so keys only grow and an
//! insert is a push at the back; a dispatch takes from the front. Both are O(1), where an
//! ordered tree paid a descent and a node split per insert (a third of starting a 20,000-task
//! execution). A removal from elsewhere (a cancel, a pause's dispatch of later tasks first) marks
//! its entry, found by binary search on the key; marks at the front are dropped at once, the
//! others once they outnumber the live entries, so the set stays within twice its live size.

use std::collections::VecDeque;

use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, SerializeSeq, Serializer};

use super::InstIdx;

/// Marks kept before a sweep, however few entries are live.
const SWEEP_FLOOR: usize = 64;

/// Queued instances by ready key, oldest first.
#[derive(Clone, Debug, Default)]
pub(super) struct ReadySet {
    /// Sorted by key; `None` marks a removed entry.
    entries: VecDeque<(u64, Option<InstIdx>)>,
    live: usize,
}

impl ReadySet {
    /// Adds an instance under `key`. Keys come from a counter, so this is a push at the back; a
    /// key below the last one (never made by the machine) is placed after its equals.
    pub(super) fn insert(&mut self, key: u64, idx: InstIdx) {
        match self.entries.back() {
            Some(&(last, _)) if last > key => {
                let at = self.entries.partition_point(|&(k, _)| k <= key);
                self.entries.insert(at, (key, Some(idx)));
            }
            _ => self.entries.push_back((key, Some(idx))),
        }
        self.live += 1;
    }

    /// Removes the instance held under `key`; returns whether it was there.
    pub(super) fn remove(&mut self, key: u64, idx: InstIdx) -> bool {
        let from = self.entries.partition_point(|&(k, _)| k < key);
        let found = self
            .entries
            .range(from..)
            .take_while(|&&(k, _)| k == key)
            .position(|&(_, i)| i == Some(idx));
        let Some(offset) = found else {
            return false;
        };
        self.entries[from + offset].1 = None;
        self.live -= 1;
        while matches!(self.entries.front(), Some((_, None))) {
            self.entries.pop_front();
        }
        let marks = self.entries.len() - self.live;
        if marks > SWEEP_FLOOR && marks > self.live {
            self.entries.retain(|&(_, i)| i.is_some());
        }
        true
    }

    /// The queued instances with their keys, oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, InstIdx)> + '_ {
        self.entries
            .iter()
            .filter_map(|&(key, idx)| idx.map(|idx| (key, idx)))
    }

    /// How many instances are queued.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.live
    }
}

impl PartialEq for ReadySet {
    /// Equal when the same instances are queued under the same keys, whatever was removed.
    fn eq(&self, other: &Self) -> bool {
        self.live == other.live && self.iter().eq(other.iter())
    }
}

impl FromIterator<(u64, InstIdx)> for ReadySet {
    fn from_iter<I: IntoIterator<Item = (u64, InstIdx)>>(entries: I) -> Self {
        let mut sorted: Vec<(u64, InstIdx)> = entries.into_iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        Self {
            live: sorted.len(),
            entries: sorted.into_iter().map(|(k, i)| (k, Some(i))).collect(),
        }
    }
}

/// A sequence of `(key, instance)` pairs, oldest first: the encoding of the ordered set of pairs
/// this replaced, so snapshots read the same either way.
impl Serialize for ReadySet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.live))?;
        for entry in self.iter() {
            seq.serialize_element(&entry)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for ReadySet {
    /// Sorted and without repeats, as the ordered set it replaced read them.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Vec::<(u64, InstIdx)>::deserialize(deserializer)?
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Queue the next key for this instance.
        Insert(InstIdx),
        /// Remove the n-th live entry (modulo the live count), or a pair never held.
        Remove(usize),
        RemoveAbsent(u64, InstIdx),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..1000).prop_map(Op::Insert),
            3 => (0usize..1000).prop_map(Op::Remove),
            1 => (0u64..2000, 0u32..1000).prop_map(|(k, i)| Op::RemoveAbsent(k, i)),
        ]
    }

    proptest! {
        /// Whatever the inserts and removals, the set holds and orders what an ordered set of
        /// the same pairs would, and keeps at most twice its live entries (plus the floor).
        #[test]
        fn behaves_as_an_ordered_set_of_pairs(ops in proptest::collection::vec(op(), 0..400)) {
            let mut ready = ReadySet::default();
            let mut model = BTreeSet::new();
            let mut next_key = 0u64;
            for op in ops {
                match op {
                    Op::Insert(idx) => {
                        ready.insert(next_key, idx);
                        model.insert((next_key, idx));
                        next_key += 1;
                    }
                    Op::Remove(n) => {
                        if model.is_empty() {
                            continue;
                        }
                        let &(key, idx) = model.iter().nth(n % model.len()).expect("in range");
                        prop_assert!(ready.remove(key, idx));
                        model.remove(&(key, idx));
                    }
                    Op::RemoveAbsent(key, idx) => {
                        prop_assert_eq!(ready.remove(key, idx), model.remove(&(key, idx)));
                    }
                }
                prop_assert_eq!(ready.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(ready.len(), model.len());
                prop_assert!(ready.entries.len() <= 2 * ready.len() + SWEEP_FLOOR + 1);
            }
            let rebuilt: ReadySet = model.iter().copied().collect();
            prop_assert_eq!(&rebuilt, &ready);
        }
    }

    #[test]
    fn a_key_below_the_last_is_placed_in_order() {
        let mut ready = ReadySet::default();
        ready.insert(5, 1);
        ready.insert(9, 2);
        ready.insert(7, 3);
        assert_eq!(ready.iter().collect::<Vec<_>>(), [(5, 1), (7, 3), (9, 2)]);
        assert!(ready.remove(7, 3));
        assert!(!ready.remove(7, 3), "a pair is removed once");
        assert_eq!(ready.iter().collect::<Vec<_>>(), [(5, 1), (9, 2)]);
    }

    #[test]
    fn encodes_as_the_ordered_set_it_replaced() {
        let mut ready = ReadySet::default();
        let mut set = BTreeSet::new();
        for (key, idx) in [(0, 4), (1, 2), (2, 9), (3, 1)] {
            ready.insert(key, idx);
            set.insert((key, idx));
        }
        ready.remove(1, 2);
        set.remove(&(1, 2));
        let ours = rmp_serde::to_vec(&ready).expect("encodes");
        let theirs = rmp_serde::to_vec(&set).expect("encodes");
        assert_eq!(ours, theirs);
        let back: ReadySet = rmp_serde::from_slice(&theirs).expect("decodes");
        assert_eq!(back, ready);
    }
}
