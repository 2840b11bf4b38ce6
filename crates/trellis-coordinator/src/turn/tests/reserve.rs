//! Reserved ids (`turn::reserve`): a start takes one whose index entry is stored and appends at
//! once; reservations nobody will use leave the index.

use trellis_core::ids::ExecutionId;

use super::window::{coordinator, own_shard_0, start, turn};
use crate::turn::{
    Coordinator, Effects, Input, ORPHAN_AFTER_MS, RECHECK_UNBORN_MS, RESERVED_PER_SHARD,
    USE_WITHIN_MS, index_key,
};

/// A clock's time, as the executor gives it.
pub(super) const NOW: u64 = 1_700_000_000_000;

/// Owns shard 0 at `now` and returns the refill its turn asked for, not yet stored.
fn owned_with_refill(coordinator: &mut Coordinator, now: u64) -> Vec<(String, ExecutionId)> {
    turn(coordinator, vec![Input::LeaseAcquired(0)], now);
    let recovered = Input::ShardRecovered {
        shard: 0,
        recovered: Vec::new(),
        missing: Vec::new(),
        broken: Vec::new(),
    };
    turn(coordinator, vec![recovered], now).reserve
}

/// The ids of a refill in the order starts take them: by id.
fn sorted(refill: &[(String, ExecutionId)]) -> Vec<ExecutionId> {
    let mut ids: Vec<ExecutionId> = refill.iter().map(|(_, id)| *id).collect();
    ids.sort_unstable();
    ids
}

/// Owns shard 0 with its refill asked for at `NOW`, the first `stored` of its ids (in id order)
/// reported stored at `NOW + 1`; returns all of them in id order.
pub(super) fn reserved(coordinator: &mut Coordinator, stored: usize) -> Vec<ExecutionId> {
    let ids = sorted(&owned_with_refill(coordinator, NOW));
    let report = Input::Reserved(ids[..stored].to_vec());
    turn(coordinator, vec![report], NOW + 1);
    ids
}

/// The index keys of ids of shard 0.
pub(super) fn keys(ids: &[ExecutionId]) -> Vec<String> {
    ids.iter().map(|id| index_key(0, *id)).collect()
}

/// Starts one execution at `now` and stores its first append: its id, its index entry and the
/// effects of the append.
fn started(coordinator: &mut Coordinator, now: u64) -> (ExecutionId, Option<String>, Effects) {
    let writes = coordinator.turn(vec![start(1)], now);
    let [append] = <[_; 1]>::try_from(writes.appends).expect("one append");
    let outcome = crate::turn::Appended::Stored { stream_seq: 1 };
    let effects = coordinator.appended(vec![(append.id, outcome)], now);
    (append.id, append.index_put, effects)
}

/// An owned shard asks for its reservations at once; once they are stored a start takes the
/// lowest reserved id and writes no entry, and the next start the next id.
#[test]
fn a_start_takes_a_reserved_id_once_its_entry_is_stored() {
    let mut coordinator = coordinator(0);
    let refill = owned_with_refill(&mut coordinator, NOW);
    assert_eq!(refill.len(), RESERVED_PER_SHARD);
    for (key, id) in &refill {
        assert_eq!(*key, index_key(0, *id), "each key names its id");
    }
    let ids = sorted(&refill);
    turn(
        &mut coordinator,
        vec![Input::Reserved(ids.clone())],
        NOW + 1,
    );
    let (id, index_put, _) = started(&mut coordinator, NOW + 2);
    assert_eq!((id, index_put), (ids[0], None), "already indexed");
    let (id, _, _) = started(&mut coordinator, NOW + 3);
    assert_eq!(id, ids[1]);
}

/// Until the reservations are stored a start writes its own entry first, with a fresh id; the
/// reserved ids below it are then never given (a coordinator's starts get rising ids, so lists
/// by id keep their order) but deleted, and the next starts get rising ids again.
#[test]
fn a_start_before_its_shard_s_reservations_are_stored_writes_its_entry() {
    let mut coordinator = coordinator(0);
    let refill = owned_with_refill(&mut coordinator, NOW);
    let (fresh, index_put, _) = started(&mut coordinator, NOW + 1);
    assert_eq!(
        index_put,
        Some(index_key(0, fresh)),
        "nothing is stored yet"
    );
    let ids = sorted(&refill);
    assert!(
        ids.iter().all(|id| *id < fresh),
        "reserved earlier, so lower"
    );
    turn(
        &mut coordinator,
        vec![Input::Reserved(ids.clone())],
        NOW + 2,
    );
    let (next, _, effects) = started(&mut coordinator, NOW + 3);
    assert!(next > fresh, "a rising id");
    assert_eq!(effects.index_deletes, keys(&ids), "the ones below, deleted");
    assert!(
        effects.reserve.is_empty(),
        "no refill in a turn of a fresh id"
    );
    let effects = turn(&mut coordinator, Vec::new(), NOW + 4);
    assert_eq!(
        effects.reserve.len(),
        RESERVED_PER_SHARD,
        "the next turn refills"
    );
    assert!(effects.reserve.iter().all(|(_, id)| *id > next));
}

/// Half the reservations used, a refill tops the shard up; not before.
#[test]
fn a_shard_is_refilled_once_half_its_reservations_are_used() {
    let mut coordinator = coordinator(0);
    reserved(&mut coordinator, RESERVED_PER_SHARD);
    let mut refilled: Vec<usize> = (0..RESERVED_PER_SHARD / 2)
        .map(|n| {
            turn(&mut coordinator, vec![start(1)], NOW + 2 + n as u64)
                .reserve
                .len()
        })
        .collect();
    let last = refilled.pop();
    assert!(refilled.iter().all(|n| *n == 0), "{refilled:?}");
    assert_eq!(
        last,
        Some(RESERVED_PER_SHARD / 2),
        "topped up to the full count"
    );
}

