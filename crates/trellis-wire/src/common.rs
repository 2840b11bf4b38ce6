//! Small pieces several contracts share: JSON payloads and instants, what an attempt consumed
//! (`Usage`), subtask groups (their completion rule and members) and questions for a human.
//!
//! Wire conventions (`common.proto`): ids are UUID text, JSON values are UTF-8 JSON `bytes`,
//! instants are `int64` milliseconds. Core instants are `u64`; those beyond `i64::MAX` are written
//! as `i64::MAX`, and negative instants are refused.

use serde_json::Value;
use trellis_core::ids::GroupId;
use trellis_core::machine::{GroupRule, Question, SubtaskSpec, TimeoutAction, Usage};
use trellis_core::plan::{Check, CheckLevel, Probe};
use trellis_core::record::CheckResult;
use trellis_proto::v1;

use crate::error::{
    At, ConvertError, ConvertErrorKind, non_empty, parse_enum, parse_id, parse_instant, parse_json,
};

/// Returns the UTF-8 JSON text of a value.
pub fn json_to_bytes(value: &Value) -> Vec<u8> {
    // A `Value` always serializes: its map keys are strings and its numbers are finite.
    serde_json::to_vec(value).expect("a serde_json::Value always serializes")
}

/// Returns the wire form of an instant; one beyond `i64::MAX` (292 million years from now) is
/// written as `i64::MAX`.
pub(crate) fn instant_to_proto(unix_ms: u64) -> i64 {
    i64::try_from(unix_ms).unwrap_or(i64::MAX)
}

/// Returns the wire form of what an attempt consumed.
pub fn usage_to_proto(usage: Usage) -> v1::Usage {
    v1::Usage {
        tokens_used: usage.tokens_used,
        cost: usage.cost,
    }
}

/// Reads a usage report; an unset one means nothing was consumed. The cost is summed into the execution's budget, so it must be a finite,
/// non-negative number: one NaN would make the sum NaN and the budget never run out.
pub(crate) fn usage_from_proto(
    at: &At<'_>,
    usage: Option<&v1::Usage>,
) -> Result<Usage, ConvertError> {
    let Some(usage) = usage else {
        return Ok(Usage::default());
    };
    if !usage.cost.is_finite() || usage.cost < 0.0 {
        return Err(at
            .field("usage")
            .field("cost")
            .error(ConvertErrorKind::Inconsistent(
                "a cost is a finite, non-negative number",
            )));
    }
    Ok(Usage {
        tokens_used: usage.tokens_used,
        cost: usage.cost,
    })
}

/// Returns the wire form of a subtask group's completion rule.
pub fn group_rule_to_proto(rule: GroupRule) -> v1::CompletionRule {
    let (kind, quorum) = match rule {
        GroupRule::AllSettled => (v1::CompletionRuleKind::AllSettled, 0),
        GroupRule::AllSucceeded => (v1::CompletionRuleKind::AllSucceeded, 0),
        GroupRule::Quorum(k) => (v1::CompletionRuleKind::Quorum, k),
        GroupRule::FirstSuccess => (v1::CompletionRuleKind::FirstSuccess, 0),
    };
    v1::CompletionRule {
        kind: kind.into(),
        quorum,
    }
}

/// Reads a completion rule; an unset one is `all_settled`, as the contract says.
pub(crate) fn group_rule_from_proto(
    at: &At<'_>,
    rule: Option<&v1::CompletionRule>,
) -> Result<GroupRule, ConvertError> {
    let Some(rule) = rule else {
        return Ok(GroupRule::AllSettled);
    };
    let kind = parse_enum(&at.field("kind"), rule.kind)?;
    if kind != v1::CompletionRuleKind::Quorum && rule.quorum != 0 {
        return Err(at.field("quorum").error(ConvertErrorKind::Inconsistent(
            "a quorum is only allowed with COMPLETION_RULE_KIND_QUORUM",
        )));
    }
    Ok(match kind {
        v1::CompletionRuleKind::Unspecified | v1::CompletionRuleKind::AllSettled => {
            GroupRule::AllSettled
        }
        v1::CompletionRuleKind::AllSucceeded => GroupRule::AllSucceeded,
        v1::CompletionRuleKind::Quorum => GroupRule::Quorum(rule.quorum),
        v1::CompletionRuleKind::FirstSuccess => GroupRule::FirstSuccess,
    })
}

