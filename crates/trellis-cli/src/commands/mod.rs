//! The command groups of `trellis`, one module each, and what they share: exit codes, the
//! [`Failure`] every remote command returns, and input reading.

pub mod backlog;
pub mod bench;
pub mod cluster;
pub mod control;
pub mod demo;
pub mod dev;
pub mod inspect;
pub mod logs;
pub mod output;
pub mod plan;
pub mod submit;
pub mod token;
pub mod workers;

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::process::ExitCode;

/// Bad usage or bad input: an invalid plan, an unreadable file.
pub const EXIT_BAD_INPUT: u8 = 2;
/// An unexpected failure, such as stdout closed under us.
pub const EXIT_FAILURE: u8 = 1;

/// Why a command stopped: the exit code and the one line to print on stderr.
#[derive(Debug)]
pub struct Failure {
    pub exit: u8,
    /// Printed as `trellis: MESSAGE`; empty when the command already said everything (for example
    /// `submit --wait` of an execution that failed).
    pub message: String,
}

impl Failure {
    /// Bad usage or bad input (exit 2).
    pub fn bad_input(message: impl Into<String>) -> Self {
        Self {
            exit: EXIT_BAD_INPUT,
            message: message.into(),
        }
    }

    /// Anything else that went wrong (exit 1).
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            exit: EXIT_FAILURE,
            message: message.into(),
        }
    }

    /// Exit 1 without a message: the outcome was already reported.
    pub fn silent() -> Self {
        Self::failed(String::new())
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        // A closed pipe (`| head`) is the reader's choice, not an error worth a message.
        if e.kind() == io::ErrorKind::BrokenPipe {
            return Self {
                exit: 0,
                message: String::new(),
            };
        }
        Self::failed(format!("cannot write output: {}", lower(&e)))
    }
}

/// Runs a command that talks to the coordinator on a single-threaded runtime and maps its outcome
/// to an exit code.
pub fn run_remote(command: impl Future<Output = Result<(), Failure>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("trellis: cannot start the async runtime: {}", lower(&e));
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    exit(runtime.block_on(command))
}

/// Maps a command's outcome to the exit code, printing the failure's message.
pub fn exit(outcome: Result<(), Failure>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("trellis: {}", failure.message);
            }
            ExitCode::from(failure.exit)
        }
    }
}

/// Returns how to name `path` in messages (`<stdin>` for `-`).
pub fn display_name(path: &Path) -> String {
    if path.as_os_str() == "-" {
        "<stdin>".to_owned()
    } else {
        path.display().to_string()
    }
}

/// Reads a file (or stdin for `-`) of at most `max_bytes`; a larger input is refused without
/// reading it all.
pub fn read_input(path: &Path, max_bytes: usize) -> Result<Vec<u8>, String> {
    let limit = u64::try_from(max_bytes).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    let res = if path.as_os_str() == "-" {
        io::stdin().lock().take(limit + 1).read_to_end(&mut bytes)
    } else {
        let mut file = File::open(path).map_err(|e| format!("cannot open: {}", lower(&e)))?;
        if let Ok(meta) = file.metadata() {
            if meta.is_dir() {
                return Err("cannot read: is a directory".to_owned());
            }
            if meta.len() > limit {
                return Err(format!(
                    "input is {} bytes, over the limit of {max_bytes} bytes",
                    meta.len()
                ));
            }
        }
        (&mut file).take(limit + 1).read_to_end(&mut bytes)
    };
    res.map_err(|e| format!("cannot read: {}", lower(&e)))?;
    if bytes.len() > max_bytes {
        return Err(format!("input is over the limit of {max_bytes} bytes"));
    }
    Ok(bytes)
}

/// Returns an I/O error's message in the lowercase style of our own messages.
pub fn lower(e: &io::Error) -> String {
    let text = e.to_string();
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}
