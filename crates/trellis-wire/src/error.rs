//! What goes wrong reading a wire message, and where: [`ConvertError`] names the offending field
//! by its path as the `.proto` files spell it (`task_result.completed.output`), with what is wrong
//! with it ([`ConvertErrorKind`]).
//!
//! The crate's readers build the path with `At`, a linked list on the stack that costs nothing
//! until an error renders it, and read every field with the helpers here, which never panic:
//! ids, JSON payloads, instants and enum values are checked and refused with a precise error.

use std::str::FromStr;

use serde_json::Value;
use thiserror::Error;

/// A wire message that does not describe a valid core value: which field, and what is wrong with
/// it. Displays as `<path>: <problem>`.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{path}: {kind}")]
pub struct ConvertError {
    path: String,
    kind: ConvertErrorKind,
}

impl ConvertError {
    /// Returns the path of the offending field, e.g. `task_result.completed.output`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Returns what is wrong with the field.
    pub fn kind(&self) -> &ConvertErrorKind {
        &self.kind
    }
}

/// What is wrong with a field.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConvertErrorKind {
    /// The bytes are not a protobuf encoding of the expected message.
    #[error("invalid protobuf: {0}")]
    Decode(String),
    /// A required field or `oneof` is not set.
    #[error("missing")]
    Missing,
    /// An id is not a UUID; holds the start of the text.
    #[error("invalid uuid {0:?}")]
    InvalidUuid(String),
    /// A JSON payload does not parse; holds the parser's message.
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    /// An enum field holds a number the contract does not define.
    #[error("unknown enum value {0}")]
    UnknownEnumValue(i32),
    /// An enum field is `*_UNSPECIFIED` where a value is required.
    #[error("must not be unspecified")]
    Unspecified,
    /// An instant is before the Unix epoch.
    #[error("negative instant {0}")]
    NegativeInstant(i64),
    /// The message contradicts itself, e.g. a quorum with a rule that is not a quorum.
    #[error("{0}")]
    Inconsistent(&'static str),
}

/// Most characters of an offending text copied into an error.
const SHOWN_CHARS: usize = 64;

/// The path of the field being decoded, a linked list on the stack: it costs nothing until an
/// error renders it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At<'a> {
    parent: Option<&'a At<'a>>,
    segment: Segment<'a>,
}

#[derive(Clone, Copy, Debug)]
enum Segment<'a> {
    Field(&'a str),
    Index(usize),
}

impl<'a> At<'a> {
    /// Returns the path of a message decoded from the top, named `name`.
    pub(crate) const fn root(name: &'static str) -> At<'static> {
        At {
            parent: None,
            segment: Segment::Field(name),
        }
    }

    /// Returns the path of field `name` of this one.
    pub(crate) fn field(&'a self, name: &'a str) -> At<'a> {
        At {
            parent: Some(self),
            segment: Segment::Field(name),
        }
    }

    /// Returns the path of element `idx` of this repeated field.
    pub(crate) fn index(&'a self, idx: usize) -> At<'a> {
        At {
            parent: Some(self),
            segment: Segment::Index(idx),
        }
    }

    /// Returns the error `kind` at this path, rendering the path.
    pub(crate) fn error(&self, kind: ConvertErrorKind) -> ConvertError {
        let mut segments = Vec::new();
        let mut at = Some(self);
        while let Some(current) = at {
            segments.push(current.segment);
            at = current.parent;
        }
        let mut path = String::new();
        for segment in segments.iter().rev() {
            match segment {
                Segment::Field(name) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(name);
                }
                Segment::Index(idx) => path.push_str(&format!("[{idx}]")),
            }
        }
        ConvertError { path, kind }
    }

    /// Returns the error of a required field left unset, at this path.
    pub(crate) fn missing(&self) -> ConvertError {
        self.error(ConvertErrorKind::Missing)
    }
}

/// Returns the start of an offending text, cut after `SHOWN_CHARS` characters, for an error.
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Reads a required id; an empty text is a missing field.
pub(crate) fn parse_id<T: FromStr>(at: &At<'_>, text: &str) -> Result<T, ConvertError> {
    if text.is_empty() {
        return Err(at.missing());
    }
    text.parse()
        .map_err(|_| at.error(ConvertErrorKind::InvalidUuid(shown(text))))
}

/// Reads an optional id.
pub(crate) fn parse_optional_id<T: FromStr>(
    at: &At<'_>,
    text: Option<&str>,
) -> Result<Option<T>, ConvertError> {
    text.map(|text| parse_id(at, text)).transpose()
}

/// Reads a JSON payload.
pub(crate) fn parse_json(at: &At<'_>, bytes: &[u8]) -> Result<Value, ConvertError> {
    serde_json::from_slice(bytes)
        .map_err(|err| at.error(ConvertErrorKind::InvalidJson(err.to_string())))
}

/// Reads an instant, refusing one before the Unix epoch.
pub(crate) fn parse_instant(at: &At<'_>, unix_ms: i64) -> Result<u64, ConvertError> {
    u64::try_from(unix_ms).map_err(|_| at.error(ConvertErrorKind::NegativeInstant(unix_ms)))
}

/// Reads an enum value the contract defines.
pub(crate) fn parse_enum<E: TryFrom<i32>>(at: &At<'_>, value: i32) -> Result<E, ConvertError> {
    E::try_from(value).map_err(|_| at.error(ConvertErrorKind::UnknownEnumValue(value)))
}

/// Returns a required message field, or the error naming it.
pub(crate) fn required<'m, T>(at: &At<'_>, field: &'m Option<T>) -> Result<&'m T, ConvertError> {
    field.as_ref().ok_or_else(|| at.missing())
}

/// Returns a required text field, or the error naming it when empty.
pub(crate) fn non_empty<'m>(at: &At<'_>, text: &'m str) -> Result<&'m str, ConvertError> {
    if text.is_empty() {
        Err(at.missing())
    } else {
        Ok(text)
    }
}
