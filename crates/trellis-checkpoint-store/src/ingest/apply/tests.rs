//! The pure part of the read model's writer: messages checked, replicas, runs of records.

use super::*;

fn batch(events: Vec<v1::Event>) -> Vec<u8> {
    v1::EventBatch { events }.encode_to_vec()
}

fn event(execution_id: &str, sequence: u64) -> v1::Event {
    v1::Event {
        execution_id: execution_id.to_owned(),
        sequence,
        timestamp_unix_ms: 1,
        kind: Some(v1::event::Kind::ResumeRequested(
            v1::ResumeRequested::default(),
        )),
    }
}

fn check_rejected(payload: &[u8], expected: &str) {
    let err = decode_message(payload).err().unwrap_or_default();
    assert!(
        err.contains(expected),
        "{err:?} does not contain {expected:?}"
    );
}

/// Each execution's records are handed over once, in one list, the list of a single
/// execution as it is.
#[test]
fn records_of_every_execution_are_concatenated() {
    let parts: Vec<Vec<(u64, u64)>> = (0..3)
        .map(|execution| (0..5).map(|instance| (execution, instance)).collect())
        .collect();
    let all: Vec<(u64, u64)> = parts.iter().flatten().cloned().collect();
    assert_eq!(all.len(), 15);
    assert_eq!(concat(parts.clone()), all);
    assert_eq!(concat(vec![parts[1].clone()]), parts[1]);
    assert_eq!(concat(Vec::<Vec<(u64, u64)>>::new()), Vec::new());
}

#[test]
fn messages_are_checked() {
    let id = uuid::Uuid::now_v7().to_string();
    let other = uuid::Uuid::now_v7().to_string();
    assert!(decode_message(&batch(vec![event(&id, 3), event(&id, 4)])).is_ok());
    check_rejected(b"\xff\xff", "invalid protobuf");
    check_rejected(&batch(vec![]), "without events");
    check_rejected(&batch(vec![event("x", 1)]), "invalid execution id");
    check_rejected(
        &batch(vec![event(&id, 1), event(&other, 2)]),
        "several executions",
    );
    check_rejected(
        &batch(vec![event(&id, 1), event(&id, 3)]),
        "sequence 3 where 2",
    );
    check_rejected(&batch(vec![event(&id, 0)]), "sequence 0");
}

/// The one replay policy: a gap ends the replica (its task instances would be wrong), with
/// a warning naming where; the events are still recorded.
#[test]
fn a_gap_ends_the_replica_and_keeps_the_events() {
    let id = ExecutionId(uuid::Uuid::now_v7());
    let spec = "name: p\ntasks:\n  - {id: a, type: noop}\n";
    let plan = trellis_core::plan::compile_str(spec, &trellis_core::plan::Limits::default())
        .expect("the plan compiles");
    let started = Started {
        plan_name: "p".to_owned(),
        run_number: 1,
        spec: spec.to_owned(),
        started_at_ms: 1,
        compiled_plan: trellis_core::plan::encode(&plan),
        ..Started::default()
    };
    let mut applier = Applier::default();
    applier.track(id, 0);
    let apply = |applier: &mut Applier, payload: Vec<u8>| {
        let message = decode_message(&payload).expect("a well-formed message");
        let mut run = Run::default();
        applier.apply_messages(vec![message], &mut run);
        run.events.len()
    };
    let replica = |applier: &Applier| {
        applier
            .executions
            .get(&id)
            .map(|tracked| (tracked.replica.is_some(), tracked.no_replica))
    };
    let first = batch(vec![log::started_to_proto(id, &started)]);
    assert_eq!(apply(&mut applier, first), 1);
    assert_eq!(replica(&applier), Some((true, false)));
    let after_gap = batch(vec![event(&id.to_string(), 3)]);
    assert_eq!(apply(&mut applier, after_gap), 1);
    assert_eq!(replica(&applier), Some((false, true)));
}

#[test]
fn unknown_kinds_are_kept_as_unknown() {
    let id = uuid::Uuid::now_v7().to_string();
    let mut unknown = event(&id, 1);
    unknown.kind = None;
    let decoded = decode_message(&batch(vec![unknown])).map(|m| m.events.len());
    assert_eq!(decoded, Ok(1));
}
