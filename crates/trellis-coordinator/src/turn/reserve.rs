//! Reserved execution ids: index entries written ahead of the starts that will use them, so a
//! start's first append need not wait for its index entry (one JetStream round trip less on
//! every start) while every execution is still in the index before its first event.
//!
//! Each owned shard keeps a few ids whose index entry is stored. A start takes the lowest (its
//! shard's, with an idempotency key; of any owned shard, without) and appends at once; with none
//! it takes a fresh id and writes its entry first, as before. Lists order executions by id, so a
//! coordinator's starts get rising ids: the coordinator makes its ids rising, never gives a
//! reserved id below the last one given (it is deleted instead), and asks for no refill in a turn
//! that gave a fresh id (a burst of starts would leave it below the next fresh one). Refills go
//! out after a turn's effects, in the background ([`super::Effects::reserve`], answered by
//! [`super::Input::Reserved`]), for shards just acquired or that starts drew on since their last
//! refill.
//!
//! A reserved id that nobody used is an index entry without a log. Its holder deletes it when
//! it drops the shard and when it is older than [`USE_WITHIN_MS`] (it is then never used); a
//! coordinator that crashed leaves its reservations behind, and the next owner deletes an
//! indexed id without a log once the id is older than [`ORPHAN_AFTER_MS`] (its index scans read
//! such an id again at most every [`RECHECK_UNBORN_MS`] meanwhile). A start decides on a
//! reserved id at most [`USE_WITHIN_MS`] after it was made and appends at once, so an id that old
//! has no first append to come unless its coordinator froze for most of an hour between deciding
//! and appending.

use std::collections::VecDeque;

use trellis_core::ids::ExecutionId;

use super::shards::index_key;
use super::{Coordinator, Map};

/// Ids a shard keeps reserved; a refill tops the shard up once it holds half as many.
pub const RESERVED_PER_SHARD: usize = 16;
/// A reserved id is used within this long after it was made, or deleted. Ids are UUIDv7, so
/// lists ordered by id ("newest first") place an execution by when its id was made: up to this
/// long before its start.
pub const USE_WITHIN_MS: u64 = 10 * 1000;
/// An indexed id without a log, older than this, is a reservation nobody will use: the owner of
/// its shard deletes it.
pub const ORPHAN_AFTER_MS: u64 = 60 * 60 * 1000;

/// An indexed id found without a log is read again by index scans at most this often: a
/// crashed coordinator's reservations are not read every scan for the hour until they are
/// deleted.
pub const RECHECK_UNBORN_MS: u64 = 60 * 1000;

/// Most ids drawn for one refill, so a refill ends even if the hash of ids were to avoid a shard.
const MAX_DRAWS: usize = 64 * RESERVED_PER_SHARD;

impl Coordinator {
    /// Gives up the reservations too old to use, and returns the owned shards' refills: index
    /// keys to write, each with its id ([`super::Input::Reserved`] answers them).
    pub(super) fn reserve(&mut self, now: u64) -> Vec<(String, ExecutionId)> {
        for (shard, id) in self.reservations.expire(now) {
            self.pending.index_deletes.push(index_key(shard, id));
        }
        let mut wanted: Map<u32, usize> = self
            .owned
            .iter()
            .map(|shard| (*shard, self.reservations.wanted(*shard)))
            .filter(|(_, n)| *n > 0)
            .collect();
        self.reservations.turn_ended();
        let mut refill = Vec::new();
        let mut draws = 0;
        while !wanted.is_empty() && draws < MAX_DRAWS {
            draws += 1;
            let id = self.ids.execution(now);
            let shard = self.shard_of(id);
            let Some(n) = wanted.get_mut(&shard) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                wanted.remove(&shard);
            }
            self.reservations.writing(shard, id);
            refill.push((index_key(shard, id), id));
        }
        refill
    }

    /// Index entries of reserved ids are stored: starts may take them. Those of shards dropped
    /// meanwhile are deleted.
    pub(super) fn reserved(&mut self, ids: Vec<ExecutionId>) {
        let ids: Vec<(u32, ExecutionId)> =
            ids.into_iter().map(|id| (self.shard_of(id), id)).collect();
        let unwanted = self.reservations.stored(ids);
        for (shard, id) in unwanted {
            self.pending.index_deletes.push(index_key(shard, id));
        }
    }

    /// An indexed id was read without a log: its entry is deleted once it is old enough to be a
    /// reservation nobody will use (made longer than [`ORPHAN_AFTER_MS`] ago); a younger one may
    /// still get its first event, and scans look at it again later.
    pub(super) fn indexed_without_log(&mut self, shard: u32, id: ExecutionId, now: u64) {
        let orphaned = id
            .unix_ms()
            .is_some_and(|at| now >= at.saturating_add(ORPHAN_AFTER_MS));
        if orphaned {
            tracing::info!(%id, shard, "indexed without a log for an hour: a reservation left behind; deleting it");
            self.unborn.remove(&id);
            self.pending.index_deletes.push(index_key(shard, id));
        } else {
            self.unborn.insert(id, now);
        }
    }

    /// Whether an index scan should read `id` again now: not if it was found without a log
    /// within [`RECHECK_UNBORN_MS`].
    pub(super) fn recheck(&self, id: ExecutionId, now: u64) -> bool {
        self.unborn
            .get(&id)
            .is_none_or(|at| now >= at + RECHECK_UNBORN_MS)
    }
}