/// Returns the wire form of one subtask to spawn.
pub fn subtask_spec_to_proto(spec: &SubtaskSpec) -> v1::SubtaskSpec {
    v1::SubtaskSpec {
        task_type: spec.task_type.clone(),
        input: json_to_bytes(&spec.input),
        queue: spec.queue.clone(),
    }
}

/// Reads one subtask to spawn.
fn subtask_spec_from_proto(
    at: &At<'_>,
    spec: &v1::SubtaskSpec,
) -> Result<SubtaskSpec, ConvertError> {
    Ok(SubtaskSpec {
        task_type: non_empty(&at.field("task_type"), &spec.task_type)?.to_owned(),
        queue: spec.queue.clone(),
        input: parse_json(&at.field("input"), &spec.input)?,
    })
}

/// Returns the wire form of a spawned subtask group.
pub fn subtask_group_to_proto(
    group: GroupId,
    rule: GroupRule,
    members: &[SubtaskSpec],
) -> v1::SubtaskGroup {
    v1::SubtaskGroup {
        group_id: group.to_string(),
        rule: Some(group_rule_to_proto(rule)),
        members: members.iter().map(subtask_spec_to_proto).collect(),
    }
}

/// Reads a spawned subtask group: its id, its rule and its members.
pub(crate) fn subtask_group_from_proto(
    at: &At<'_>,
    group: &v1::SubtaskGroup,
) -> Result<(GroupId, GroupRule, Vec<SubtaskSpec>), ConvertError> {
    let group_id = parse_id(&at.field("group_id"), &group.group_id)?;
    let rule = group_rule_from_proto(&at.field("rule"), group.rule.as_ref())?;
    let members_at = at.field("members");
    let members = group
        .members
        .iter()
        .enumerate()
        .map(|(member_idx, member)| subtask_spec_from_proto(&members_at.index(member_idx), member))
        .collect::<Result<_, _>>()?;
    Ok((group_id, rule, members))
}

/// Returns the wire form of a question for a human.
pub fn question_to_proto(question: &Question) -> v1::Question {
    let (timeout_action, default_answer) = match &question.timeout_action {
        TimeoutAction::Fail => (v1::QuestionTimeoutAction::Fail, String::new()),
        TimeoutAction::Skip => (v1::QuestionTimeoutAction::Skip, String::new()),
        TimeoutAction::Answer(answer) => (v1::QuestionTimeoutAction::AnswerDefault, answer.clone()),
    };
    v1::Question {
        question_id: question.id.to_string(),
        question_type: question.question_type.clone(),
        text: question.text.clone(),
        options: question.options.clone(),
        expires_at_unix_ms: question.expires_at_ms.map(instant_to_proto),
        timeout_action: timeout_action.into(),
        default_answer,
        priority: question.priority.clone(),
    }
}

/// Reads a question for a human; a default answer only goes with `ANSWER_DEFAULT`.
pub(crate) fn question_from_proto(
    at: &At<'_>,
    question: &v1::Question,
) -> Result<Question, ConvertError> {
    let action_at = at.field("timeout_action");
    let timeout_action = match parse_enum(&action_at, question.timeout_action)? {
        v1::QuestionTimeoutAction::AnswerDefault => {
            TimeoutAction::Answer(question.default_answer.clone())
        }
        action => {
            if !question.default_answer.is_empty() {
                return Err(at.field("default_answer").error(ConvertErrorKind::Inconsistent(
                    "a default answer is only allowed with QUESTION_TIMEOUT_ACTION_ANSWER_DEFAULT",
                )));
            }
            match action {
                v1::QuestionTimeoutAction::Skip => TimeoutAction::Skip,
                _ => TimeoutAction::Fail,
            }
        }
    };
    Ok(Question {
        id: parse_id(&at.field("question_id"), &question.question_id)?,
        question_type: question.question_type.clone(),
        priority: question.priority.clone(),
        text: question.text.clone(),
        options: question.options.clone(),
        expires_at_ms: question
            .expires_at_unix_ms
            .map(|unix_ms| parse_instant(&at.field("expires_at_unix_ms"), unix_ms))
            .transpose()?,
        timeout_action,
    })
}

