//! Fixtures the tests of several contracts share: an instant, ids derived from it, a question.

use trellis_core::ids::{ExecutionId, GroupId, QuestionId, TaskInstanceId};
use trellis_core::machine::{Question, TimeoutAction};

pub(crate) const AT_MS: u64 = 1_760_000_000_123;

pub(crate) fn execution_id() -> ExecutionId {
    ExecutionId::derived(AT_MS, 1)
}

pub(crate) fn instance_id(seed: u128) -> TaskInstanceId {
    TaskInstanceId::derived(AT_MS, seed)
}

pub(crate) fn group_id(seed: u128) -> GroupId {
    GroupId::derived(AT_MS, seed)
}

pub(crate) fn question_id(seed: u128) -> QuestionId {
    QuestionId::derived(AT_MS, seed)
}

pub(crate) fn example_question(timeout_action: TimeoutAction) -> Question {
    Question {
        id: question_id(9),
        question_type: "approval".to_owned(),
        priority: "critical".to_owned(),
        text: "deploy to production?".to_owned(),
        options: vec!["yes".to_owned(), "no".to_owned()],
        expires_at_ms: Some(AT_MS + 60_000),
        timeout_action,
    }
}
