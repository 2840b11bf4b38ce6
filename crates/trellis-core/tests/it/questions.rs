//! Questions whose asker goes away: a member waiting for an answer when its group settles
//! without it.

use trellis_core::ids::{GroupId, QuestionId};
use trellis_core::machine::{
    Applied, Command, EventBody, ExecutionState, GroupRule, Ignored, Question, SubtaskSpec,
    TimeoutAction, Usage,
};
use trellis_core::record::TaskState;

use crate::common::{PlanBuilder, Sim};

fn running(sim: &Sim) -> Vec<trellis_core::ids::TaskInstanceId> {
    let mut running: Vec<_> = sim.exec.instances_in(TaskState::Running).collect();
    running.sort();
    running
}

fn complete(sim: &mut Sim, instance: trellis_core::ids::TaskInstanceId) {
    let attempt = sim.exec.attempt(instance).expect("instance exists");
    let applied = sim.apply(EventBody::TaskCompleted {
        instance,
        attempt,
        output: serde_json::json!("done"),
        usage: Usage::default(),
    });
    assert!(
        matches!(applied, Ok(Applied::Changed { .. })),
        "{applied:?}"
    );
}

#[test]
fn a_member_cancelled_by_its_settled_group_takes_its_question_with_it() {
    let mut sim = Sim::new(
        PlanBuilder::new()
            .options(|o| o.pause_on_human_review = true)
            .task("fan", &[])
            .build(),
    );
    sim.decide();
    let parent = running(&sim)[0];
    let group = GroupId::derived(sim.now, 1);
    let members = (0..2)
        .map(|m| SubtaskSpec {
            task_type: "noop".into(),
            queue: None,
            input: serde_json::json!(m),
        })
        .collect();
    sim.apply(EventBody::SubtasksSpawned {
        instance: parent,
        attempt: 1,
        group,
        rule: GroupRule::FirstSuccess,
        members,
    })
    .expect("spawned");
    sim.decide();
    let [asker, other] = running(&sim)[..] else {
        panic!("two members run: {:?}", running(&sim));
    };
    let question = Question {
        id: QuestionId::derived(sim.now, 2),
        question_type: "approval".into(),
        priority: "low".into(),
        text: "ok?".into(),
        options: vec![],
        expires_at_ms: Some(sim.now + 500),
        timeout_action: TimeoutAction::Answer("default".into()),
    };
    sim.apply(EventBody::QuestionAsked {
        instance: asker,
        attempt: 1,
        question: question.clone(),
    })
    .expect("asked");
    assert_eq!(sim.exec.state(), ExecutionState::WaitingForHuman);

    // The other member's success settles the group and cancels the one waiting for a human.
    complete(&mut sim, other);
    assert_eq!(sim.exec.resumptions_of(group), 1);
    assert_eq!(sim.exec.instance_state(asker), Some(TaskState::Cancelled));
    assert!(
        sim.exec.open_questions().is_empty(),
        "the cancelled member's question is withdrawn"
    );
    assert_eq!(sim.exec.open_question(question.id), None);
    assert_eq!(
        sim.exec.state(),
        ExecutionState::Running,
        "nothing waits for a human any more"
    );

    // Neither its expiry nor a late answer continues the cancelled member.
    sim.advance(1_000);
    let commands = sim.exec.decide(sim.now);
    assert!(
        !commands
            .iter()
            .any(|c| matches!(c, Command::ExpireQuestion { .. })),
        "a withdrawn question does not expire: {commands:?}"
    );
    sim.decide();
    assert_eq!(
        sim.apply(EventBody::QuestionAnswered {
            question: question.id,
            answer: "yes".into(),
        }),
        Ok(Applied::Ignored(Ignored::StaleAttempt))
    );
    assert_eq!(sim.exec.question_continuation(question.id), None);
    assert_eq!(sim.exec.instance_state(asker), Some(TaskState::Cancelled));

    // The resumed parent is the only work left, and the execution ends with nothing unsettled.
    let [resumed] = running(&sim)[..] else {
        panic!("only the resumed parent runs: {:?}", running(&sim));
    };
    complete(&mut sim, resumed);
    sim.decide();
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
    for record in sim.exec.records() {
        assert!(
            record.state.is_terminal(),
            "{} is {:?} in a completed execution",
            record.task_id,
            record.state
        );
    }
    assert!(sim.replay() == sim.exec, "replay rebuilds the same state");
}
