//! Reserved ids (`turn::reserve`): a start takes one whose index entry is stored and appends at
//! once; reservations nobody will use leave the index.

use trellis_core::ids::ExecutionId;

use super::window::{coordinator, own_shard_0, start, turn};
use crate::turn::{
    Coordinator, Input, ORPHAN_AFTER_MS, RECHECK_UNBORN_MS, RESERVED_PER_SHARD, USE_WITHIN_MS,
    index_key,
};

/// A clock's time, as the executor gives it.
const NOW: u64 = 1_700_000_000_000;

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

/// The id and index entry of the one new execution of a turn's writes.
fn started(coordinator: &mut Coordinator, now: u64) -> (ExecutionId, Option<String>) {
    let writes = coordinator.turn(vec![start(1)], now);
    let [append] = <[_; 1]>::try_from(writes.appends).expect("one append");
    let outcome = crate::turn::Appended::Stored { stream_seq: 1 };
    coordinator.appended(vec![(append.id, outcome)], now);
    (append.id, append.index_put)
}

/// An owned shard asks for its reservations at once; until they are stored a start writes its
/// own index entry first, after that it takes the oldest reserved id and writes none.
#[test]
fn a_start_takes_a_reserved_id_once_its_entry_is_stored() {
    let mut coordinator = coordinator(0);
    let refill = owned_with_refill(&mut coordinator, NOW);
    assert_eq!(refill.len(), RESERVED_PER_SHARD);
    for (key, id) in &refill {
        assert_eq!(*key, index_key(0, *id), "each key names its id");
    }
    let (id, index_put) = started(&mut coordinator, NOW + 1);
    assert_eq!(index_put, Some(index_key(0, id)), "nothing is stored yet");
    assert!(refill.iter().all(|(_, reserved)| *reserved != id));

    let ids = sorted(&refill);
    turn(
        &mut coordinator,
        vec![Input::Reserved(ids.clone())],
        NOW + 2,
    );
    let (id, index_put) = started(&mut coordinator, NOW + 3);
    assert_eq!(
        (id, index_put),
        (ids[0], None),
        "the oldest, already indexed"
    );
    let (id, _) = started(&mut coordinator, NOW + 4);
    assert_eq!(id, ids[1]);
}

/// Half the reservations used, a refill tops the shard up; not before.
#[test]
fn a_shard_is_refilled_once_half_its_reservations_are_used() {
    let mut coordinator = coordinator(0);
    let refill = owned_with_refill(&mut coordinator, NOW);
    let ids = sorted(&refill);
    let effects = turn(&mut coordinator, vec![Input::Reserved(ids)], NOW + 1);
    assert!(effects.reserve.is_empty(), "the shard is full");
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
/// refilled, and the next start writes its own entry and asks for a refill.
#[test]
fn an_old_reservation_is_deleted_not_used() {
    let mut coordinator = coordinator(0);
    let refill = owned_with_refill(&mut coordinator, NOW);
    let ids = sorted(&refill);
    turn(
        &mut coordinator,
        vec![Input::Reserved(ids.clone())],
        NOW + 1,
    );
    let late = NOW + USE_WITHIN_MS;
    let effects = turn(&mut coordinator, Vec::new(), late);
    let keys: Vec<String> = ids.iter().map(|id| index_key(0, *id)).collect();
    assert_eq!(effects.index_deletes, keys, "every one, in id order");
    assert!(
        effects.reserve.is_empty(),
        "no start wanted one: none asked for"
    );
    let writes = coordinator.turn(vec![start(1)], late + 1);
    let [append] = <[_; 1]>::try_from(writes.appends).expect("one append");
    assert!(!ids.contains(&append.id));
    assert_eq!(append.index_put, Some(index_key(0, append.id)));
    let outcome = crate::turn::Appended::Stored { stream_seq: 1 };
    let effects = coordinator.appended(vec![(append.id, outcome)], late + 1);
    assert_eq!(
        effects.reserve.len(),
        RESERVED_PER_SHARD,
        "a start found none: refilled"
    );
}

/// A shard given up deletes its reservations: those stored at once, those still being written
/// when their entries are reported stored.
#[test]
fn a_lost_shard_deletes_its_reservations() {
    let mut coordinator = coordinator(0);
    let refill = owned_with_refill(&mut coordinator, NOW);
    let ids = sorted(&refill);
    let (stored, writing) = ids.split_at(4);
    turn(
        &mut coordinator,
        vec![Input::Reserved(stored.to_vec())],
        NOW + 1,
    );
    let effects = turn(&mut coordinator, vec![Input::LeaseLost(0)], NOW + 2);
    let keys: Vec<String> = stored.iter().map(|id| index_key(0, *id)).collect();
    assert_eq!(effects.index_deletes, keys);
    assert!(
        effects.reserve.is_empty(),
        "no refill for a shard not owned"
    );
    let effects = turn(
        &mut coordinator,
        vec![Input::Reserved(writing.to_vec())],
        NOW + 3,
    );
    let keys: Vec<String> = writing.iter().map(|id| index_key(0, *id)).collect();
    assert_eq!(effects.index_deletes, keys);
}

/// An index scan passes this coordinator's own reservations by: they have no log yet and are no
/// execution to load.
#[test]
fn an_index_scan_does_not_load_the_coordinator_s_own_reservations() {
    let mut coordinator = coordinator(0);
    let refill = owned_with_refill(&mut coordinator, NOW);
    let ids = sorted(&refill);
    let (stored, writing) = ids.split_at(4);
    turn(
        &mut coordinator,
        vec![Input::Reserved(stored.to_vec())],
        NOW + 1,
    );
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
