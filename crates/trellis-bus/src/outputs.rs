//! Task outputs stored by reference. An output larger than the worker's inline limit
//! ([`DEFAULT_INLINE_LIMIT`]) does not travel in the result message: the worker puts it in the
//! JetStream Object Store bucket `trellis_outputs` and reports a *reference* in its place, a JSON
//! object with the single key `$trellis_ref`:
//!
//! ```json
//! {"$trellis_ref": {"bucket": "trellis_outputs", "object": "<execution>/<instance>/<attempt>",
//!                   "size": 5000002, "sha256": "9f86d0…"}}
//! ```
//!
//! The reference is an ordinary output to everything between the worker and the reader: the
//! result, the execution log, checkpoints and the read model carry it as they carry any output.
//! Whoever hands an output to code resolves it first with [`Outputs::get`], which checks the size
//! and the SHA-256: workers for upstream outputs and group summaries, the coordinator for
//! `GetTaskOutput` (`trellis output`). The key `$trellis_ref` is therefore reserved: a handler's
//! output that is an object with that single key is refused.

use std::fmt::Write as _;
use std::time::Duration;

use async_nats::jetstream::{self, object_store, stream};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::Error;

/// The Object Store bucket of outputs stored by reference.
pub const OUTPUTS_BUCKET: &str = "trellis_outputs";

/// The key of a reference object.
pub const REF_KEY: &str = "$trellis_ref";

/// Outputs larger than this (bytes of UTF-8 JSON) are stored by reference unless the worker is told
/// otherwise (`--output-inline-limit`).
pub const DEFAULT_INLINE_LIMIT: usize = 256 * 1024;

/// How long the bucket keeps an output. A reader after that is told the object is missing.
pub const OUTPUTS_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Where an output stored by reference is, how large it is and its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputRef {
    pub bucket: String,
    pub object: String,
    pub size: u64,
    /// Lower-case hex SHA-256 of the output's bytes.
    pub sha256: String,
}

impl OutputRef {
    /// Returns the reference an output's JSON stands for, or `None` for an ordinary output. Cheap
    /// for ordinary outputs: only bytes that begin like a reference are parsed.
    pub fn from_output(bytes: &[u8]) -> Option<OutputRef> {
        OutputRef::from_value(&serde_json::from_slice(shaped_like_ref(bytes)?).ok()?)
    }

    /// Returns the reference a JSON value stands for: an object whose only key is `$trellis_ref`
    /// with a bucket, an object name, a size and a 64-digit hex checksum.
    pub fn from_value(value: &Value) -> Option<OutputRef> {
        let object = value.as_object()?;
        if object.len() != 1 {
            return None;
        }
        let inner = object.get(REF_KEY)?.as_object()?;
        let sha256 = inner.get("sha256")?.as_str()?;
        if !is_sha256_hex(sha256) {
            return None;
        }
        Some(OutputRef {
            bucket: inner.get("bucket")?.as_str()?.to_owned(),
            object: inner.get("object")?.as_str()?.to_owned(),
            size: inner.get("size")?.as_u64()?,
            sha256: sha256.to_ascii_lowercase(),
        })
    }

    /// Returns the reference as the JSON value that stands for the output.
    pub fn to_value(&self) -> Value {
        json!({REF_KEY: {
            "bucket": self.bucket,
            "object": self.object,
            "size": self.size,
            "sha256": self.sha256,
        }})
    }

    /// Returns the reference as output bytes (compact JSON).
    pub fn to_output(&self) -> Vec<u8> {
        self.to_value().to_string().into_bytes()
    }

    /// Returns the reference as `GetTaskOutput` carries it.
    pub fn to_proto(&self) -> trellis_proto::v1::OutputReference {
        trellis_proto::v1::OutputReference {
            bucket: self.bucket.clone(),
            object: self.object.clone(),
            size: self.size,
            sha256: self.sha256.clone(),
        }
    }

    /// Reads a reference from `GetTaskOutput`; `None` when its checksum is not 64 hex digits.
    pub fn from_proto(reference: &trellis_proto::v1::OutputReference) -> Option<OutputRef> {
        is_sha256_hex(&reference.sha256).then(|| OutputRef {
            bucket: reference.bucket.clone(),
            object: reference.object.clone(),
            size: reference.size,
            sha256: reference.sha256.to_ascii_lowercase(),
        })
    }

