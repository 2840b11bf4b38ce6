//! Every question a hub replays, with its outcome, for the task drawer: the state machine keeps
//! only the open ones, and no answers.

use std::collections::HashMap;

use trellis_core::ids::TaskInstanceId;
use trellis_proto::v1;

use crate::views::AskedQuestionView;

/// The questions of one execution by asking instance.
#[derive(Debug, Default)]
pub(super) struct Questions {
    by_instance: HashMap<TaskInstanceId, Vec<AskedQuestionView>>,
    /// Question id → the instance that asked it.
    asked_by: HashMap<String, TaskInstanceId>,
}

impl Questions {
    /// Keeps what `event` says of a question (asked, answered, expired); other events change
    /// nothing.
    pub(super) fn note(&mut self, event: &v1::Event) {
        use v1::event::Kind;
        match &event.kind {
            Some(Kind::QuestionAsked(e)) => {
                let (Ok(instance), Some(question)) = (
                    e.task_instance_id.parse::<TaskInstanceId>(),
                    e.question.as_ref(),
                ) else {
                    return;
                };
                self.asked_by.insert(question.question_id.clone(), instance);
                self.by_instance
                    .entry(instance)
                    .or_default()
                    .push(AskedQuestionView::asked(question));
            }
            Some(Kind::QuestionAnswered(e)) => {
                if let Some(view) = self.question_mut(&e.question_id) {
                    view.outcome = "answered";
                    view.answer = Some(e.answer.clone());
                }
            }
            Some(Kind::QuestionExpired(e)) => {
                if let Some(view) = self.question_mut(&e.question_id) {
                    view.outcome = "expired";
                }
            }
            _ => {}
        }
    }

    /// The questions `instance` asked, oldest first.
    pub(super) fn asked_by(&self, instance: TaskInstanceId) -> &[AskedQuestionView] {
        self.by_instance.get(&instance).map_or(&[], Vec::as_slice)
    }

    fn question_mut(&mut self, id: &str) -> Option<&mut AskedQuestionView> {
        let instance = self.asked_by.get(id)?;
        self.by_instance
            .get_mut(instance)?
            .iter_mut()
            .find(|view| view.question_id == id)
    }
}
