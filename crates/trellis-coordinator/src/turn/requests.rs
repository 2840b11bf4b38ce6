//! Callers' requests: starts, controls, retries, answers to questions, reads and observers.
//!
//! A write is answered once its events are stored ([`Coordinator::reply_after`]); a read or a
//! refusal at once. A request about an execution that is not in memory waits for it to be loaded
//! (or for its shard to be recovered).

use trellis_core::ids::{ExecutionId, QuestionId, TaskInstanceId};
use trellis_core::machine::{Applied, Event, EventBody, ExecutionState, Ignored};
use trellis_wire::read;

use super::admission::Started;
use super::{Action, Answer, Coordinator, Error, History, Observation, ReplyTo, Request, Waiting};

impl Coordinator {
    pub(super) fn request(&mut self, reply: ReplyTo, request: Request, now: u64) {
        if let Some(id) = request.execution()
            && !self.executions.contains_key(&id)
        {
            self.load(id, Waiting { reply, request });
            return;
        }
        if matches!(request, Request::Start { .. })
            && self.owned.is_empty()
            && !self.acquiring.is_empty()
        {
            self.parked.push(Waiting { reply, request });
            return;
        }
        match request {
            Request::Start {
                plan,
                options,
                principal,
                traceparent,
                follow,
            } => {
                match self.start(*plan, options, &principal, traceparent, now) {
                    Ok(Started::Started { id, created }) => {
                        self.mark(id);
                        // The caller learns the id once `ExecutionStarted` is durable.
                        match follow {
                            Some(follow) => {
                                self.pending.follows.push((reply, id, created, follow));
                            }
                            None => {
                                let started = Ok(Answer::Started { id, created });
                                self.reply_after(reply, Some(id), started);
                            }
                        }
                    }
                    Ok(Started::Build {
                        id,
                        at_ms,
                        prepared,
                    }) => {
                        let build = Answer::Build {
                            id,
                            at_ms,
                            plan: prepared,
                        };
                        self.reply_now(reply, Ok(build));
                    }
                    Err(err) => self.reply_now(reply, Err(err)),
                }
            }
            Request::List { scope } => {
                let mut all: Vec<_> = self
                    .executions
                    .iter()
                    .filter(|(_, live)| scope.allows(&live.namespace))
                    .map(|(id, live)| live.summary(*id, now))
                    .collect();
                all.sort_by(|a, b| b.execution_id.cmp(&a.execution_id));
                self.reply_now(reply, Ok(Answer::Executions(all)));
            }
            Request::Workers {
                queue,
                include_terminated,
            } => {
                let workers = self.workers.list(now, &queue, include_terminated);
                let breakers = self.breakers_list(&queue);
                self.reply_now(reply, Ok(Answer::Workers(workers, breakers)));
            }
            Request::On { id, scope, action } => {
                // Another namespace's execution does not exist for this caller: the same answer
                // as an unknown id, and nothing is read or changed.
                let allowed = self
                    .executions
                    .get(&id)
                    .is_some_and(|live| scope.allows(&live.namespace));
                if !allowed {
                    self.reply_now(reply, Err(Error::not_found(id)));
                    return;
                }
                if let Some(live) = self.executions.get_mut(&id) {
                    live.touched_ms = now;
                }
                self.on(reply, id, action, now);
            }
        }
    }

    /// Carries out `action` on execution `id`, which is in memory and the caller may act on.
    fn on(&mut self, reply: ReplyTo, id: ExecutionId, action: Action, now: u64) {
        let write = match action {
            Action::Pause {
                reason,
                scope,
                mode,
            } => self
                .control(
                    id,
                    EventBody::PauseRequested {
                        reason,
                        scope,
                        mode,
                    },
                    now,
                )
                .map(Answer::State),
            Action::Resume(scope) => self
                .control(id, EventBody::ResumeRequested { scope }, now)
                .map(Answer::State),
            Action::Cancel(reason) => self
                .control(id, EventBody::CancelRequested { reason }, now)
                .map(Answer::State),
            Action::Retry => self.retry(id, now).map(Answer::Run),
            Action::Answer { question, answer } => {
                self.answer(id, question, answer, now)
                    .map(|(sequence, continuation)| Answer::Answered {
                        sequence,
                        continuation,
                    })
            }
            Action::Checkpoint => {
                self.checkpoint_requested(reply, id);
                return;
            }
            Action::Get => {
                let answer = self.executions.get(&id).map_or_else(
                    || Err(Error::not_found(id)),
                    |live| Ok(Answer::Execution(Box::new(live.summary(id, now)))),
                );
                self.reply_now(reply, answer);
                return;
            }
            Action::Graph => {
                let answer = match self.executions.get(&id) {
                    None => Err(Error::not_found(id)),
                    Some(live) => trellis_core::graph::build(live.machine.records())
                        .map(|graph| Answer::Graph(read::graph_to_proto(&graph)))
                        .map_err(|err| {
                            Error::new(
                                super::ErrorKind::Internal,
                                format!("execution graph of {id}: {err}"),
                            )
                        }),
                };
                self.reply_now(reply, answer);
                return;
            }
            Action::Observe {
                from,
                progress_only,
            } => {
                let answer = self.observation(id, from, progress_only, now);
                self.reply_now(reply, answer.map(Answer::Observation));
                return;
            }
        };
        match write {
            Ok(answer) => {
                self.mark(id);
                self.reply_after(reply, Some(id), Ok(answer));
            }
            Err(err) => self.reply_now(reply, Err(err)),
        }
    }