/// Returns the wire form of a check level.
pub fn check_level_to_proto(level: CheckLevel) -> v1::CheckLevel {
    match level {
        CheckLevel::Codebase => v1::CheckLevel::Codebase,
        CheckLevel::Api => v1::CheckLevel::Api,
        CheckLevel::Ui => v1::CheckLevel::Ui,
    }
}

/// Reads a check level; unset is refused.
pub(crate) fn check_level_from_proto(at: &At<'_>, level: i32) -> Result<CheckLevel, ConvertError> {
    Ok(match parse_enum(at, level)? {
        v1::CheckLevel::Unspecified => return Err(at.error(ConvertErrorKind::Unspecified)),
        v1::CheckLevel::Codebase => CheckLevel::Codebase,
        v1::CheckLevel::Api => CheckLevel::Api,
        v1::CheckLevel::Ui => CheckLevel::Ui,
    })
}

/// Returns the wire form of a declared check, as a worker runs it.
pub fn check_to_proto(check: &Check) -> v1::Check {
    v1::Check {
        name: check.name.clone(),
        level: check_level_to_proto(check.level).into(),
        probe: Some(match &check.probe {
            Probe::Command(argv) => {
                v1::check::Probe::Command(v1::CommandProbe { argv: argv.clone() })
            }
            Probe::Http {
                method,
                url,
                status,
                body_contains,
            } => v1::check::Probe::Http(v1::HttpProbe {
                method: method.clone(),
                url: url.clone(),
                status: u32::from(*status),
                body_contains: body_contains.clone(),
            }),
        }),
        timeout_ms: u64::try_from(check.timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

/// Reads a declared check at path `at`.
pub(crate) fn check_from_proto(at: &At<'_>, check: &v1::Check) -> Result<Check, ConvertError> {
    let probe = match &check.probe {
        None => return Err(at.field("probe").missing()),
        Some(v1::check::Probe::Command(command)) => {
            if command.argv.first().is_none_or(String::is_empty) {
                return Err(at.field("command").field("argv").missing());
            }
            Probe::Command(command.argv.clone())
        }
        Some(v1::check::Probe::Http(http)) => Probe::Http {
            method: non_empty(&at.field("http").field("method"), &http.method)?.to_owned(),
            url: non_empty(&at.field("http").field("url"), &http.url)?.to_owned(),
            status: u16::try_from(http.status).map_err(|_| {
                at.field("http")
                    .field("status")
                    .error(ConvertErrorKind::Inconsistent("a status is 100–599"))
            })?,
            body_contains: http.body_contains.clone(),
        },
    };
    Ok(Check {
        name: non_empty(&at.field("name"), &check.name)?.to_owned(),
        level: check_level_from_proto(&at.field("level"), check.level)?,
        probe,
        timeout: std::time::Duration::from_millis(check.timeout_ms),
    })
}

/// Returns the wire form of check results.
pub fn check_results_to_proto(results: &[CheckResult]) -> Vec<v1::CheckResult> {
    results
        .iter()
        .map(|result| v1::CheckResult {
            name: result.name.clone(),
            level: check_level_to_proto(result.level).into(),
            passed: result.passed,
            duration_ms: result.duration_ms,
            output: result.output.clone(),
        })
        .collect()
}

/// Reads check results at path `at` (a repeated field): each needs a name and a level.
pub(crate) fn check_results_from_proto(
    at: &At<'_>,
    results: &[v1::CheckResult],
) -> Result<Vec<CheckResult>, ConvertError> {
    results
        .iter()
        .enumerate()
        .map(|(n, result)| {
            let at = at.index(n);
            Ok(CheckResult {
                name: non_empty(&at.field("name"), &result.name)?.to_owned(),
                level: check_level_from_proto(&at.field("level"), result.level)?,
                passed: result.passed,
                duration_ms: result.duration_ms,
                output: result.output.clone(),
            })
        })
        .collect()
}
