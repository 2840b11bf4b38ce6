//! Parsing: text or bytes to a [`PlanSpec`], and `name=value` param pairs to values.
//!
//! Parsing stops at the first syntax or type error (that is all a parser can do); the error
//! carries the path of the offending value and its line and column.

use std::collections::BTreeMap;

use super::errors::{Location, PlanError, PlanErrorKind, PlanErrors};
use super::limits::Limits;
use super::spec::PlanSpec;

/// Parses raw bytes (checks size and UTF-8 first, skips a byte-order mark) into a spec.
pub fn parse_spec_bytes(bytes: &[u8], limits: &Limits) -> Result<PlanSpec, PlanErrors> {
    check_size(bytes.len(), limits)?;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_spec(text, limits),
        Err(e) => {
            let valid = &bytes[..e.valid_up_to()];
            let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
            let column =
                valid.len() - valid.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + 1;
            Err(PlanErrors::one(PlanError {
                location: Some(Location { line, column }),
                ..PlanError::new(
                    PlanErrorKind::Encoding,
                    "",
                    format!(
                        "input is not valid UTF-8 (invalid byte at offset {})",
                        e.valid_up_to()
                    ),
                )
            }))
        }
    }
}

/// Parses a YAML or JSON spec. Input starting with `{` is read as JSON first, so JSON gets JSON's
/// error messages; if it is not JSON it is read as YAML (flow style).
pub fn parse_spec(text: &str, limits: &Limits) -> Result<PlanSpec, PlanErrors> {
    check_size(text.len(), limits)?;
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.is_empty() {
        return Err(PlanErrors::one(PlanError::new(
            PlanErrorKind::Empty,
            "",
            "plan is empty",
        )));
    }
    if trimmed.starts_with('{') {
        let mut de = serde_json::Deserializer::from_str(trimmed);
        let json_error = match serde_path_to_error::deserialize(&mut de) {
            Ok(spec) => match de.end() {
                Ok(()) => return Ok(spec),
                Err(e) => json_error(String::new(), &e),
            },
            Err(e) if e.inner().is_data() => {
                return Err(PlanErrors::one(json_error(e.path().to_string(), e.inner())));
            }
            Err(e) => json_error(e.path().to_string(), e.inner()),
        };
        // Not JSON; YAML flow style also starts with `{`.
        return parse_yaml(trimmed).map_err(|_| PlanErrors::one(json_error));
    }
    parse_yaml(text).map_err(PlanErrors::one)
}

fn check_size(len: usize, limits: &Limits) -> Result<(), PlanErrors> {
    if len > limits.max_input_bytes {
        return Err(PlanErrors::one(PlanError::new(
            PlanErrorKind::TooLarge,
            "",
            format!(
                "input is {len} bytes, over the limit of {} bytes",
                limits.max_input_bytes
            ),
        )));
    }
    Ok(())
}

fn parse_yaml(text: &str) -> Result<PlanSpec, PlanError> {
    // Most plans parse: they are read without tracking where the parser is, which costs a
    // string per key read. Only a plan that fails is read again, with the tracking, for the
    // path its error names (the same text fails at the same place).
    if let Ok(spec) = serde_yaml_ng::from_str(text) {
        return Ok(spec);
    }
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let location = e.inner().location().map(|l| Location {
            line: l.line(),
            column: l.column(),
        });
        parse_error(e.path().to_string(), e.inner().to_string(), location)
    })
}

fn json_error(path: String, inner: &serde_json::Error) -> PlanError {
    let location = (inner.line() > 0).then(|| Location {
        line: inner.line(),
        column: inner.column(),
    });
    parse_error(path, inner.to_string(), location)
}

/// Builds a parse error, removing from the parser's message the path and location it repeats.
fn parse_error(path: String, mut message: String, location: Option<Location>) -> PlanError {
    if let Some(at) = location {
        let suffix = format!(" at line {} column {}", at.line, at.column);
        if message.ends_with(&suffix) {
            message.truncate(message.len() - suffix.len());
        }
    }
    // `?` marks a position the parser could not name (a syntax error inside a value).
    let mut path = path;
    while let Some(rest) = path.strip_suffix('?') {
        path = rest.strip_suffix('.').unwrap_or(rest).to_owned();
    }
    let path = if path == "." { String::new() } else { path };
    // serde_yaml_ng starts its messages with its own path, which may stop short of ours (for an
    // unknown field it names the map, we name the field).
    if let Some((prefix, rest)) = message.split_once(": ")
        && !prefix.is_empty()
        && path.starts_with(prefix)
    {
        message = rest.to_owned();
    }
    let hint = super::suggest::unknown_name_hint(&message);
    PlanError {
        location,
        hint,
        ..PlanError::new(PlanErrorKind::Parse, path, message)
    }
}

/// Reads `name=value` pairs given on a command line or in a request: each value is parsed as
/// JSON (`3`, `true`, `["api","web"]`, `"quoted"`) and, when it is not JSON, taken as a plain
/// string (so `env=prod` works). A name given twice is an error.
pub fn parse_param_values(
    pairs: &[(String, String)],
) -> Result<BTreeMap<String, serde_json::Value>, PlanErrors> {
    let mut res = BTreeMap::new();
    let mut errors = Vec::new();
    for (name, text) in pairs {
        let value =
            serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.clone()));
        if res.insert(name.clone(), value).is_some() {
            errors.push(PlanError::new(
                PlanErrorKind::InvalidValue,
                format!("params.{name}"),
                format!("param {name:?} is given more than once"),
            ));
        }
    }
    if errors.is_empty() {
        Ok(res)
    } else {
        Err(PlanErrors::from_vec(errors))
    }
}