    /// `trellis_outputs/<object>`, as errors and renderers name it.
    pub fn location(&self) -> String {
        format!("{}/{}", self.bucket, self.object)
    }
}

/// Returns true when `output` looks like a reference although the handler produced it itself (an
/// object with the reserved key only): such an output would be taken for a reference downstream.
pub fn is_reserved(output: &[u8]) -> bool {
    shaped_like_ref(output)
        .and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok())
        .and_then(|value| {
            value
                .as_object()
                .map(|o| o.len() == 1 && o.contains_key(REF_KEY))
        })
        .unwrap_or(false)
}

/// Returns the output from its first non-blank byte when it may be a reference: an object that
/// names the reserved key near its start. The cheap test every output goes through.
fn shaped_like_ref(output: &[u8]) -> Option<&[u8]> {
    let trimmed = output.trim_ascii_start();
    let head = &trimmed[..trimmed.len().min(64)];
    (trimmed.starts_with(b"{")
        && head
            .windows(REF_KEY.len())
            .any(|window| window == REF_KEY.as_bytes()))
    .then_some(trimmed)
}

/// True for 64 hex digits, the form of a SHA-256 in a reference.
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Returns the lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// Why an output stored by reference could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(
        "output object {location} is missing (the bucket keeps outputs {days} days; was it deleted?)",
        days = OUTPUTS_MAX_AGE.as_secs() / 86_400
    )]
    Missing { location: String },
    #[error("output object {location} is corrupt: {why}")]
    Corrupt { location: String, why: String },
    #[error("cannot read output object {location}: {message}")]
    Read { location: String, message: String },
    #[error("cannot store output object {location}: {message}")]
    Write { location: String, message: String },
}

impl OutputError {
    /// True when trying again may help (NATS was unreachable), false when the object is gone or
    /// damaged.
    pub fn is_transient(&self) -> bool {
        matches!(self, OutputError::Read { .. } | OutputError::Write { .. })
    }
}

/// The configuration of the bucket's stream `OBJ_trellis_outputs`, the one `create_object_store`
/// would make, created through [`crate::ensure`] so that concurrent creators agree.
fn stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: format!("OBJ_{OUTPUTS_BUCKET}"),
        description: Some("task outputs stored by reference".to_owned()),
        subjects: vec![
            format!("$O.{OUTPUTS_BUCKET}.C.>"),
            format!("$O.{OUTPUTS_BUCKET}.M.>"),
        ],
        max_age: OUTPUTS_MAX_AGE,
        storage: stream::StorageType::File,
        num_replicas: replicas.max(1),
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: true,
        ..Default::default()
    }
}

/// The outputs bucket: put an output, read one back checked.
#[derive(Clone)]
pub struct Outputs {
    store: object_store::ObjectStore,
}

impl std::fmt::Debug for Outputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outputs")
            .field("bucket", &OUTPUTS_BUCKET)
            .finish()
    }
}

impl Outputs {
    /// Opens the bucket, creating it with `replicas` copies if missing (idempotent, safe when
    /// several services start at once).
    pub async fn ensure(js: &jetstream::Context, replicas: usize) -> Result<Outputs, Error> {
        crate::ensure(js, stream_config(replicas)).await?;
        let store = js
            .get_object_store(OUTPUTS_BUCKET)
            .await
            .map_err(|error| Error::Bucket {
                bucket: OUTPUTS_BUCKET.to_owned(),
                message: error.to_string(),
            })?;
        Ok(Outputs { store })
    }

    /// Stores `output` as `object` and returns its reference.
    pub async fn put(&self, object: &str, output: &[u8]) -> Result<OutputRef, OutputError> {
        let reference = OutputRef {
            bucket: OUTPUTS_BUCKET.to_owned(),
            object: object.to_owned(),
            size: output.len() as u64,
            sha256: sha256_hex(output),
        };
        let mut reader = output;
        self.store
            .put(object, &mut reader)
            .await
            .map_err(|error| OutputError::Write {
                location: reference.location(),
                message: error.to_string(),
            })?;
        Ok(reference)
    }