/// Whether a reserved id is young enough to use: made less than [`USE_WITHIN_MS`] ago (its
/// UUIDv7 time is its refill's turn).
fn usable(id: ExecutionId, now: u64) -> bool {
    id.unix_ms().is_some_and(|at| now < at + USE_WITHIN_MS)
}

/// The reserved ids of the owned shards.
#[derive(Debug, Default)]
pub(super) struct Reservations {
    /// Ids whose index entry is stored, per shard, in id order (a UUIDv7 says when it was made).
    ready: Map<u32, VecDeque<ExecutionId>>,
    /// Ids whose index entry is being written, per shard.
    writing: Map<u32, Vec<ExecutionId>>,
    /// Ids found too old by a start, for [`Reservations::expire`] to hand back.
    expired: Vec<(u32, ExecutionId)>,
    /// Shards a start took an id of (or found none in) since their last refill, and shards just
    /// acquired: only these are refilled, so an idle shard does not write and delete entries
    /// every [`USE_WITHIN_MS`].
    demand: std::collections::BTreeSet<u32>,
    /// The last id a start was given, reserved or fresh: a reserved id not above it is never
    /// used, so a coordinator's starts get rising ids.
    last_given: Option<ExecutionId>,
    /// A start took a fresh id this turn: no refill until the next.
    fresh_this_turn: bool,
    /// Ids given to starts whose state is being built off the loop (`turn::Started::Build`),
    /// until they come back: each with its shard, whether its index entry is stored, and when
    /// it was given.
    lent: Map<ExecutionId, Lent>,
}

/// What holds an id given to a start being built off the loop.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lent {
    /// The id's shard.
    pub(super) shard: u32,
    /// Its index entry is stored (a reserved id), so giving it up deletes it.
    pub(super) indexed: bool,
    at_ms: u64,
}

impl Reservations {
    /// Takes the lowest usable reserved id of `shard`, or of any of `owned` when `shard` is
    /// `None`; returns it and its shard.
    pub(super) fn take(
        &mut self,
        shard: Option<u32>,
        owned: impl Iterator<Item = u32>,
        now: u64,
    ) -> Option<(ExecutionId, u32)> {
        let shards = shard.into_iter().chain(owned.filter(|_| shard.is_none()));
        // The lowest usable id of the shards: a coordinator's starts get ids in the order they
        // came, so lists by id keep that order.
        let mut lowest: Option<(ExecutionId, u32)> = None;
        for shard in shards {
            self.demand.insert(shard);
            if let Some(id) = self.front(shard, now)
                && lowest.is_none_or(|(low, _)| id < low)
            {
                lowest = Some((id, shard));
            }
        }
        let (id, shard) = lowest?;
        self.ready.get_mut(&shard).and_then(VecDeque::pop_front);
        self.last_given = Some(id);
        Some((id, shard))
    }

    /// A start took a fresh id (none was reserved): reserved ids below it are not used, and
    /// this turn asks for no refill (one written now would be older than the next fresh id
    /// of a burst).
    pub(super) fn gave_fresh(&mut self, id: ExecutionId) {
        self.last_given = Some(self.last_given.map_or(id, |last| last.max(id)));
        self.fresh_this_turn = true;
    }

    /// The turn's refills are decided: the next turn may refill again.
    pub(super) fn turn_ended(&mut self) {
        self.fresh_this_turn = false;
    }

    /// A shard was acquired: it is refilled at once, so its first starts find ids.
    pub(super) fn acquired(&mut self, shard: u32) {
        self.demand.insert(shard);
    }

    /// The first id of `shard` a start may take: those too old, or not above the last id given,
    /// are set aside for [`Reservations::expire`] to hand back.
    fn front(&mut self, shard: u32, now: u64) -> Option<ExecutionId> {
        let ready = self.ready.get_mut(&shard)?;
        while let Some(&id) = ready.front() {
            if usable(id, now) && self.last_given.is_none_or(|last| id > last) {
                return Some(id);
            }
            ready.pop_front();
            self.expired.push((shard, id));
        }
        None
    }

