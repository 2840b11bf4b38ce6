//! `RecordedSteps` (an entry of the `trellis_steps` KV bucket), as a redelivered attempt reads it
//! to resume after its last durable step. The first byte picks how many steps the assignment
//! itself carries (0–3); the rest is the entry. No input panics; the attempt resumes from the
//! longer list of steps, skips exactly the steps in it, and the next step merges into whatever
//! state it starts from.
//!
//! Run: `cd fuzz && cargo fuzz run nats_recorded_steps corpus/nats_recorded_steps seeds/nats_recorded_steps`

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use trellis_agent_worker::fuzzing;
use trellis_proto::v1::{RecordedStep, ResumeContext, TaskAssignment};

fuzz_target!(|data: &[u8]| {
    let Some((&steer, entry)) = data.split_first() else {
        return;
    };
    let carried: Vec<RecordedStep> = (1..=usize::from(steer % 4))
        .map(|step_idx| RecordedStep {
            step: format!("step-{step_idx}"),
            state: serde_json::to_vec(&json!({ "last": format!("step-{step_idx}") }))
                .expect("a JSON value serializes"),
        })
        .collect();
    let mut assignment = TaskAssignment {
        task_instance_id: "fuzz-instance".to_owned(),
        task_type: "steps".to_owned(),
        attempt: 1,
        resume: (!carried.is_empty()).then(|| ResumeContext {
            steps: carried.clone(),
            ..ResumeContext::default()
        }),
        ..TaskAssignment::default()
    };
    let Some((done, mut state)) = fuzzing::resume_from_bucket(&mut assignment, entry) else {
        return;
    };
    let steps = assignment
        .resume
        .map(|resume| resume.steps)
        .unwrap_or_default();
    assert!(
        steps.len() >= carried.len(),
        "the attempt lost steps it carried"
    );
    for name in &done {
        assert!(
            steps.iter().any(|step| &step.step == name),
            "skips a step it has no record of"
        );
    }
    for step in &steps {
        assert!(
            done.binary_search(&step.step).is_ok(),
            "runs a recorded step again"
        );
    }
    fuzzing::merge_step(
        &mut state,
        json!({ "trace": ["next"], "done": { "next": true } }),
    );
    let again = state.clone();
    fuzzing::merge_step(&mut state, again);
});