/// A reservation older than `USE_WITHIN_MS` is never used: it is deleted, an idle shard is not
/// refilled, and the next start writes its own entry and a refill follows.
#[test]
fn an_old_reservation_is_deleted_not_used() {
    let mut coordinator = coordinator(0);
    let ids = reserved(&mut coordinator, RESERVED_PER_SHARD);
    let late = NOW + USE_WITHIN_MS;
    let effects = turn(&mut coordinator, Vec::new(), late);
    assert_eq!(effects.index_deletes, keys(&ids), "every one, in id order");
    assert!(
        effects.reserve.is_empty(),
        "no start wanted one: none asked for"
    );
    let (id, index_put, _) = started(&mut coordinator, late + 1);
    assert!(!ids.contains(&id));
    assert_eq!(index_put, Some(index_key(0, id)));
    let effects = turn(&mut coordinator, Vec::new(), late + 2);
    assert_eq!(
        effects.reserve.len(),
        RESERVED_PER_SHARD,
        "a start found none: refilled a turn later"
    );
}

/// A shard given up deletes its reservations: those stored at once, those still being written
/// when their entries are reported stored.
#[test]
fn a_lost_shard_deletes_its_reservations() {
    let mut coordinator = coordinator(0);
    let ids = reserved(&mut coordinator, 4);
    let (stored, writing) = ids.split_at(4);
    let effects = turn(&mut coordinator, vec![Input::LeaseLost(0)], NOW + 2);
    assert_eq!(effects.index_deletes, keys(stored));
    assert!(
        effects.reserve.is_empty(),
        "no refill for a shard not owned"
    );
    let effects = turn(
        &mut coordinator,
        vec![Input::Reserved(writing.to_vec())],
        NOW + 3,
    );
    assert_eq!(effects.index_deletes, keys(writing));
}

/// An index scan passes this coordinator's own reservations by: they have no log yet and are no
/// execution to load.
#[test]
fn an_index_scan_does_not_load_the_coordinator_s_own_reservations() {
    let mut coordinator = coordinator(0);
    let ids = reserved(&mut coordinator, 4);
    let (stored, writing) = ids.split_at(4);
    let stranger = ExecutionId::derived(NOW, 99);
    let mut listed = ids.clone();
    listed.push(stranger);
    let effects = turn(
        &mut coordinator,
        vec![Input::Indexed {
            shard: 0,
            ids: listed,
        }],
        NOW + 2,
    );
    assert_eq!(
        effects.load,
        [stranger],
        "stored {stored:?}, writing {writing:?}"
    );
}

/// An id indexed without a log is deleted from the index by the shard's owner once it is older
/// than `ORPHAN_AFTER_MS` (a reservation a crashed coordinator left); a younger one may still get
/// its first event: it stays, and index scans read it again every `RECHECK_UNBORN_MS`.
#[test]
fn an_old_indexed_id_without_a_log_is_deleted() {
    let mut coordinator = coordinator(0);
    own_shard_0(&mut coordinator);
    let now = NOW + ORPHAN_AFTER_MS;
    let old = ExecutionId::derived(NOW, 1);
    let young = ExecutionId::derived(NOW + 1, 2);
    let scan = Input::Indexed {
        shard: 0,
        ids: vec![old, young],
    };
    let effects = turn(&mut coordinator, vec![scan], now);
    assert_eq!(effects.load, [old, young]);
    let loaded = Input::Loaded {
        recovered: Vec::new(),
        missing: vec![old, young],
        broken: Vec::new(),
    };
    let effects = turn(&mut coordinator, vec![loaded], now);
    assert_eq!(effects.index_deletes, [index_key(0, old)]);

    // The young one is read again, but not at every scan.
    let scan = |ids: Vec<ExecutionId>| Input::Indexed { shard: 0, ids };
    let effects = turn(&mut coordinator, vec![scan(vec![young])], now + 1);
    assert!(effects.load.is_empty(), "{:?}", effects.load);
    let later = now + RECHECK_UNBORN_MS;
    let effects = turn(&mut coordinator, vec![scan(vec![young])], later);
    assert_eq!(effects.load, [young]);

    // Found so at a shard's recovery, the same.
    let mut coordinator = super::window::coordinator(0);
    turn(&mut coordinator, vec![Input::LeaseAcquired(0)], now);
    let recovered = Input::ShardRecovered {
        shard: 0,
        recovered: Vec::new(),
        missing: vec![old, young],
        broken: Vec::new(),
    };
    let effects = turn(&mut coordinator, vec![recovered], now);
    assert_eq!(effects.index_deletes, [index_key(0, old)]);

    // An id a request asked for, not the index, is not deleted: it may be no key at all.
    let get = Input::Request {
        reply: 1,
        request: crate::turn::Request::On {
            id: old,
            scope: trellis_grpc::access::Scope::All,
            action: crate::turn::Action::Get,
        },
    };
    let effects = turn(&mut coordinator, vec![get], now);
    assert_eq!(effects.load, [old]);
    let loaded = Input::Loaded {
        recovered: Vec::new(),
        missing: vec![old],
        broken: Vec::new(),
    };
    let effects = turn(&mut coordinator, vec![loaded], now);
    assert!(
        effects.index_deletes.is_empty(),
        "{:?}",
        effects.index_deletes
    );
}