    /// Holds `id` (of `shard`; `indexed`: its entry is stored) for a start whose state is built
    /// off the loop, until [`Reservations::returned`] or, unclaimed, [`USE_WITHIN_MS`].
    pub(super) fn lend(&mut self, id: ExecutionId, shard: u32, indexed: bool, now: u64) {
        let lent = Lent {
            shard,
            indexed,
            at_ms: now,
        };
        self.lent.insert(id, lent);
    }

    /// The start built for `id` came back: what held its id, if it is still held (not given up
    /// as too old, or with its shard).
    pub(super) fn returned(&mut self, id: ExecutionId) -> Option<Lent> {
        self.lent.remove(&id)
    }

    /// A start did not use the id `lent` held for it (it failed, or found its idempotency key
    /// taken): a stored entry is deleted.
    pub(super) fn unused(&mut self, id: ExecutionId, lent: Lent) {
        if lent.indexed {
            self.expired.push((lent.shard, id));
        }
    }

    /// Ends the turn's bookkeeping: removes the ids older than [`USE_WITHIN_MS`] and returns them
    /// with those set aside, to be deleted from the index.
    pub(super) fn expire(&mut self, now: u64) -> Vec<(u32, ExecutionId)> {
        let mut gone = std::mem::take(&mut self.expired);
        // A start whose build never came back (its caller went away): its id is given up.
        self.lent.retain(|id, lent| {
            let unclaimed = now >= lent.at_ms + USE_WITHIN_MS;
            if unclaimed && lent.indexed {
                gone.push((lent.shard, *id));
            }
            !unclaimed
        });
        for (shard, ready) in &mut self.ready {
            while let Some(&id) = ready.front().filter(|id| !usable(**id, now)) {
                ready.pop_front();
                gone.push((*shard, id));
            }
        }
        gone
    }

    /// How many ids `shard` needs reserved now: none while no start wanted one since its last
    /// refill or while it holds more than half of [`RESERVED_PER_SHARD`], else enough to fill it.
    pub(super) fn wanted(&self, shard: u32) -> usize {
        if !self.demand.contains(&shard) || self.fresh_this_turn {
            return 0;
        }
        let held = self.ready.get(&shard).map_or(0, VecDeque::len)
            + self.writing.get(&shard).map_or(0, Vec::len);
        if held > RESERVED_PER_SHARD / 2 {
            0
        } else {
            RESERVED_PER_SHARD - held
        }
    }

    /// Notes an id whose index entry is being written.
    pub(super) fn writing(&mut self, shard: u32, id: ExecutionId) {
        self.demand.remove(&shard);
        self.writing.entry(shard).or_default().push(id);
    }

    /// Takes ids whose index entries are stored, each with its shard; returns those of shards no
    /// longer reserving (dropped while the entries were written), to be deleted from the index.
    pub(super) fn stored(&mut self, ids: Vec<(u32, ExecutionId)>) -> Vec<(u32, ExecutionId)> {
        let mut unwanted = Vec::new();
        for (shard, id) in ids {
            let Some(writing) = self.writing.get_mut(&shard) else {
                unwanted.push((shard, id));
                continue;
            };
            let Some(at) = writing.iter().position(|w| *w == id) else {
                unwanted.push((shard, id));
                continue;
            };
            writing.swap_remove(at);
            // Kept in id order, so a coordinator's starts get ids in the order they came.
            let ready = self.ready.entry(shard).or_default();
            ready.insert(ready.partition_point(|r| *r < id), id);
        }
        unwanted
    }

    /// Forgets a shard's reservations; returns the ids stored, to be deleted from the index (ids
    /// still being written are deleted when [`Reservations::stored`] reports them).
    pub(super) fn drop_shard(&mut self, shard: u32) -> Vec<ExecutionId> {
        self.writing.remove(&shard);
        self.demand.remove(&shard);
        let mut stored: Vec<ExecutionId> =
            self.ready.remove(&shard).map(Vec::from).unwrap_or_default();
        // Held for starts being built: those starts find no id held when they come back.
        self.lent.retain(|id, lent| {
            let dropped = lent.shard == shard;
            if dropped && lent.indexed {
                stored.push(*id);
            }
            !dropped
        });
        stored
    }

