//! Validation rules: what a task must have before it can run.
//!
//! A rule applies to the tasks of its categories (all, when it names none). A failed rule of
//! severity `error` blocks the task (a `validation` block whose reason is the finding); a
//! `warning` is reported and blocks nothing. A `custom` rule's command is run by the planner,
//! which feeds its outcome back as a finding.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::model::{BacklogTask, Category, FieldError, check_slug};
use crate::plan::CheckLevel;

/// A rule as stored and sent: every field still text, read by [`Rule::parse`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleSpec {
    /// Unique per project: a slug.
    pub name: String,
    pub description: String,
    /// `required_field`, `test_required`, `pattern_match` or `custom`.
    pub kind: String,
    /// Category names; empty = every category.
    pub categories: Vec<String>,
    /// `required_field` and `pattern_match`: the task field (`title`, `description`,
    /// `acceptance_criteria`, `files`, `codebase_tests`, `api_tests`, `ui_tests`).
    pub field: String,
    /// `pattern_match`: a regular expression the field must match.
    pub pattern: String,
    /// `test_required`: the levels, at least one test of any of them (empty = any level).
    pub levels: Vec<String>,
    /// `custom`: a command run through `sh -c` with the task as JSON on stdin; it passes on exit
    /// status 0, its output's first line is the finding.
    pub command: String,
    /// `error` (default) or `warning`.
    pub severity: String,
    pub enabled: bool,
}

/// The names of the rule kinds, as [`RuleSpec::kind`] takes them.
pub const RULE_KINDS: [&str; 4] = ["required_field", "test_required", "pattern_match", "custom"];

/// Every test level, in the order findings name them.
const ALL_LEVELS: [CheckLevel; 3] = [CheckLevel::Codebase, CheckLevel::Api, CheckLevel::Ui];

/// What a rule checks.
#[derive(Clone, Debug)]
pub enum RuleKind {
    /// The field must not be blank (a text) or empty (a list).
    RequiredField { field: TaskField },
    /// The task must have a test of one of the levels (never empty once parsed).
    TestRequired { levels: Vec<CheckLevel> },
    /// The field's text, or each element of a list field, must match the pattern (anywhere, unless
    /// the pattern anchors it).
    PatternMatch {
        field: TaskField,
        pattern: regex::Regex,
    },
    /// The planner runs the command; [`check`] skips the rule.
    Custom { command: String },
}

impl RuleKind {
    /// Returns the kind's name, one of [`RULE_KINDS`].
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::RequiredField { .. } => "required_field",
            Self::TestRequired { .. } => "test_required",
            Self::PatternMatch { .. } => "pattern_match",
            Self::Custom { .. } => "custom",
        }
    }
}

/// A task field a rule can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskField {
    Title,
    Description,
    AcceptanceCriteria,
    Files,
    CodebaseTests,
    ApiTests,
    UiTests,
}

impl TaskField {
    /// Every field, in declaration order.
    pub const ALL: [TaskField; 7] = [
        Self::Title,
        Self::Description,
        Self::AcceptanceCriteria,
        Self::Files,
        Self::CodebaseTests,
        Self::ApiTests,
        Self::UiTests,
    ];

    /// Returns the field's name, as [`RuleSpec::field`] takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Title => "title",
            Self::Description => "description",
            Self::AcceptanceCriteria => "acceptance_criteria",
            Self::Files => "files",
            Self::CodebaseTests => "codebase_tests",
            Self::ApiTests => "api_tests",
            Self::UiTests => "ui_tests",
        }
    }

    /// Reads a name [`Self::as_str`] gives; the error names `field` and lists the names.
    pub fn parse(field: &str, text: &str) -> Result<Self, FieldError> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|f| f.as_str()).collect();
                FieldError::new(
                    field,
                    format!(
                        "unknown task field {text:?} (expected one of: {})",
                        names.join(", ")
                    ),
                )
            })
    }

    /// Returns the field's values: one text, or a list's elements (a file's path).
    fn values(self, task: &BacklogTask) -> Values<'_> {
        match self {
            Self::Title => Values::Text(&task.title),
            Self::Description => Values::Text(&task.description),
            Self::AcceptanceCriteria => Values::List(
                task.acceptance_criteria
                    .iter()
                    .map(String::as_str)
                    .collect(),
            ),
            Self::Files => Values::List(task.files.iter().map(|f| f.path.as_str()).collect()),
            Self::CodebaseTests => {
                Values::List(task.codebase_tests.iter().map(String::as_str).collect())
            }
            Self::ApiTests => Values::List(task.api_tests.iter().map(String::as_str).collect()),
            Self::UiTests => Values::List(task.ui_tests.iter().map(String::as_str).collect()),
        }
    }
}

