//! What the worker takes from NATS, read strictly: a task message becomes an assignment only
//! when it names its instance and type and its ids are UUIDs, and a cancel is acted on only when
//! it names the subject's instance and a real attempt. Pure functions, shared with the fuzz
//! targets.

use prost::Message as _;
use trellis_proto::v1::{self, TaskAssignment};

/// Why a task message was set aside instead of run.
#[derive(Debug)]
pub(crate) enum SetAside {
    /// It is not a `TaskAssignment`.
    Corrupt(prost::DecodeError),
    /// It has no task instance id or no task type, so it can be neither run nor reported.
    Incomplete,
    /// Its execution or instance id is not a UUID, as every id a coordinator makes is: it did
    /// not come from a coordinator, and its result could not be addressed (an id goes into the
    /// result's `Nats-Msg-Id` header).
    BadId(&'static str),
}

/// Reads a task message as the worker takes it: a `TaskAssignment` naming its instance and type
/// by UUIDs. The rest is the handler's to judge.
pub(crate) fn accept_assignment(payload: &[u8]) -> Result<TaskAssignment, SetAside> {
    let assignment = TaskAssignment::decode(payload).map_err(SetAside::Corrupt)?;
    if assignment.task_instance_id.is_empty() || assignment.task_type.is_empty() {
        return Err(SetAside::Incomplete);
    }
    if uuid::Uuid::try_parse(&assignment.execution_id).is_err() {
        return Err(SetAside::BadId("execution_id"));
    }
    if uuid::Uuid::try_parse(&assignment.task_instance_id).is_err() {
        return Err(SetAside::BadId("task_instance_id"));
    }
    Ok(assignment)
}

/// A cancel request as the worker acts on it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CancelRequest {
    /// The instance to stop: the message's, which is also the subject's last token
    /// (`trellis.cancel.<instance>`).
    pub(crate) task_instance_id: String,
    /// The attempt to stop (from 1); another attempt of the instance runs on.
    pub(crate) attempt: u32,
    /// Why, as the failed attempt reports it; never empty.
    pub(crate) reason: String,
    /// Stop at the next durable step instead (a pause in `preempt` mode).
    pub(crate) preempt: bool,
}

/// Reads a `CancelTask` received on `subject`. Only a cancel as a coordinator sends it is acted
/// on: it names the subject's instance and a real attempt. Anything less (an empty message, one
/// naming only the execution, another instance, attempt 0) is refused with why, so a stray or
/// hostile message cannot stop every attempt of a task for good.
pub(crate) fn cancel_request(subject: &str, payload: &[u8]) -> Result<CancelRequest, String> {
    let request = v1::CancelTask::decode(payload).map_err(|error| error.to_string())?;
    let token = subject.rsplit('.').next().unwrap_or_default();
    if request.task_instance_id.is_empty() {
        return Err("it names no task_instance_id".to_owned());
    }
    if request.task_instance_id != token {
        return Err(format!(
            "its task_instance_id {:?} is not the subject's {token:?}",
            request.task_instance_id
        ));
    }
    if request.attempt == 0 {
        return Err("it names no attempt".to_owned());
    }
    Ok(CancelRequest {
        task_instance_id: request.task_instance_id,
        attempt: request.attempt,
        reason: if request.reason.is_empty() {
            "cancel requested".to_owned()
        } else {
            request.reason
        },
        preempt: request.preempt,
    })
}
