//! "Did you mean" hints: the closest known name to a misspelt one.

/// Most candidates compared for one hint; past it a plan is generated, not typed, and a hint would
/// cost more than it helps.
const MAX_CANDIDATES: usize = 50_000;

/// Lowest Jaro-Winkler similarity (0–1) at which a candidate is offered.
const MIN_SIMILARITY: f64 = 0.8;

/// Returns the candidate closest to `name`, if one is close enough to be a likely misspelling:
/// the same name in another case, a few edits away (a quarter of the length, at least one; a
/// swap of two neighbours is one edit), or a Jaro-Winkler similarity of at least 0.8. The fewest
/// edits win, then the highest similarity, then the first candidate.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let lower = name.to_lowercase();
    let max_edits = (name.chars().count() / 4).max(1);
    let mut best: Option<(usize, f64, &'a str)> = None;
    for candidate in candidates.into_iter().take(MAX_CANDIDATES) {
        if candidate == name {
            continue;
        }
        let candidate_lower = candidate.to_lowercase();
        if candidate_lower == lower {
            return Some(candidate);
        }
        let edits = strsim::osa_distance(&lower, &candidate_lower);
        let similarity = strsim::jaro_winkler(&lower, &candidate_lower);
        if edits > max_edits && similarity < MIN_SIMILARITY {
            continue;
        }
        let better = match best {
            None => true,
            Some((e, s, _)) => edits < e || (edits == e && similarity > s),
        };
        if better {
            best = Some((edits, similarity, candidate));
        }
    }
    best.map(|(_, _, candidate)| candidate)
}

/// Returns `did you mean "x"?` for the closest candidate, if any.
pub(crate) fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    closest(name, candidates).map(|c| format!("did you mean {c:?}?"))
}

/// Reads serde's "unknown field `x`, expected one of `a`, `b`" (or "unknown variant ...")
/// message and returns a hint naming the closest expected name, if one is close.
pub(crate) fn unknown_name_hint(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))?;
    let (name, expected) = rest.split_once('`')?;
    let expected: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    if expected.is_empty() {
        return None;
    }
    closest(name, expected.iter().copied()).map(|c| format!("did you mean `{c}`?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_finds_typos_and_case_and_rejects_strangers() {
        let ids = ["schema", "api", "ui-build", "api-fallback"];
        assert_eq!(closest("shcema", ids), Some("schema"));
        assert_eq!(closest("SCHEMA", ids), Some("schema"));
        assert_eq!(closest("ui-buidl", ids), Some("ui-build"));
        assert_eq!(closest("zzz", ids), None);
        assert_eq!(closest("evn", ["env", "services"]), Some("env"));
        assert_eq!(closest("schema", ids), None, "an exact match is not a hint");
    }

    #[test]
    fn unknown_field_messages_give_the_closest_field() {
        let message = "unknown field `depend_on`, expected one of `id`, `type`, `depends_on`";
        assert_eq!(
            unknown_name_hint(message).as_deref(),
            Some("did you mean `depends_on`?")
        );
        let message = "unknown variant `CRATE`, expected one of `CREATE`, `UPDATE`";
        assert_eq!(
            unknown_name_hint(message).as_deref(),
            Some("did you mean `CREATE`?")
        );
        assert_eq!(unknown_name_hint("invalid type: string"), None);
    }
}