impl fmt::Display for TaskField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A field's values as a rule reads them.
enum Values<'t> {
    Text(&'t str),
    List(Vec<&'t str>),
}

/// How much a failed rule matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    /// Returns the severity's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
        }
    }

    /// Reads `error` or `warning`; an empty text is the default, `error`. The error names
    /// `field`.
    pub fn parse(field: &str, text: &str) -> Result<Self, FieldError> {
        match text {
            "" | "error" => Ok(Self::Error),
            "warning" => Ok(Self::Warning),
            _ => Err(FieldError::new(
                field,
                format!("unknown severity {text:?} (expected error or warning)"),
            )),
        }
    }
}

/// A checked rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pub name: String,
    pub description: String,
    pub kind: RuleKind,
    /// Empty = every category.
    pub categories: Vec<Category>,
    pub severity: Severity,
    pub enabled: bool,
}

impl Rule {
    /// Reads a rule: a slug for a name, a known kind, known categories (`categories[i]` in the
    /// error), and exactly the fields its kind takes — `field` for `required_field` and
    /// `pattern_match`, a regular expression `pattern` for `pattern_match`, `levels` (`levels[i]`)
    /// for `test_required`, a `command` for `custom`; any other of these must be empty. An empty
    /// severity is `error`; `test_required` with no levels takes every level.
    pub fn parse(spec: &RuleSpec) -> Result<Rule, FieldError> {
        check_slug("name", &spec.name)?;
        if !RULE_KINDS.contains(&spec.kind.as_str()) {
            return Err(FieldError::new(
                "kind",
                format!(
                    "unknown rule kind {:?} (expected one of: {})",
                    spec.kind,
                    RULE_KINDS.join(", ")
                ),
            ));
        }
        let kind = spec.kind.as_str();
        let mut categories = Vec::with_capacity(spec.categories.len());
        for (i, name) in spec.categories.iter().enumerate() {
            let category = Category::parse(&format!("categories[{i}]"), name)?;
            if !categories.contains(&category) {
                categories.push(category);
            }
        }
        let severity = Severity::parse("severity", &spec.severity)?;

        // The fields each kind takes; the others must be empty.
        let takes_field = matches!(kind, "required_field" | "pattern_match");
        let misplaced = [
            ("field", !takes_field && !spec.field.is_empty()),
            (
                "pattern",
                kind != "pattern_match" && !spec.pattern.is_empty(),
            ),
            ("levels", kind != "test_required" && !spec.levels.is_empty()),
            ("command", kind != "custom" && !spec.command.is_empty()),
        ];
        if let Some((name, _)) = misplaced.iter().find(|(_, set)| *set) {
            return Err(FieldError::new(
                *name,
                format!("a {kind} rule takes no {name}; leave it empty"),
            ));
        }

        let kind = match kind {
            "required_field" => RuleKind::RequiredField {
                field: parse_field(kind, &spec.field)?,
            },
            "pattern_match" => {
                let field = parse_field(kind, &spec.field)?;
                if spec.pattern.is_empty() {
                    return Err(FieldError::new(
                        "pattern",
                        "a pattern_match rule needs a pattern (a regular expression)",
                    ));
                }
                let pattern = regex::Regex::new(&spec.pattern).map_err(|err| {
                    FieldError::new(
                        "pattern",
                        format!(
                            "{:?} is not a valid regular expression: {err}",
                            spec.pattern
                        ),
                    )
                })?;
                RuleKind::PatternMatch { field, pattern }
            }
            "test_required" => {
                let mut levels = Vec::new();
                for (i, name) in spec.levels.iter().enumerate() {
                    let level = CheckLevel::parse(name).ok_or_else(|| {
                        FieldError::new(
                            format!("levels[{i}]"),
                            format!("unknown level {name:?} (expected one of: codebase, api, ui)"),
                        )
                    })?;
                    if !levels.contains(&level) {
                        levels.push(level);
                    }
                }
                if levels.is_empty() {
                    levels = ALL_LEVELS.to_vec();
                }
                RuleKind::TestRequired { levels }
            }
            // The kind was checked against RULE_KINDS above: this is `custom`.
            _ => {
                if spec.command.trim().is_empty() {
                    return Err(FieldError::new(
                        "command",
                        "a custom rule needs a command (run through sh -c)",
                    ));
                }
                RuleKind::Custom {
                    command: spec.command.clone(),
                }
            }
        };
        Ok(Rule {
            name: spec.name.clone(),
            description: spec.description.clone(),
            kind,
            categories,
            severity,
            enabled: spec.enabled,
        })
    }

