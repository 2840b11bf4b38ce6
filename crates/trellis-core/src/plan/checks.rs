//! Lowering of a task's `validate:` list: every check named once, with exactly one probe, a
//! well-formed command or request and a timeout.

use std::collections::HashSet;
use std::time::Duration;

use super::compiler::Compiler;
use super::errors::PlanErrorKind;
use super::model::{Check, CheckLevel, Probe, TaskIdx};
use super::spec::{CheckSpec, CommandSpec, HttpCheckSpec};

/// How long a check may run when it does not say.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// Most checks one task may declare.
const MAX_CHECKS: usize = 32;

/// Longest check name.
const MAX_NAME: usize = 64;

/// Returns the compiled checks of task `i`, reporting every problem with its path; a check with
/// an error is left out (the plan is refused anyway).
pub(super) fn compile_checks(c: &mut Compiler<'_>, i: TaskIdx, specs: &[CheckSpec]) -> Vec<Check> {
    if specs.len() > MAX_CHECKS {
        c.error(
            PlanErrorKind::TooLarge,
            format!("tasks[{i}].validate"),
            format!("{} checks, over the limit of {MAX_CHECKS}", specs.len()),
        );
        return Vec::new();
    }
    let mut names = HashSet::new();
    let mut checks = Vec::with_capacity(specs.len());
    for (k, spec) in specs.iter().enumerate() {
        let at = format!("tasks[{i}].validate[{k}]");
        let errors_before = c.errors.len();
        check_name(c, &at, &spec.name);
        if !names.insert(spec.name.as_str()) {
            c.error(
                PlanErrorKind::DuplicateId,
                format!("{at}.name"),
                format!("the task already has a check named {:?}", spec.name),
            );
        }
        let probe = probe(c, &at, spec);
        let timeout = spec
            .timeout
            .as_ref()
            .and_then(|text| c.duration(text, || format!("{at}.timeout")))
            .unwrap_or(DEFAULT_CHECK_TIMEOUT);
        if let Some(probe) = probe
            && c.errors.len() == errors_before
        {
            checks.push(Check {
                name: spec.name.clone(),
                level: spec.level,
                probe,
                timeout,
            });
        }
    }
    checks
}

fn check_name(c: &mut Compiler<'_>, at: &str, name: &str) {
    let message = if name.is_empty() {
        "check name must not be empty".to_owned()
    } else if name.len() > MAX_NAME {
        format!(
            "check name is {} bytes, over the limit of {MAX_NAME}",
            name.len()
        )
    } else if let Some(bad) = name
        .chars()
        .find(|ch| !(ch.is_ascii_alphanumeric() || matches!(ch, '_' | '.' | '-')))
    {
        format!("check name {name:?} contains {bad:?}: use letters, digits, `_`, `.` and `-`")
    } else {
        return;
    };
    c.error(PlanErrorKind::InvalidId, format!("{at}.name"), message);
}

/// The one probe of a check, or `None` after reporting why there is none.
fn probe(c: &mut Compiler<'_>, at: &str, spec: &CheckSpec) -> Option<Probe> {
    match (&spec.command, &spec.http) {
        (None, None) => {
            c.error_with_hint(
                PlanErrorKind::InvalidValue,
                at,
                format!("check {:?} has neither `command` nor `http`", spec.name),
                "give it `command: \"make lint\"` (or a list: [make, lint]), or for an api check \
                 `http: {url: ...}`",
            );
            None
        }
        (Some(_), Some(_)) => {
            c.error(
                PlanErrorKind::Contradiction,
                at,
                format!(
                    "check {:?} has both `command` and `http`: give one",
                    spec.name
                ),
            );
            None
        }
        (Some(command), None) => command_probe(c, &format!("{at}.command"), command),
        (None, Some(http)) => {
            if spec.level != CheckLevel::Api {
                c.error_with_hint(
                    PlanErrorKind::InvalidValue,
                    format!("{at}.http"),
                    format!(
                        "an `http` check is an api check, not a {} one",
                        spec.level.as_str()
                    ),
                    "set `level: api`, or check the code and the UI with a `command`",
                );
                return None;
            }
            http_probe(c, &format!("{at}.http"), http)
        }
    }
}

fn command_probe(c: &mut Compiler<'_>, at: &str, command: &CommandSpec) -> Option<Probe> {
    let argv = match command {
        CommandSpec::Shell(text) if !text.trim().is_empty() => {
            vec!["sh".to_owned(), "-c".to_owned(), text.clone()]
        }
        CommandSpec::Argv(argv) if argv.first().is_some_and(|p| !p.trim().is_empty()) => {
            argv.clone()
        }
        _ => {
            c.error(PlanErrorKind::InvalidValue, at, "command must not be empty");
            return None;
        }
    };
    Some(Probe::Command(argv))
}

fn http_probe(c: &mut Compiler<'_>, at: &str, http: &HttpCheckSpec) -> Option<Probe> {
    let mut ok = true;
    let url = http.url.trim();
    let host = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    if host.is_none_or(|rest| rest.is_empty() || rest.starts_with('/')) {
        c.error(
            PlanErrorKind::InvalidValue,
            format!("{at}.url"),
            format!("{url:?} is not an http:// or https:// URL with a host"),
        );
        ok = false;
    }
    let method = http
        .method
        .as_deref()
        .unwrap_or("GET")
        .trim()
        .to_uppercase();
    if method.is_empty() || !method.chars().all(|ch| ch.is_ascii_alphabetic()) {
        c.error(
            PlanErrorKind::InvalidValue,
            format!("{at}.method"),
            format!("{method:?} is not an HTTP method (GET, POST, HEAD, ...)"),
        );
        ok = false;
    }
    let status = match http.status {
        None => 200,
        Some(code @ 100..=599) => code as u16,
        Some(code) => {
            c.error(
                PlanErrorKind::InvalidValue,
                format!("{at}.status"),
                format!("status {code} is outside 100–599"),
            );
            ok = false;
            0
        }
    };
    ok.then(|| Probe::Http {
        method,
        url: url.to_owned(),
        status,
        body_contains: http.body_contains.clone(),
    })
}