    /// Whether `id` is one of this coordinator's reservations (stored, being written, or held
    /// for a start being built).
    pub(super) fn holds(&self, shard: u32, id: ExecutionId) -> bool {
        self.lent.contains_key(&id)
            || self
                .ready
                .get(&shard)
                .is_some_and(|ready| ready.contains(&id))
            || self
                .writing
                .get(&shard)
                .is_some_and(|writing| writing.contains(&id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(at: u64, n: u128) -> ExecutionId {
        ExecutionId::derived(at, n)
    }

    /// Notes the entries of `ids` of `shard` written, then stored in that order; returns what
    /// [`Reservations::stored`] hands back.
    fn store(r: &mut Reservations, shard: u32, ids: &[ExecutionId]) -> Vec<(u32, ExecutionId)> {
        for id in ids {
            r.writing(shard, *id);
        }
        r.stored(ids.iter().map(|id| (shard, *id)).collect())
    }

    #[test]
    fn a_shard_is_refilled_once_half_is_used() {
        let mut r = Reservations::default();
        assert_eq!(r.wanted(0), 0, "no start wanted one yet");
        r.acquired(0);
        assert_eq!(r.wanted(0), RESERVED_PER_SHARD);
        let ids: Vec<ExecutionId> = (0..RESERVED_PER_SHARD as u128).map(|n| id(10, n)).collect();
        for id in &ids {
            r.writing(0, *id);
        }
        assert_eq!(r.wanted(0), 0, "being written counts as held");
        assert!(r.stored(ids.iter().map(|id| (0, *id)).collect()).is_empty());
        for _ in 0..RESERVED_PER_SHARD / 2 - 1 {
            assert!(r.take(Some(0), [0].into_iter(), 20).is_some());
        }
        assert_eq!(r.wanted(0), 0);
        assert!(r.take(Some(0), [0].into_iter(), 20).is_some());
        assert_eq!(r.wanted(0), RESERVED_PER_SHARD / 2);
    }

    #[test]
    fn ids_are_taken_lowest_first_across_shards() {
        let mut r = Reservations::default();
        let (a, b, c) = (id(10, 1), id(12, 2), id(11, 3));
        r.writing(0, a);
        r.writing(0, b);
        r.writing(1, c);
        assert!(r.stored(vec![(0, b), (0, a), (1, c)]).is_empty());
        let owned = [0, 1];
        assert_eq!(r.take(None, owned.into_iter(), 20), Some((a, 0)));
        assert_eq!(r.take(None, owned.into_iter(), 20), Some((c, 1)));
        assert_eq!(r.take(None, owned.into_iter(), 20), Some((b, 0)));
        assert_eq!(r.take(None, owned.into_iter(), 20), None);
    }

    /// After a fresh id, reserved ids below it are set aside, not given: a coordinator's starts
    /// get rising ids. The turn that gave it asks for no refill.
    #[test]
    fn a_reserved_id_below_a_fresh_one_is_never_given() {
        let mut r = Reservations::default();
        let (low, high) = (id(10, 1), id(30, 2));
        store(&mut r, 0, &[low, high]);
        r.acquired(0);
        let fresh = id(20, 3);
        r.gave_fresh(fresh);
        assert_eq!(r.wanted(0), 0, "no refill in the turn of a fresh id");
        assert_eq!(r.take(Some(0), [0].into_iter(), 40), Some((high, 0)));
        assert_eq!(r.expire(40), vec![(0, low)], "handed back for deleting");
        r.turn_ended();
        assert_eq!(r.wanted(0), RESERVED_PER_SHARD, "the next turn refills");
    }

    #[test]
    fn an_old_reservation_is_never_used_and_is_expired() {
        let mut r = Reservations::default();
        let old = id(1_000, 1);
        store(&mut r, 0, &[old]);
        let late = 1_000 + USE_WITHIN_MS;
        assert!(r.holds(0, old));
        assert_eq!(r.expire(late), vec![(0, old)]);
        assert!(!r.holds(0, old));
        store(&mut r, 0, &[old]);
        assert_eq!(r.take(Some(0), [0].into_iter(), late), None);
        assert_eq!(
            r.expire(late),
            vec![(0, old)],
            "a start that found it too old hands it back"
        );
    }

    #[test]
    fn a_dropped_shard_gives_its_ids_back_for_deleting() {
        let mut r = Reservations::default();
        let (a, b) = (id(10, 1), id(10, 2));
        r.writing(3, a);
        r.writing(3, b);
        r.stored(vec![(3, a)]);
        assert_eq!(r.drop_shard(3), vec![a]);
        // The one still being written is unwanted once stored.
        assert_eq!(r.stored(vec![(3, b)]), vec![(3, b)]);
        assert!(!r.holds(3, a) && !r.holds(3, b));
    }
}