    /// An observer's start: execution `id`'s history from event `from` (or its progress alone),
    /// as far as it is stored.
    pub(super) fn observation(
        &self,
        id: ExecutionId,
        from: u64,
        progress_only: bool,
        now: u64,
    ) -> Result<Observation, Error> {
        let live = self
            .executions
            .get(&id)
            .ok_or_else(|| Error::not_found(id))?;
        let terminal = live.machine.state().is_terminal() && live.pending.is_empty();
        let from = from.max(1);
        let (backfill, history) = if progress_only {
            (None, History::default())
        } else {
            (
                (from < live.log_base).then(|| (from, live.log_base - 1)),
                live.history(from.max(live.log_base)),
            )
        };
        Ok(Observation {
            execution: id,
            backfill,
            history,
            terminal,
            // Not from events this turn has yet to store: a progress-only observer then hears
            // of them from their live batch.
            progress: (terminal || (progress_only && live.pending.is_empty()))
                .then(|| live.progress(id, now)),
            progress_only,
        })
    }

    /// Records a human's answer to an open question.
    fn answer(
        &mut self,
        id: ExecutionId,
        question: QuestionId,
        answer: String,
        now: u64,
    ) -> Result<(u64, Option<TaskInstanceId>), Error> {
        if answer.len() > self.limits.max_payload_bytes {
            return Err(Error::invalid(format!(
                "answer: {} bytes, over the limit of {} bytes (limits.max_payload_bytes)",
                answer.len(),
                self.limits.max_payload_bytes
            )));
        }
        let live = self
            .executions
            .get_mut(&id)
            .ok_or_else(|| Error::not_found(id))?;
        let options = live
            .machine
            .open_question(question)
            .map(|open| open.options.clone())
            .unwrap_or_default();
        if !options.is_empty() && !options.contains(&answer) {
            return Err(Error::invalid(format!(
                "answer: {answer:?} is not one of the options of question {question}: {}",
                options.join(", ")
            )));
        }
        let event = Event {
            at_ms: now,
            body: EventBody::QuestionAnswered { question, answer },
        };
        match live.record(id, event, &self.metrics) {
            Ok(Applied::Changed { .. }) => {
                Ok((live.seq, live.machine.question_continuation(question)))
            }
            Ok(Applied::Ignored(Ignored::StaleAttempt)) => Err(Error::precondition(format!(
                "question {question} was withdrawn: the task that asked it was cancelled"
            ))),
            Ok(Applied::Ignored(Ignored::Duplicate)) => Err(Error::precondition(format!(
                "question {question} was already answered"
            ))),
            Err(err) => Err(Error::precondition(err.to_string())),
        }
    }

    /// Pauses, resumes or cancels an execution; returns its state afterwards (a
    /// `v1::ExecutionState`).
    fn control(&mut self, id: ExecutionId, body: EventBody, now: u64) -> Result<i32, Error> {
        let live = self
            .executions
            .get_mut(&id)
            .ok_or_else(|| Error::not_found(id))?;
        live.record(id, Event { at_ms: now, body }, &self.metrics)
            .map_err(|err| Error::precondition(err.to_string()))?;
        Ok(read::execution_state_to_proto(live.machine.state()))
    }

    /// Starts a new run of a failed or cancelled execution; returns its number.
    fn retry(&mut self, id: ExecutionId, now: u64) -> Result<u32, Error> {
        let live = self
            .executions
            .get_mut(&id)
            .ok_or_else(|| Error::not_found(id))?;
        let state = live.machine.state();
        if !matches!(state, ExecutionState::Failed | ExecutionState::Cancelled) {
            return Err(Error::precondition(format!(
                "execution {id} is {}; only a failed or cancelled execution can run again",
                state.as_str()
            )));
        }
        let run = live.machine.run_number() + 1;
        let event = Event {
            at_ms: now,
            body: EventBody::RunStarted { run },
        };
        live.record(id, event, &self.metrics)
            .map_err(|err| Error::precondition(err.to_string()))?;
        live.index_put = true;
        tracing::info!(%id, run, "execution run started");
        Ok(run)
    }
}
