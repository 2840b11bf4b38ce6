//! The command groups of `trellis`, one module each, and what they share: exit codes and input
//! reading.

pub mod plan;

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Bad usage or bad input: an invalid plan, an unreadable file.
pub const EXIT_BAD_INPUT: u8 = 2;
/// An unexpected failure, such as stdout closed under us.
pub const EXIT_FAILURE: u8 = 1;

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
fn lower(e: &io::Error) -> String {
    let text = e.to_string();
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}