    /// Returns true when the rule applies to tasks of `category`: it names it, or names none.
    pub fn applies_to(&self, category: Category) -> bool {
        self.categories.is_empty() || self.categories.contains(&category)
    }

    /// Returns true when the rule is enabled and applies to the task.
    fn governs(&self, task: &BacklogTask) -> bool {
        self.enabled && self.applies_to(task.category)
    }

    fn finding(&self, message: String) -> Finding {
        Finding {
            rule: self.name.clone(),
            severity: self.severity,
            message,
        }
    }
}

/// Reads the `field` of a rule of `kind`, which needs one.
fn parse_field(kind: &str, text: &str) -> Result<TaskField, FieldError> {
    if text.is_empty() {
        let names: Vec<&str> = TaskField::ALL.iter().map(|f| f.as_str()).collect();
        return Err(FieldError::new(
            "field",
            format!("a {kind} rule needs a field (one of: {})", names.join(", ")),
        ));
    }
    TaskField::parse("field", text)
}

/// One failed rule on one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: String,
    pub severity: Severity,
    pub message: String,
}

/// Checks a task against the rules that are enabled and apply to its category, in the rules'
/// order, and returns a finding per failed rule. `custom` rules are left to the planner (see
/// [`custom_rules`]).
///
/// - `required_field` fails on a blank text or a list with no element that is not blank
///   (`acceptance_criteria is empty`);
/// - `test_required` fails when no level has a test (`needs at least one codebase or api test`);
/// - `pattern_match` fails when the text, or an element of a list (a file's path), does not
///   match (`title does not match ^\[.*\]`); an empty list has nothing to fail.
pub fn check(task: &BacklogTask, rules: &[Rule]) -> Vec<Finding> {
    rules
        .iter()
        .filter(|rule| rule.governs(task))
        .filter_map(|rule| failure(task, &rule.kind).map(|message| rule.finding(message)))
        .collect()
}

/// Returns why the task fails a rule of `kind`, if it does.
fn failure(task: &BacklogTask, kind: &RuleKind) -> Option<String> {
    match kind {
        RuleKind::RequiredField { field } => {
            let blank = match field.values(task) {
                Values::Text(text) => text.trim().is_empty(),
                Values::List(items) => items.iter().all(|item| item.trim().is_empty()),
            };
            blank.then(|| format!("{field} is empty"))
        }
        RuleKind::TestRequired { levels } => {
            let tested = levels
                .iter()
                .any(|level| task.tests(*level).iter().any(|t| !t.trim().is_empty()));
            (!tested).then(|| format!("needs at least one {} test", either(levels)))
        }
        RuleKind::PatternMatch { field, pattern } => match field.values(task) {
            Values::Text(text) => (!pattern.is_match(text))
                .then(|| format!("{field} does not match {}", pattern.as_str())),
            Values::List(items) => {
                let mut failing = items
                    .iter()
                    .enumerate()
                    .filter(|(_, item)| !pattern.is_match(item));
                let (i, first) = failing.next()?;
                let more = failing.count();
                let mut message = format!(
                    "{field}[{i}] ({first:?}) does not match {}",
                    pattern.as_str()
                );
                if more > 0 {
                    message.push_str(&format!(" (and {more} more)"));
                }
                Some(message)
            }
        },
        RuleKind::Custom { .. } => None,
    }
}

/// Names levels as people say them: `codebase`, `codebase or api`, `codebase, api or ui`.
fn either(levels: &[CheckLevel]) -> String {
    let names: Vec<&str> = levels.iter().map(|level| level.as_str()).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// Returns the `custom` rules that are enabled and apply to the task, in order: the planner runs
/// their commands and turns each failure into a [`Finding`].
pub fn custom_rules<'a>(
    task: &BacklogTask,
    rules: &'a [Rule],
) -> impl Iterator<Item = &'a Rule> + use<'a> {
    let category = task.category;
    rules.iter().filter(move |rule| {
        rule.enabled && rule.applies_to(category) && matches!(rule.kind, RuleKind::Custom { .. })
    })
}

/// Returns true when a finding blocks the task: any of severity `error`.
pub fn blocking(findings: &[Finding]) -> bool {
    findings
        .iter()
        .any(|finding| finding.severity == Severity::Error)
}

#[cfg(test)]
mod tests;