    /// Reads the output `reference` names and checks its size and checksum.
    pub async fn get(&self, reference: &OutputRef) -> Result<Vec<u8>, OutputError> {
        let location = reference.location();
        if reference.bucket != OUTPUTS_BUCKET {
            return Err(OutputError::Missing { location });
        }
        let mut object = match self.store.get(&reference.object).await {
            Ok(object) => object,
            Err(error) if error.kind() == object_store::GetErrorKind::NotFound => {
                return Err(OutputError::Missing { location });
            }
            Err(error) => {
                return Err(OutputError::Read {
                    location,
                    message: error.to_string(),
                });
            }
        };
        let mut bytes = Vec::with_capacity(usize::try_from(reference.size).unwrap_or(0));
        if let Err(error) = object.read_to_end(&mut bytes).await {
            // The client checks the object's own digest at its end and reports a mismatch as an
            // I/O error of kind InvalidData.
            return Err(if error.kind() == std::io::ErrorKind::InvalidData {
                OutputError::Corrupt {
                    location,
                    why: error.to_string(),
                }
            } else {
                OutputError::Read {
                    location,
                    message: error.to_string(),
                }
            });
        }
        if bytes.len() as u64 != reference.size {
            return Err(OutputError::Corrupt {
                location,
                why: format!(
                    "{} bytes stored, the reference says {}",
                    bytes.len(),
                    reference.size
                ),
            });
        }
        let sha256 = sha256_hex(&bytes);
        if sha256 != reference.sha256 {
            return Err(OutputError::Corrupt {
                location,
                why: format!("SHA-256 {sha256}, the reference says {}", reference.sha256),
            });
        }
        Ok(bytes)
    }

    /// Deletes an object (tests, and tools that repair a bucket).
    pub async fn delete(&self, object: &str) -> Result<(), OutputError> {
        self.store
            .delete(object)
            .await
            .map_err(|error| OutputError::Write {
                location: format!("{OUTPUTS_BUCKET}/{object}"),
                message: error.to_string(),
            })
    }

    /// Replaces an object's bytes without changing references to it (tests of corruption).
    pub async fn overwrite(&self, object: &str, bytes: &[u8]) -> Result<(), OutputError> {
        let mut reader = bytes;
        self.store
            .put(object, &mut reader)
            .await
            .map(|_| ())
            .map_err(|error| OutputError::Write {
                location: format!("{OUTPUTS_BUCKET}/{object}"),
                message: error.to_string(),
            })
    }
}

/// Returns the object name of an attempt's output: `<execution>/<instance>/<attempt>`.
pub fn object_name(execution_id: &str, instance_id: &str, attempt: u32) -> String {
    format!("{execution_id}/{instance_id}/{attempt}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OutputRef {
        OutputRef {
            bucket: OUTPUTS_BUCKET.to_owned(),
            object: "e/i/1".to_owned(),
            size: 5,
            sha256: sha256_hex(b"hello"),
        }
    }

    #[test]
    fn a_reference_round_trips_through_its_output_bytes() {
        let reference = sample();
        assert_eq!(
            OutputRef::from_output(&reference.to_output()),
            Some(reference.clone())
        );
        assert!(is_reserved(&reference.to_output()));
    }

    #[test]
    fn ordinary_outputs_are_not_references() {
        for output in [
            &b"{}"[..],
            b"\"$trellis_ref\"",
            b"[1,2]",
            br#"{"$trellis_ref": {"bucket": "b", "object": "o", "size": 1, "sha256": "xyz"}}"#,
            br#"{"$trellis_ref": {"bucket": "b"}, "other": 1}"#,
            b"not json",
        ] {
            assert_eq!(
                OutputRef::from_output(output),
                None,
                "{}",
                String::from_utf8_lossy(output)
            );
        }
        assert!(!is_reserved(br#"{"$trellis_ref": 1, "other": 2}"#));
        assert!(is_reserved(br#" {"$trellis_ref": 1}"#));
    }

    #[test]
    fn the_checksum_is_hex_sha256() {
        assert_eq!(
            sha256_hex(b"hello"),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
    }
}
