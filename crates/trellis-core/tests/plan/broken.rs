//! Every plan under `tests/broken/` is wrong in one way; the rendered error list of each is a
//! snapshot (`snapshots/`), so a change in what users are told shows in review.
//! Update with `INSTA_UPDATE=always cargo test -p trellis-core`, then read the diff.

use std::fmt::Write as _;
use std::path::Path;

use trellis_core::plan::{Limits, PlanErrors, compile_bytes};

/// Renders errors as a user sees them: one per line, the hint under it.
fn render(errors: &PlanErrors) -> String {
    let mut res = String::new();
    for error in errors {
        writeln!(res, "[{:?}] {error}", error.kind).expect("writing to a string");
        if let Some(hint) = &error.hint {
            writeln!(res, "    hint: {hint}").expect("writing to a string");
        }
    }
    res
}

#[test]
fn broken_plans_give_precise_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broken");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/broken exists")
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 22, "only {} broken plans", files.len());
    let limits = Limits {
        max_tasks: 20,
        ..Limits::default()
    };
    for path in files {
        let bytes = std::fs::read(&path).expect("a readable plan");
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a UTF-8 file name")
            .to_owned();
        match compile_bytes(&bytes, &limits) {
            Ok(_) => panic!("{name}.yaml compiles, but it is meant to be broken"),
            Err(errors) => insta::assert_snapshot!(name, render(&errors)),
        }
    }
}
