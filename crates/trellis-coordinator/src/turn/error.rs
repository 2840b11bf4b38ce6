//! The coordinator's domain errors: what went wrong, in words a caller can act on, and a small
//! kind to branch on. `grpc.rs` maps each kind to a gRPC code, in one place.

use trellis_core::ids::ExecutionId;

/// What kind of refusal an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is wrong (a plan that does not compile, an answer that is not an
    /// option, a payload over a limit).
    InvalidArgument,
    /// No such execution, or one the caller may not see.
    NotFound,
    /// The caller may not do this (a namespace or a failure action its quota forbids).
    PermissionDenied,
    /// The execution is not in a state that allows it (retrying a running execution).
    FailedPrecondition,
    /// Not now, or not here: no shard owned, a store that is down.
    Unavailable,
    /// Another coordinator's shard (or one no coordinator holds at the moment): the request is
    /// for the shard's owner, which the gRPC layer forwards it to. `None`: a start that may land
    /// on any shard, and this coordinator owns none.
    NotOwned { shard: Option<u32> },
    /// The execution's log does not replay: it needs an operator's attention.
    DataLoss,
    /// A bug: the coordinator could not do what it should always be able to do.
    Internal,
}

/// A refusal, with a message naming what, where and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    /// Returns an error of `kind` saying `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Returns the answer to a request about an execution that does not exist, or that the caller
    /// may not see (the two read the same, so a namespace learns nothing of another's ids).
    pub fn not_found(id: ExecutionId) -> Self {
        Self::new(ErrorKind::NotFound, format!("no execution {id}"))
    }

    /// Returns the answer to a request about an execution whose log does not replay.
    pub fn needs_attention(broken: &super::Broken) -> Self {
        Self::new(
            ErrorKind::DataLoss,
            format!(
                "execution {} needs attention: its log does not replay at sequence {} ({}); \
                 nothing more is dispatched for it and its task results are kept until the log \
                 is repaired",
                broken.id, broken.sequence, broken.reason
            ),
        )
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub(crate) fn precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::FailedPrecondition, message)
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    pub(crate) fn not_owned(shard: Option<u32>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotOwned { shard }, message)
    }

    pub(crate) fn denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }
}
